"""``envhub export-sft --format arrow|jsonl|parquet``: each format read back with ``datasets``, the
same rows in each; a file is written whole or not at all; bad paths are one line, before any
episode is played."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("envhub_trl")
datasets = pytest.importorskip("datasets")

from click.testing import CliRunner  # noqa: E402

from envhub.cli import cli  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def export(*args: str):
    return CliRunner().invoke(cli, ["export-sft", LAKE, "--episodes", "3", *args])


def read_back(out, fmt: str):
    if fmt == "arrow":
        return datasets.load_from_disk(str(out))
    return datasets.load_dataset("json" if fmt == "jsonl" else fmt, data_files=str(out), split="train")


def test_each_format_reads_back_with_datasets_as_the_same_episodes(tmp_path):
    read = {}
    for fmt, name in (("arrow", "sft"), ("jsonl", "sft.jsonl"), ("parquet", "sft.parquet")):
        out = tmp_path / fmt / "new" / name  # a folder that does not exist yet is made
        result = export("--out", str(out), "--format", fmt)
        assert result.exit_code == 0, result.output
        assert f"wrote 3 episodes (3 successful) to {out}" in result.output
        if fmt != "arrow":
            assert out.is_file() and [p.name for p in out.parent.iterdir()] == [name]  # one file, no staging file left
        read[fmt] = read_back(out, fmt).to_list()
    rows = read["arrow"]
    assert len(rows) == 3 and len({row["seed"] for row in rows}) == 3 and all(row["success"] for row in rows)
    assert {row["env_id"] for row in rows} == {LAKE}
    roles = [m["role"] for m in rows[0]["messages"]]
    assert roles[0] == "system" and roles[-1] == "assistant" and "user" in roles
    assert read["jsonl"] == rows and read["parquet"] == rows


def test_the_default_format_is_a_datasets_folder(tmp_path):
    result = export("--out", str(tmp_path / "sft"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sft" / "dataset_info.json").is_file()


def test_jsonl_is_one_json_object_per_episode(tmp_path):
    out = tmp_path / "sft.jsonl"
    assert export("--out", str(out), "--format", "jsonl").exit_code == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(isinstance(json.loads(line)["messages"], list) for line in lines)


def one_line(result) -> str:
    """The error line of a refused command (the progress lines of episodes played before it aside)."""
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("episodes: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_bad_file_paths_are_one_line_and_nothing_is_written(tmp_path, fmt):
    existing = tmp_path / f"old.{fmt}"
    existing.write_text("mine")
    refused = export("--out", str(existing), "--format", fmt)
    assert f"{existing} exists; choose a new file" in one_line(refused) and "episodes:" not in refused.output  # none played
    assert existing.read_text() == "mine"
    assert "is a folder; --format" in one_line(export("--out", str(tmp_path), "--format", fmt))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = one_line(export("--out", str(blocker / f"sub/x.{fmt}"), "--format", fmt))
    assert "cannot create its folder" in line and "pick a folder you can write" in line


def test_a_file_given_to_arrow_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "is a file; --format arrow writes a folder" in one_line(export("--out", str(blocker)))


def test_a_write_that_fails_leaves_no_file(tmp_path, monkeypatch):
    """A write cut short leaves neither the file nor its staging file (written whole or not at all)."""
    def fail(self, path, **kwargs):
        with open(path, "w") as f:
            f.write('{"half": ')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(datasets.Dataset, "to_json", fail)
    out = tmp_path / "sft.jsonl"
    line = one_line(export("--out", str(out), "--format", "jsonl"))
    assert f"--out {out}: cannot write the dataset (No space left on device)" in line
    assert list(tmp_path.iterdir()) == []
