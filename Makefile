# straggler: `make demo` and `make test` each do their own set-up (make setup, idempotent).
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python

.PHONY: setup demo test test-fast sanity bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	$(PY) -m pytest -p no:cacheprovider -rfEs --durations=15 tests

sanity: setup
	@bash scripts/sanity.sh

bench: setup
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) demo-output results .pytest_cache
