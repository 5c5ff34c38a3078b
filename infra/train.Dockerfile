# The training image: `hbpe train` (and eval, generate, export) on GPU nodes, for infra/slurm/ and infra/k8s/.
# (infra/Dockerfile is the other image: Beam's SDK harness for conversion workers.) Build from the repository root:
#   docker build -f infra/train.Dockerfile -t REGISTRY/hbpe-train:0.1.0 .
#   docker run --gpus all --shm-size=8g REGISTRY/hbpe-train:0.1.0 train tiny data.train=s3://bucket/shards ...
# CUDA comes with torch: the torch==2.7.0 wheel for Linux x86_64 is the CUDA 12.6 build and installs CUDA's
# runtime, cuBLAS, cuDNN and NCCL as nvidia-* wheels, so the base needs only Python 3.11 (a CUDA base image
# would hold a second copy). The host provides the driver (NVIDIA Container Toolkit, or Kubernetes' NVIDIA
# device plugin): one that supports CUDA 12.6.
FROM python:3.11-slim-bookworm

# what the NVIDIA container runtime reads to mount the driver and nvidia-smi, as nvidia/cuda images set them
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PYTHONUNBUFFERED=1
# gcc: `pip install .` compiles the C merge kernels (pipeline/tokenizer/second_stage/_merge_core.c)
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/hbpe
# the pinned stack first (its own layer, rebuilt only when the pins change); the same file as Beam's workers
COPY infra/worker-requirements.txt /tmp/worker-requirements.txt
RUN pip install --no-cache-dir -r /tmp/worker-requirements.txt
COPY pyproject.toml setup.py README.md LICENSE ./
COPY src src
COPY hbpe hbpe
COPY pipeline pipeline
COPY training training
COPY schemas schemas
COPY data/sample data/sample
# the check runs from / : in /opt/hbpe, the source's hbpe/ folder would shadow the installed package
RUN pip install --no-cache-dir --no-deps . \
    && cd / && python -c "import hbpe.pipeline.tokenizer.second_stage._merge_core"

# streaming's cache and the run's logs go under the working directory's runs/ unless the config says otherwise
WORKDIR /workspace
ENTRYPOINT ["hbpe"]
CMD ["--help"]
