# The two commands of the README: `make run` runs the agent with its built-in defaults, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
LISTEN ?= :9477
# Two pytest workers, a test file each at a time (module fixtures start once); PYTEST_WORKERS= runs them one by one.
PYTEST_WORKERS ?= -n 2 --dist loadfile

.PHONY: run test test-fast lint bench system-deps clean

# What the agent needs to run, and nothing more: `make run` on a fresh machine starts as soon as it can.
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# compat mode: the checkout goes on sys.path as a path (a .pth line), so PYTHONPATH=another/checkout still wins
	# (a worktree's tests run its own code, not this one's); the default finder would import this checkout first.
	$(BIN)/pip install --quiet -e . --config-settings editable_mode=compat
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) Makefile
	$(BIN)/pip install --quiet -e '.[dev]' --config-settings editable_mode=compat
	# torch for the checkpoint tests: 2.13.0 is a local CPU wheel here; a plain 'torch' would pull GBs of CUDA.
	$(BIN)/pip install --quiet torch==2.13.0
	# torchsnapshot for its real-library checkpoint test (0.1.0 runs on torch 2.13 with numpy; torch stays pinned).
	$(BIN)/pip install --quiet torchsnapshot==0.1.0 numpy torch==2.13.0
	# The training libraries whose real checkpoints the tests judge (tests/framework_checkpoints.py): the Hugging Face
	# Trainer with Accelerate, Lightning; torch stays pinned in the same call, so pip never swaps it for a CUDA build.
	$(BIN)/pip install --quiet transformers==5.24.0 accelerate==1.15.0 lightning==2.6.6 torch==2.13.0
	# The monitoring mixin (mixin/, tests/test_mixin*.py): Grafana's SDK builds the dashboards, one build per
	# Grafana version whose epoch is its build time, so a plain install takes whichever was built last: this is the
	# 11.6 build. promql-parser parses every expression of the rules and dashboards for the tests.
	$(BIN)/pip install --quiet 'grafana-foundation-sdk==1769699379!11.6.0' promql-parser==0.12.0 torch==2.13.0
	# kubernetes-validate: tests/test_deploy_manifests.py validates the rendered manifests strictly against the API
	# schemas it bundles (no network). py-spy: where the agent's idle CPU goes (BENCHMARKS.md).
	$(BIN)/pip install --quiet kubernetes-validate==1.37.0 py-spy==0.4.3 torch==2.13.0
	touch $(STAMP)

# Debian packages the real-part tests start (promtool, node_exporter, chromium, FUSE, mkfs.ext4).
system-deps:
	./scripts/system-deps

run: $(RUN_STAMP)
	$(BIN)/storwatch agent --listen $(LISTEN)

test: $(STAMP) system-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -ra $(PYTEST_WORKERS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra $(PYTEST_WORKERS) -m 'not realpart and not slow'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP) system-deps
	# cel-python only to compare with the CEL library the policy uses (bench/policy_eval.py); not a dependency.
	$(BIN)/pip install --quiet cel-python==0.5.0
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
