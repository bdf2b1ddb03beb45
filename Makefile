# straggler: `make demo` and `make test` each do their own set-up (make setup, idempotent).
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python

.PHONY: setup demo test test-fast sanity bench collection clean

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	$(PY) -m pytest -p no:cacheprovider -rfEs --durations=15 tests

# the inner loop (docs/testing.md): no test bed, no eBPF, no Ansible runs; the collection's unit tests too
test-fast: setup
	$(PY) -m pytest -p no:cacheprovider -rfEs --durations=15 -m "not slow" tests \
		collections/ansible_collections/straggler/fleet/tests/unit

sanity: setup
	@bash scripts/sanity.sh

# dist/straggler-fleet-<version>.tar.gz: plugins, roles, playbooks and the agent wheel, for
# `ansible-galaxy collection install` on a controller without this repository. The build needs only a
# Python with ansible-core, setuptools and wheel: `make collection PYTHON=~/venv/bin/python` builds with it,
# without root and without the development set-up (which needs root, Debian and eBPF for the tests)
collection:
	@if [ -n "$(PYTHON)" ]; then $(PYTHON) scripts/build_collection.py --output-dir dist; \
	else $(MAKE) --no-print-directory setup && $(PY) scripts/build_collection.py --output-dir dist; fi

bench: setup
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) demo-output results .pytest_cache dist
