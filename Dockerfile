# One image for the operator and its node agents (`gpu-operator run`, `gpu-operator agent ...`).
# Build: docker build -t ghcr.io/gpu-operator/gpu-operator:v0.1.0 .

# Builder: the project and every dependency as wheels, so the final stage needs neither a
# compiler nor network access for its install. The project's is its runtime wheel (setup.py):
# everything but gpu_operator.testenv (the local control plane, demo and fleet simulator, which
# never run in a pod).
# pip's cache is a build cache mount: a rebuild downloads only what changed.
FROM python:3.11.14-slim-bookworm AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
COPY templates ./templates
RUN --mount=type=cache,target=/root/.cache/pip GPU_OPERATOR_WHEEL=runtime pip wheel --wheel-dir /wheels .

FROM python:3.11.14-slim-bookworm
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-operator" \
      org.opencontainers.image.description="Kubernetes operator that installs and runs the NVIDIA GPU stack from one ClusterPolicy" \
      org.opencontainers.image.source="https://github.com/gpu-operator/gpu-operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Templates and the simulated GPU profiles are package data inside the wheel. The kubernetes
# client's asyncio copy (kubernetes/aio, a third of the image) is never imported: removed.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "gpu-operator==${VERSION}" \
    && python -c "import pathlib, shutil, kubernetes; shutil.rmtree(pathlib.Path(kubernetes.__file__).parent / 'aio', ignore_errors=True)" \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin nonroot
WORKDIR /tmp
USER 65532:65532
ENTRYPOINT ["gpu-operator"]
CMD ["run"]
