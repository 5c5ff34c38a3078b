#!/usr/bin/env bash
# Convert a corpus on Google Cloud Dataflow. Usage:
#   infra/dataflow.sh PROJECT REGION gs://BUCKET/tokenizer gs://BUCKET/corpus/*.jsonl.zst gs://BUCKET/shards [IMAGE]
# With IMAGE (built from infra/Dockerfile) workers start fast; without it each
# worker builds hbpe from --setup_file, which takes minutes.
set -euo pipefail
project=$1 region=$2 tokenizer=$3 input=$4 output=$5 image=${6:-}
extra=()
if [ -n "$image" ]; then
  extra+=(--sdk_container_image="$image" --experiments=use_runner_v2)
else
  extra+=(--setup_file="$(cd "$(dirname "$0")/.." && pwd)/setup.py")
fi
# The tokenizer directory is read by the launcher (local copy) and copied next to
# the output for the workers; a gs:// tokenizer must first be copied locally.
local_tok=$(mktemp -d)
gsutil -m cp -r "$tokenizer/*" "$local_tok/"
hbpe convert --tokenizer "$local_tok" --input "$input" --out "$output" --seq-len 1024 \
  --runner=DataflowRunner --project="$project" --region="$region" \
  --temp_location="${output%/}-tmp" --job_name="hbpe-convert-$(date +%Y%m%d-%H%M%S)" \
  --machine_type=n2-standard-8 --max_num_workers=64 --autoscaling_algorithm=THROUGHPUT_BASED \
  "${extra[@]}"
