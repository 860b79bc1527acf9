# Two commands matter: `make demo` and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test demo bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q tests

demo: venv
	$(PY) examples/word2vec/demo.py

bench: venv
	$(PY) bench/ps_throughput.py

clean:
	rm -rf $(VENV) log build *.egg-info
