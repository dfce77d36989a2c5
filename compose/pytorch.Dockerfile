# The PyTorch sidecar image, with torch pinned by constraints.txt (the CPU build).
# PyPI serves only CUDA builds of torch: pass TORCH_INDEX_URL (PyTorch's CPU wheel index)
# for the CPU wheel, or its CUDA index for a GPU image. STORAGE: the object-store extras,
# so s3:// and gs:// repositories work (empty for none).
# Build from the repository root: docker build -f compose/pytorch.Dockerfile .
FROM python:3.11-slim AS build
ARG TORCH_INDEX_URL=""
ARG STORAGE=s3,gcs
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/turnout
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY protos protos
COPY turnout turnout
COPY gateway gateway
COPY sidecars sidecars
COPY bench bench
RUN /opt/turnout/bin/pip install -c constraints.txt ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} ".[pytorch${STORAGE:+,$STORAGE}]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin turnout
COPY --from=build /opt/turnout /opt/turnout
# Every flag of `turnout sidecar` reads TURNOUT_SIDECAR_<FLAG>. The gRPC and infer-lane
# ports are fixed inside the container and never published: the sidecar registers its
# container address in Consul, so replicas scale without port clashes.
ENV PATH=/opt/turnout/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TURNOUT_SIDECAR_FRAMEWORK=pytorch \
    TURNOUT_SIDECAR_MODEL_REPOSITORY=/models \
    TURNOUT_SIDECAR_HOST=0.0.0.0 \
    TURNOUT_SIDECAR_PORT=8100 \
    TURNOUT_SIDECAR_LANE=tcp \
    TURNOUT_SIDECAR_LANE_PORT=8101 \
    TURNOUT_SIDECAR_METRICS_PORT=8102 \
    TURNOUT_SIDECAR_EXIT_TIMEOUT_SECS=30
USER turnout
EXPOSE 8100 8101 8102
# SIGTERM: fail the Consul check, drain for TURNOUT_SIDECAR_EXIT_TIMEOUT_SECS, deregister.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-m", "sidecars.healthcheck"]
CMD ["turnout", "sidecar"]
