#!/usr/bin/env bash
# Convert a corpus on a Flink cluster through Beam's portable Flink runner. Usage:
#   infra/flink.sh FLINK_MASTER:PORT TOKENIZER_DIR 's3://bucket/corpus/*.jsonl' s3://bucket/shards IMAGE
# Workers run IMAGE (infra/Dockerfile) as the SDK harness; FLINK_VERSION must be
# one the installed apache-beam supports (see `FlinkRunnerOptions`).
set -euo pipefail
master=$1 tokenizer=$2 input=$3 output=$4 image=$5
hbpe convert --tokenizer "$tokenizer" --input "$input" --out "$output" --seq-len 1024 \
  --runner=FlinkRunner --flink_master="$master" --flink_version=1.18 \
  --environment_type=DOCKER --environment_config="$image" \
  --parallelism=64 --s3_region_name="${AWS_REGION:-us-east-1}"
