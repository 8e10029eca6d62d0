# The loraserve serving image: the package installed as README.md says, with torch's CUDA build.
#
# Build and push (CI does not build images; a release is built and pushed by hand):
#   docker build -t ghcr.io/loraserve/loraserve:0.1.0 .
#   docker push ghcr.io/loraserve/loraserve:0.1.0
# The tag follows `version` in pyproject.toml. The Helm chart (helm/loraserve) defaults to this
# image; its RayService's head and worker containers run `ray start`, which replaces the CMD
# below, and the app is deployed onto them by import path (serving.deploy.app:build).
#
# Try the demo kit on one GPU (Ray's object store wants a larger /dev/shm than Docker's 64 MB):
#   docker run --rm --gpus all --shm-size=2g -p 8000:8000 ghcr.io/loraserve/loraserve:0.1.0 \
#     loraserve serve --host 0.0.0.0 --insecure
# --insecure is for a try on one's own machine only: with no API keys every caller is an admin.
#
# Base: CUDA 12.8 matches the CUDA build of torch installed below (TORCH_INDEX) and is the first
# CUDA that targets Blackwell besides Hopper and Ada (FP8); the image needs an R570 or newer
# driver on the host. The `base` flavour is enough: torch's CUDA wheels carry their own CUDA
# runtime, cuBLAS, cuDNN and NCCL as pip packages, so `runtime` or `cudnn-runtime` would ship
# those libraries twice. Ubuntu 24.04 provides Python 3.12 (the package needs 3.10 or newer).
FROM nvidia/cuda:12.8.1-base-ubuntu24.04

# gcc and python3-dev: Triton compiles its small C launcher with the system compiler on first
# use. wget: KubeRay's probes of Ray's health endpoints run it inside the container.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev gcc libc6-dev ca-certificates wget \
    && rm -rf /var/lib/apt/lists/*

# uid 1000 is Ubuntu's `ubuntu` user in this base; it gives way to ours.
RUN (userdel --remove ubuntu 2>/dev/null || true) \
    && (groupdel ubuntu 2>/dev/null || true) \
    && groupadd --gid 1000 loraserve \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/loraserve \
        --shell /bin/bash loraserve

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
RUN python3 -m venv /opt/venv

# torch alone first, from PyTorch's CUDA index: the largest download, redone only when the pin
# or the index changes. The pin is README's (tests/test_dockerfile.py holds them equal).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0

WORKDIR /app

# Then the dependencies, from pyproject.toml alone: `-e .` needs the package folders and the
# readme to exist, so empty ones stand in, and editing the sources or README does not redo this
# layer. torch is already satisfied by the CUDA build above. s3fs: an s3:// adapter registry or
# model folder is read through fsspec.
COPY pyproject.toml ./
RUN mkdir kernels adapters serving \
    && touch README.md kernels/__init__.py adapters/__init__.py serving/__init__.py \
    && pip install torch==2.13.0 -e . s3fs

# Then the sources (.dockerignore keeps out virtualenvs, caches, local state and .git), and
# the package installed again over them, without its dependencies.
COPY . .
RUN pip install --no-deps -e .

# Relative paths in a config (the demo's models/demo, ./.loraserve, the default SQLite stores)
# resolve against /app, so the service user may create files there; the sources stay root's.
RUN chown 1000:1000 /app && install -d -o 1000 -g 1000 /app/.loraserve

# Numeric, so Kubernetes' runAsNonRoot can verify it. No keys or credentials are in the image:
# API keys and S3 credentials come from the environment or mounted files at run time.
USER 1000:1000
ENV HOME=/home/loraserve

EXPOSE 8000

# The config is mounted at run time, e.g. from a Kubernetes ConfigMap.
CMD ["loraserve", "serve", "--config", "/etc/loraserve/config.yaml"]
