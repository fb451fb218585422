# One-command set-up: `make test` and `make demo` create .venv when missing and install everything.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := ./envhub_frozenlake ./envhub_sokoban
STAMP := $(VENV)/.installed

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard */pyproject.toml) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[test,render]" $(addprefix -e ,$(PLUGINS))
	touch $(STAMP)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

demo: setup
	$(PY) examples/demo.py

bench: setup
	$(PY) bench/env_step.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info */*.egg-info
