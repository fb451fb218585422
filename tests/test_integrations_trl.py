"""envhub environments in TRL's ``environment_factory``: the factory's contract, and plain
``trl.GRPOTrainer`` training through it with the tiny model on the CPU."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from envhub.cli import cli
from envhub.core import TextEnv
from envhub.error import ResetNeeded, UnknownEnv
from envhub.integrations.trl import EnvhubEnvironment, environment_factory, success

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def expert_record(env_id: str, seed: int) -> dict:
    result = CliRunner().invoke(cli, ["run", env_id, "--policy", "expert", "--seed", str(seed), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("env_id", ["sokoban/Sokoban-v0", LAKE])
def test_the_act_tool_plays_the_episode_envhub_run_plays(env_id):
    """reset() then act(action) per turn: the prompt and every tool result show the observations
    ``envhub run`` shows, and the reward and success are the env's."""
    record = expert_record(env_id, 4)
    factory = environment_factory(env_id)
    env = factory()
    prompt = env.reset(seed=4)
    assert env.env.instructions.strip() in prompt and "`act` tool" in prompt
    assert prompt.endswith(record["transcript"][0]["observation"] + "\nLegal actions: " + ", ".join(env.env.valid_actions()))
    for turn in record["transcript"][1:]:
        result = env.act(turn["action"])
        assert turn["observation"] in result and env.env.state_key() == turn["info"]["state_key"]
    assert "The episode is over: success" in result and env.episode_over
    assert env.get_reward() == pytest.approx(record["return"]) and env.success is True
    assert success([env, object()]) == [1.0, None]
    with pytest.raises(ResetNeeded, match="the episode is over"):
        env.act("Up")


def test_trl_sees_only_reset_act_and_get_reward():
    """TRL turns every public function of the class into a tool, except reset and get_reward."""
    import inspect

    factory = environment_factory(LAKE)
    functions = {name for name, _ in inspect.getmembers(factory, predicate=inspect.isfunction) if not name.startswith("_")}
    assert functions == {"reset", "act", "get_reward"}
    assert factory.__name__ == "FrozenLakeNotSlippery_v0" and issubclass(factory, EnvhubEnvironment)


def test_seeds_come_from_the_dataset_or_the_factorys_stream():
    factory = environment_factory(LAKE, seed=10, max_turns=3)
    first, second = factory(), factory()
    first.reset(prompt=[{"role": "user", "content": ""}])  # a dataset row with no seed column
    second.reset()
    assert (first.seed, second.seed) == (10, 11)
    second.reset(seed=10, prompt="ignored")  # a seed column: a GRPO group's rows share their state
    assert second.env.state_key() == first.env.state_key() and second.env.max_turns == 3
    illegal = first.act("Jump")
    assert illegal.startswith("Turn 2 of 3") and "Invalid action" in illegal and not first.episode_over


def test_bad_factory_arguments_fail_at_once():
    with pytest.raises(UnknownEnv, match="Did you mean 'sokoban/Sokoban-v0'"):
        environment_factory("sokoban/Sokoban-v9")
    with pytest.raises(TypeError):
        environment_factory(LAKE, bogus=1)
    with pytest.raises(Exception, match="bound to no env"):
        EnvhubEnvironment()


class GuessByTools(TextEnv):
    """Shaped as envhub's tool envs are (``ToolEnv``: tools as typed methods listed in
    ``_tool_names``, ``call_action`` writing a call as the action's JSON): guess a number from 0 to 3."""

    instructions = "Guess the number from 0 to 3."
    _tool_names = ("guess", "give_up")

    def guess(self, number: int) -> str:
        """Guess the number.

        Args:
            number: your guess, from 0 to 3.
        """
        raise AssertionError("the env's own tool body is never run: a call is an action")

    def give_up(self) -> str:
        """End the episode without a guess."""
        raise AssertionError("the env's own tool body is never run: a call is an action")

    def call_action(self, name: str, **arguments) -> str:
        return json.dumps({"name": name, "arguments": arguments}, sort_keys=True)

    def parse_action(self, action: str) -> str:
        return action

    def _reset(self, options):
        self.secret, self.done = int(self.np_random.integers(4)), False
        return "Guess.", {}

    def _step(self, action):
        call = json.loads(action)
        self.done = call["name"] == "give_up" or call["arguments"]["number"] == self.secret
        won = call["name"] == "guess" and call["arguments"]["number"] == self.secret
        return ("Right." if won else "Wrong."), float(won), self.done, {}

    def state_key(self):
        return str(self.done)

    def is_success(self):
        return False

    def render_text(self):
        return "?"


@pytest.fixture()
def tool_env_id():
    import envhub

    envhub.register("mine/GuessByTools-v0", GuessByTools, max_turns=4)
    yield "mine/GuessByTools-v0"
    envhub.registry.remove("mine/GuessByTools-v0")


def test_a_tool_env_exposes_its_own_tools_instead_of_act(tool_env_id):
    import inspect

    from transformers.utils import get_json_schema

    factory = environment_factory(tool_env_id)
    functions = {name for name, _ in inspect.getmembers(factory, predicate=inspect.isfunction) if not name.startswith("_")}
    assert functions == {"reset", "get_reward", "guess", "give_up"}
    env = factory()
    assert "calling the tools" in env.reset(seed=0)
    schema = get_json_schema(env.guess)["function"]
    assert schema["name"] == "guess" and schema["parameters"]["properties"]["number"] == {"type": "integer", "description": "your guess, from 0 to 3."}
    assert env.guess(number=(env.env.secret + 1) % 4).endswith("Wrong.")
    assert "The episode is over" in env.guess(number=env.env.secret) and env.get_reward() == 1.0


# ---------------------------------------------------------------------- plain trl.GRPOTrainer

#: Blackjack: one call of act("Stick") ends an episode with +1, 0 or -1, so the rollouts of a group
#: (each its own seed) score differently and GRPO's advantages are not all zero.
CARDS = "gym/Blackjack-v1"
TOOL_CALL = '<tool_call>\n{"name": "act", "arguments": {"action": "Stick"}}\n</tool_call>'
SHORT_RULES = "Beat the dealer: get closer to 21 without going over."


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread: on a busy 2-core machine, two threads spinning against other processes made
    a step of the tiny model 30x slower."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tool_calling_tiny(one_thread):
    """The tiny model with TRL's Qwen2.5 chat template (which renders tools), taught in 150 short
    steps to answer a first prompt with a call of ``act``: a random model never calls a tool, and
    the test must see TRL's tool loop step the environments."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from trl.chat_template_utils import qwen2_5_chat_template

    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus

    env = environment_factory(CARDS, seed=100, instructions=SHORT_RULES)()
    corpus = list(environment_corpus([CARDS], seeds=4))
    tokenizer = build_tokenizer(corpus)
    tokenizer.chat_template = qwen2_5_chat_template
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": env.reset(seed=seed)}], tools=[env.act], tokenize=False, add_generation_prompt=True)
        for seed in range(4)
    ]
    # Retrained with the rendered prompts, the vocabulary writes the template's tool preamble in fewer tokens.
    tokenizer = build_tokenizer(corpus + prompts + [TOOL_CALL + "<|im_end|>"] * 4)
    tokenizer.chat_template = qwen2_5_chat_template
    model = build_model(tokenizer)
    target = tokenizer.encode(TOOL_CALL + "<|im_end|>")
    rows = [(tokenizer.encode(prompt), target) for prompt in prompts]
    steps = 150
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    model.train()
    for step in range(steps):
        prompt_ids, target_ids = rows[step % len(rows)]
        labels = torch.tensor([[-100] * len(prompt_ids) + target_ids])
        loss = model(input_ids=torch.tensor([prompt_ids + target_ids]), labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    assert loss.item() < 0.05, f"the warm start did not learn the tool call (loss {loss.item():.3f})"
    return model, tokenizer


@pytest.mark.slow
def test_plain_grpo_trainer_trains_two_steps_through_the_factory(tool_calling_tiny, tmp_path, monkeypatch):
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = tool_calling_tiny
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    factory = environment_factory(CARDS, seed=0, instructions=SHORT_RULES)
    config = GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=2, max_completion_length=192,
        max_tool_calling_iterations=3, temperature=0.7, reward_weights=[0.0], learning_rate=1e-4, logging_steps=1, report_to="none",
        use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[success], args=config, processing_class=tokenizer, environment_factory=factory)
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    assert len(logs) == 2 and all(entry["tools/call_frequency"] > 0 for entry in logs)
    assert all("rewards/success/mean" in entry for entry in logs)
    pool = trainer._environment_pool[None]  # the last batch's rollouts, one environment each
    assert all(isinstance(env, factory) for env in pool) and any(env.env.turn > 0 for env in pool)
    assert len({env.seed for env in pool}) == len(pool)  # no env groups: each rollout its own episode
    assert logs[-1]["rewards/Blackjack_v1/mean"] == pytest.approx(sum(env.get_reward() for env in pool) / len(pool))
    assert logs[-1]["rewards/success/mean"] == pytest.approx(sum(env.success for env in pool) / len(pool))
    assert any(entry["grad_norm"] > 0 for entry in logs)
    assert any(not torch_equal(before[name], tensor) for name, tensor in model.state_dict().items())


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


@pytest.mark.slow
def test_integrations_page_trl_example_trains_on_the_cpu(one_thread, tmp_path, monkeypatch):
    """The integrations page's TRL example as written but for its sizes and the model (the tiny one
    with a chat template that renders tools, in a folder as the example expects)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from docs_pages import DOCS, code_block

    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    source = code_block(DOCS / "integrations.md", "python", lambda b: "environment_factory=environment_factory(" in b)
    tokenizer = build_tokenizer(environment_corpus(["sokoban/Sokoban-v0"], seeds=2))
    tokenizer.chat_template = qwen2_5_chat_template
    folder = tmp_path / "model"
    build_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for written, small in (
        ('"path/or/hub-id"', repr(str(folder))),
        ("num_generations=8, per_device_train_batch_size=8,\n                    max_steps=200, max_completion_length=1024, max_tool_calling_iterations=10",
         "num_generations=2, per_device_train_batch_size=2, max_steps=1, max_completion_length=16, "
         "max_tool_calling_iterations=1, use_cpu=True, bf16=False, report_to='none', save_strategy='no'"),
    ):
        assert written in source, f"the integrations page's example changed: {written} is gone"
        source = source.replace(written, small)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(source, "docs/integrations.md", "exec"), namespace)  # noqa: S102
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1
    assert "rewards/Sokoban_v0/mean" in trainer.state.log_history[0] and "rewards/success/mean" in trainer.state.log_history[0]
