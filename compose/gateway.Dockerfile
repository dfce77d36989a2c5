# The turnout gateway image: HTTP :8000, gRPC :8001, metrics :8002; no framework installed.
# Build from the repository root: docker build -f compose/gateway.Dockerfile .
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/turnout
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos protos
COPY turnout turnout
COPY gateway gateway
COPY sidecars sidecars
COPY bench bench
# The trace extra: the OpenTelemetry SDK, for --trace-config mode=opentelemetry.
RUN /opt/turnout/bin/pip install '.[trace]'

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin turnout
COPY --from=build /opt/turnout /opt/turnout
# Every flag of `turnout gateway` reads TURNOUT_GATEWAY_<FLAG>; these are the image's defaults.
ENV PATH=/opt/turnout/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TURNOUT_GATEWAY_HOST=0.0.0.0 \
    TURNOUT_GATEWAY_HTTP_PORT=8000 \
    TURNOUT_GATEWAY_GRPC_PORT=8001 \
    TURNOUT_GATEWAY_METRICS_PORT=8002 \
    TURNOUT_GATEWAY_EXIT_TIMEOUT_SECS=30
USER turnout
EXPOSE 8000 8001 8002
# SIGTERM drains in-flight requests for TURNOUT_GATEWAY_EXIT_TIMEOUT_SECS; give the
# container longer than that to stop (compose: stop_grace_period).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ['TURNOUT_GATEWAY_HTTP_PORT'], timeout=3)"
CMD ["turnout", "gateway"]
