# Two commands matter: `make demo` and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-fast demo bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

# Tests run in $(WORKERS) pytest-xdist processes, a whole file to one process (--dist loadfile:
# a module's shared fixture, such as a trained cluster, is built once). Most tests wait on sockets
# and child processes, so 2 workers on 2 cores about halve the wall time (README.md, "The two
# commands", has the measured times). A test marked `alone` runs with no other worker's test
# beside it (tests/machine_share.py). WORKERS=0 runs everything in one process.
WORKERS ?= 2
PYTEST  := $(PY) -m pytest -q -n $(WORKERS) --dist loadfile

test: venv
	$(PYTEST) tests

# the suite without the tests marked slow (end-to-end runs of real processes): for development
test-fast: venv
	$(PYTEST) -m 'not slow' tests

demo: venv
	$(PY) examples/word2vec/demo.py

bench: venv
	$(PY) bench/ps_throughput.py

clean:
	rm -rf $(VENV) log build *.egg-info
