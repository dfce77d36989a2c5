# The python sidecar image: Triton python-backend models (model.py). PACKAGES: what the
# models import beyond numpy (pip requirement specifiers, space-separated; or build FROM this
# image and install them there); STORAGE: the object-store extras (empty for none).
# Build from the repository root: docker build -f compose/python.Dockerfile .
FROM python:3.11-slim AS build
ARG PACKAGES=""
ARG STORAGE=s3,gcs
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/turnout
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos protos
COPY turnout turnout
COPY gateway gateway
COPY sidecars sidecars
COPY bench bench
RUN /opt/turnout/bin/pip install ".${STORAGE:+[$STORAGE]}" ${PACKAGES}

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin turnout
COPY --from=build /opt/turnout /opt/turnout
# Every flag of `turnout sidecar` reads TURNOUT_SIDECAR_<FLAG>. The gRPC and infer-lane
# ports are fixed inside the container and never published: the sidecar registers its
# container address in Consul, so replicas scale without port clashes.
ENV PATH=/opt/turnout/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TURNOUT_SIDECAR_FRAMEWORK=python \
    TURNOUT_SIDECAR_MODEL_REPOSITORY=/models \
    TURNOUT_SIDECAR_HOST=0.0.0.0 \
    TURNOUT_SIDECAR_PORT=8100 \
    TURNOUT_SIDECAR_LANE=tcp \
    TURNOUT_SIDECAR_LANE_PORT=8101 \
    TURNOUT_SIDECAR_METRICS_PORT=8102 \
    TURNOUT_SIDECAR_EXIT_TIMEOUT_SECS=30
# Each model instance runs in a child process of the sidecar (as Triton's stub); BLS
# requests go to the gateway named by TURNOUT_SIDECAR_BACKEND_CONFIG=gateway=HOST:PORT.
USER turnout
EXPOSE 8100 8101 8102
# SIGTERM: fail the Consul check, drain for TURNOUT_SIDECAR_EXIT_TIMEOUT_SECS, deregister.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-m", "sidecars.healthcheck"]
CMD ["turnout", "sidecar"]
