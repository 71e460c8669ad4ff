# The two commands a newcomer needs: `make serve` and `make test`.
# Both create or reuse .venv and install what is missing first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 8700

.PHONY: serve serve-cluster test lint typecheck pytest mutation install bench clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml scripts/install.sh | $(BIN)/python
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install heed with its test tools

serve: $(STAMP)  ## run the server on embedded defaults (SQLite, local models)
	$(BIN)/heed serve --host $(HOST) --port $(PORT)

serve-cluster: $(STAMP)  ## two instances as one service: PostgreSQL (pgvector, started here) and Redis
	$(BIN)/python scripts/serve_cluster.py --host $(HOST)

lint: $(STAMP)  ## ruff lint and format check
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

typecheck: $(STAMP)  ## mypy (strict for heed.runtime)
	$(BIN)/mypy

pytest: $(STAMP)  ## the test suite alone (installs Debian's chromium for browser tests if missing)
	bash scripts/ensure_browser.sh
	$(BIN)/python -m pytest -q

mutation: $(STAMP)  ## run-state mutations (scripts/mutation_check.py lists them) must each turn a behaviour test red
	$(BIN)/python scripts/mutation_check.py --skip-baseline

test: lint typecheck pytest mutation  ## everything CI runs

bench: $(STAMP)  ## run the benchmarks (figures go to benchmarks/results/)
	$(BIN)/python benchmarks/cancel_latency.py
	$(BIN)/python benchmarks/stream_fanout.py
	$(BIN)/python benchmarks/reconnect_chaos.py
	$(BIN)/python benchmarks/replay_finished_run.py
	$(BIN)/python benchmarks/llm_cancel_latency.py
	$(BIN)/python benchmarks/mcp_cancel_latency.py
	$(BIN)/python benchmarks/retain_throughput.py
	$(BIN)/python benchmarks/recall_latency.py
	$(BIN)/python benchmarks/abandoned_recall.py
	$(BIN)/python benchmarks/locomo_recall.py
	$(BIN)/python benchmarks/local_model_speed.py
	$(BIN)/python benchmarks/answer_quality.py --scripted
	$(BIN)/python benchmarks/answer_quality.py  # the embedded model: about 45 minutes here
	$(BIN)/python benchmarks/disconnect_storm.py --rate 1100

clean:  ## remove the virtualenv
	rm -rf $(VENV)
