# Two commands on a fresh machine: `make run` (Python 3.11+ and nothing else) and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
REPO ?= model_repository
HOST ?= 0.0.0.0
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
PIP := $(PY) -m pip --disable-pip-version-check
# Stamps carry the interpreter's version, so another Python makes the venv again.
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
SERVE := $(VENV)/.serve-$(PYTHON_VERSION)
FULL := $(VENV)/.full-$(PYTHON_VERSION)
# PyPI's torch wheel for Linux is the CUDA build (several GB); PyTorch's own CPU index
# serves the CPU build, which constraints.txt pins. torch alone comes from there (so no
# other package is looked up on that index), then everything else from PyPI. Elsewhere
# PyPI's wheel is the CPU one.
TORCH_INDEX ?= $(if $(filter Linux,$(shell uname -s)),https://download.pytorch.org/whl/cpu)

.PHONY: setup serve consul prometheus tools run test unit lint protos models bench clean

# Serving: the core and ONNX Runtime, all that model_repository/ needs.
serve: $(SERVE)

$(SERVE): pyproject.toml scripts/venv
	scripts/venv $(PYTHON) $(VENV)
	@echo "make: installing turnout with ONNX Runtime and uvloop into $(VENV) (about 150 MB)"
	$(PIP) install --progress-bar on -e '.[onnxruntime,uvloop]'
	touch $@

run: $(SERVE)
	$(VENV)/bin/turnout up --model-repository $(REPO) --host $(HOST) \
	    --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

# Everything the tests need: the frameworks (torch's CPU build), the test tools (kubectl
# among them), Consul and docker-compose. A tool the platform cannot provide leaves its tests skipped, each
# saying why and how to install it.
setup: $(FULL) consul prometheus tools

$(FULL): $(SERVE) constraints.txt
	@echo "make: installing PyTorch (CPU build) and the test tools into $(VENV) (about 1.5 GB)"
	$(if $(TORCH_INDEX),$(PIP) install --no-deps --retries 0 --timeout 10 -c constraints.txt --index-url $(TORCH_INDEX) torch)
	$(PIP) install --progress-bar on -c constraints.txt -e '.[onnxruntime,pytorch,test]'
	touch $@

# The fleet tests run a real Consul agent: Debian bullseye's, fetched by a project script.
# dpkg -x keeps the package's own (old) mtime on the binary: touch it, or make refetches every time.
consul: .tools/consul/usr/bin/consul
.tools/consul/usr/bin/consul: scripts/install-consul scripts/install-debian-tool
	@if command -v consul >/dev/null; then echo "make: using $$(command -v consul)"; \
	elif scripts/install-consul; then touch $@; \
	else echo "make: no Consul here; the fleet tests will skip (put a consul binary, 1.8 or newer, on PATH)" >&2; fi

# The dashboard test scrapes a real fleet with Debian bullseye's Prometheus (2.24), fetched
# as Consul is; without it that test skips and says so.
prometheus: .tools/prometheus/usr/bin/prometheus
.tools/prometheus/usr/bin/prometheus: scripts/install-prometheus scripts/install-debian-tool
	@if command -v prometheus >/dev/null; then echo "make: using $$(command -v prometheus)"; \
	elif scripts/install-prometheus; then touch $@; \
	else echo "make: no Prometheus here; the dashboard test will skip (put a prometheus binary on PATH)" >&2; fi

# The compose tests validate compose/ with Debian's docker-compose. Installed only when
# missing, and only where apt-get runs as root; elsewhere those tests skip and say why.
# The Kubernetes tests build deploy/kubernetes/ with kubectl 1.21 or newer: the test extra
# installs it into the venv on Linux (Debian's kubernetes-client, 1.20, is too old for
# kustomize components); elsewhere one on PATH serves, or those tests skip and say why.
tools:
	@command -v docker-compose >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	    && apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y docker-compose >/dev/null; } \
	    || echo "make tools: no docker-compose (needs apt-get as root); the compose config tests will skip" >&2
	@[ -x $(VENV)/bin/kubectl ] || command -v kubectl >/dev/null \
	    || echo "make tools: no kubectl (put kubectl 1.21 or newer on PATH); the Kubernetes manifest tests will skip" >&2

test: setup
	$(PY) -m pytest

# The in-process unit layer alone: seconds, no servers.
unit: setup
	$(PY) -m pytest tests/unit

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy gateway sidecars protos turnout bench

protos: setup
	$(PY) -m protos.generate

models: setup
	$(PY) scripts/make_models.py $(REPO)

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
