# Two commands on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
REPO ?= model_repository
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: setup tools run test unit lint protos models bench clean

setup: $(VENV)/.installed .tools/consul/usr/bin/consul tools

# The compose tests validate compose/ with Debian's docker-compose. Installed only when
# missing, and only where apt-get runs as root; elsewhere those tests skip and say why.
tools:
	@command -v docker-compose >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	    && apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y docker-compose >/dev/null; } \
	    || echo "make tools: no docker-compose (needs apt-get as root); the compose config tests will skip" >&2

# The fleet tests run a real Consul agent: Debian bullseye's, fetched by a project script.
# dpkg -x keeps the package's own (old) mtime on the binary: touch it, or make refetches every time.
.tools/consul/usr/bin/consul: scripts/install-consul
	scripts/install-consul
	touch $@

# The CPU install: constraints.txt pins torch to its CPU build. GPU machines add the
# onnxruntime-gpu / tensorrt extras themselves; this install never pulls them.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e '.[onnxruntime,pytorch,test]'
	touch $@

run: setup
	$(VENV)/bin/turnout up --model-repository $(REPO)

test: setup
	$(PY) -m pytest

# The in-process unit layer alone: seconds, no servers.
unit: setup
	$(PY) -m pytest tests/unit

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy gateway sidecars protos turnout bench/loadgen

protos: setup
	$(PY) -m protos.generate

models: setup
	$(PY) scripts/make_models.py $(REPO)

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
