"""``EnvGRPOTrainer(agent=..., tasks=...)`` and ``envhub train --agent``: an agent's recorded sessions
are the rows the loss trains on, and its weights move."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from click.testing import CliRunner

from envhub.trajectory import to_samples

pytestmark = pytest.mark.slow


def chatty(base_url: str, api_key: str, task: dict) -> float:
    """Two calls that resend and extend the history; the reward is read off the replies, so the
    members of a group differ."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": f"Lake {task['seed']}."}]
    total = 0
    for turn in range(2):
        reply = client.chat.completions.create(model="agent", messages=messages, max_tokens=6).choices[0].message
        total += len(reply.content or "")
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
    return float(total % 3)


def test_an_agents_sessions_are_what_the_loss_trains_on(tmp_path):
    from transformers import AutoModelForCausalLM
    from trl_helpers import lake_config, save_tiny_lake_model

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = save_tiny_lake_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []

    class Spy(EnvGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            seen.append((output, played[-1]))
            return output

    played = []
    config = lake_config(tmp_path / "run", groups_per_step=2, group_size=4, per_device_train_batch_size=8, learning_rate=1e-2)
    trainer = Spy(model, config, processing_class=tokenizer, agent=chatty, tasks=[{"seed": s} for s in range(4)])
    play = trainer.agents.play
    trainer.agents.play = lambda *a, **kw: (lambda result: (played.append(result[0]), result)[1])(play(*a, **kw))
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2
    for output, trajectories in seen:
        assert [t.layout for t in trajectories] == ["trajectory"] * 8  # every session folded
        for row, sample in enumerate(to_samples(trajectories)):
            ids = output["completion_ids"][row].tolist()
            assert ids[: len(sample.completion_ids)] == sample.completion_ids
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    logged = [entry for entry in trainer.state.log_history if "agent/calls_per_session" in entry]
    assert logged and all(entry["agent/calls_per_session"] == 2 for entry in logged)


def flat_on_even(base_url: str, api_key: str, task: dict) -> float:
    """``chatty``, whose reward is 1.0 whatever it replies on tasks of even seed: those groups tie."""
    reward = chatty(base_url, api_key, task)
    return 1.0 if task["seed"] % 2 == 0 else reward


def test_dynamic_sampling_replays_an_agents_tied_groups_as_sessions_of_their_own(tmp_path):
    from transformers import AutoModelForCausalLM
    from trl_helpers import lake_config, save_tiny_lake_model

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = save_tiny_lake_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    config = lake_config(tmp_path / "run", groups_per_step=2, group_size=4, per_device_train_batch_size=8, dynamic_sampling_rounds=8)
    trainer = EnvGRPOTrainer(model, config, processing_class=tokenizer, agent=flat_on_even, tasks=[{"seed": s} for s in range(4)])
    rounds, play = [], trainer.agents.play
    trainer.agents.play = lambda *a, **kw: (lambda result: (rounds.append((kw.get("round", 0), result[1])), result)[1])(play(*a, **kw))
    trainer.train()
    sessions = [session.session_id for _, batch in rounds for group in batch.sessions for session in group]
    assert len(sessions) == len(set(sessions)) == 8 * len(rounds)  # a further round's sessions are its own
    assert max(r for r, _ in rounds) >= 1
    logged = [entry for entry in trainer.state.log_history if "dynamic/tied_left" in entry]
    assert len(logged) == 2 and all(entry["dynamic/tied_left"] == 0.0 and entry["env/kept_fraction"] == 1.0 for entry in logged)


def test_envhub_train_agent_runs_and_reports(tmp_path):
    from envhub.cli import cli

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"seed": s}) + "\n" for s in range(4)))
    out = tmp_path / "out"
    args = ["train", "--agent", f"{__file__}:chatty", "--tasks", str(tasks), "--output-dir", str(out),
            "max_steps=2", "eval_steps=1", "groups_per_step=2", "group_size=2", "per_device_train_batch_size=4", "eval_episodes=2",
            "use_cpu=true", "report_to=none", "tiny.hidden_size=64", "tiny.num_heads=1", "tiny.num_layers=1",
            "agent_processes=2"]  # the agent in worker processes, loaded from this file
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 2 and list(results["evaluations"]) == ["initial model", "at RL step 1", "after RL"]
    assert all(figures["failed"] == 0 for figures in results["evaluations"].values())
    assert results["log_history"][0]["agent/failed_sessions"] == 0
    assert (out / "final" / "config.json").is_file()
    assert "initial model" in result.output and "after RL" in result.output and "held-out success at RL step 1" in result.output
    bad = CliRunner().invoke(cli, ["train", "--agent", f"{__file__}:chatty", "--output-dir", str(out)])
    assert bad.exit_code == 2 and "--agent and --tasks go together" in bad.output


def test_envhub_train_agent_learns_the_tool_format_from_a_random_caller_first(tmp_path):
    from envhub.cli import cli

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"seed": s}) + "\n" for s in range(4)))
    out = tmp_path / "out"
    # The agent that plays the lake the proxy hosts: the env scores its sessions in the warm start's
    # random calls, in RL and in the evaluations.
    common = ["train", "--agent", "examples/agents/frozenlake_openai.py:play_on_proxy", "--tasks", str(tasks), "--output-dir", str(out),
              "max_steps=1", "groups_per_step=1", "group_size=2", "per_device_train_batch_size=2", "eval_episodes=2",
              "use_cpu=true", "report_to=none", "tiny.hidden_size=64", "tiny.num_heads=1", "tiny.num_layers=1"]
    result = CliRunner().invoke(cli, [*common, "warm_start.demonstrator=random", "warm_start.steps=3", "warm_start.episodes=3", "eval_sampled=true"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    stages = ["initial model", "after the warm start", "after RL"]
    assert list(results["evaluations"]) == [name for stage in stages for name in (stage, f"{stage}, sampled")]
    assert "3 supervised steps" in results["warm_start"] and results["warm_start_seconds"] > 0
    assert all(figures["failed"] == 0 for figures in results["evaluations"].values())
    assert "after the warm start" in result.output
    expert = CliRunner().invoke(cli, [*common, "--overwrite", "warm_start.steps=3"])
    assert expert.exit_code == 1 and "format-only" in expert.output
