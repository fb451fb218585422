"""Every config the repository ships (examples/*.yaml, examples/agents/*.yaml, bench/learning/*.yaml, bench/learning/format/*.yaml) loads as `envhub
train` and `bench/learning.py` load it: its fields, its warm start and its tiny-model mapping are
valid (and its LoRA mapping), so a typo in a recipe fails here rather than minutes into a run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("trl")

from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.lora import LoraSettings  # noqa: E402
from envhub_trl.tiny import TinySpec  # noqa: E402
from envhub_trl.run import load_config_file, split_warm_start  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("examples/agents/*.yaml"), *ROOT.glob("bench/learning/*.yaml"), *ROOT.glob("bench/learning/format/*.yaml")])


def test_the_shipped_configs_are_found():
    assert {p.name for p in CONFIGS} >= {"frozenlake_demo.yaml", "mix.yaml", "sokoban6x6.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_config_loads(path, tmp_path):
    own = ()
    if path.parent.name in ("learning", "format"):  # bench/learning.py reads model and targets itself
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert values.pop("model") == "tiny" and isinstance(values.pop("targets", {}), dict)
        own = ("model", "targets")
    values = load_config_file(str(path), ignore=own)
    warm_start = split_warm_start(values, str(path))
    TinySpec.from_mapping(values.pop("tiny", None))
    LoraSettings.from_mapping(values.pop("lora", None))
    args = EnvGRPOConfig(**{**values, "output_dir": str(tmp_path), "report_to": "none"})
    assert args.env_entries()
    if path.name == "frozenlake_demo.yaml":
        assert warm_start.active and warm_start.lr_schedule == "cosine"
