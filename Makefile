# One-command set-up: `make test` and `make demo` create .venv when missing and install everything.
# Editable installs use compat mode (a path entry per distribution): with the default import-hook
# mode, a plugin folder such as ./envhub_frozenlake shadows its package as a namespace package
# whenever Python runs from the repository root.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := ./envhub_frozenlake ./envhub_sokoban ./envhub_webshop
STAMP := $(VENV)/.installed

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard */pyproject.toml) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --config-settings editable_mode=compat -e ".[test,render,pettingzoo]" $(addprefix -e ,$(PLUGINS)) selenium
	touch $(STAMP)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

demo: setup
	$(PY) examples/demo.py

bench: setup
	$(PY) bench/env_step.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info */*.egg-info
