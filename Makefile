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

test: venv
	$(PY) -m pytest -q tests

# the suite without the tests marked slow (end-to-end runs of real processes): for development
test-fast: venv
	$(PY) -m pytest -q -m 'not slow' tests

demo: venv
	$(PY) examples/word2vec/demo.py

bench: venv
	$(PY) bench/ps_throughput.py

clean:
	rm -rf $(VENV) log build *.egg-info
