# Quick start: `make demo` and `make test`; both set up .venv first if it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all setup bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 is the CPU build (a local wheel here); pinned in pyproject.toml.
	# bench: matplotlib, for the plots benchmarks/tlm.py and whole_models.py write beside their JSON (without it
	# they say so and write none, and a PNG of an earlier run is left to disagree with the JSON)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tensorlang demo

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

bench: $(STAMP)
	$(PY) benchmarks/check_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
