#!/usr/bin/env bash
# Convert a corpus on a Dask cluster (`--runner dask`: hbpe's own steps as Dask tasks). Usage:
#   infra/dask.sh SCHEDULER_HOST:8786 TOKENIZER_DIR 's3://bucket/corpus/*.jsonl.zst' s3://bucket/shards
# The cluster (infra/README.md, "Dask"): `dask scheduler` on one machine, and on every worker machine
#   dask worker tcp://SCHEDULER_HOST:8786 --nworkers "$(nproc)" --nthreads 1
# in the launcher's environment (pip install -c constraints.txt '.[dask]' from this repository: the same
# hbpe, dask and distributed everywhere). Workers read the inputs and write the output's staging
# themselves: a bucket (s3://, gs://, with apache-beam[aws] or [gcp] and the credentials in their
# environment) or a file system mounted at the same path on every machine.
set -euo pipefail
scheduler=$1 tokenizer=$2 input=$3 output=$4
hbpe convert --tokenizer "$tokenizer" --input "$input" --out "$output" --seq-len 1024 \
  --runner dask --dask-address "tcp://$scheduler"
