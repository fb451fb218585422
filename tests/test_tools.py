"""Tool calling: schemas from typed methods, the tool-call reply format, ToolEnv, the tool envs
(MultiHopQA, Countdown) and tool conversations in the manager. No torch needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Literal

import pytest
from helper_envs import CharTokenizer

import envhub
from envhub.actions import apply_reply, get_format
from envhub.checker import malformed_tool_calls
from envhub.core import ToolEnv
from envhub.generation import ExpertGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.play import HumanGenerator
from envhub.rollout import batch_metrics, rollout
from envhub.tools import ToolCall, ToolError, ToolResult, call_from_python, json_schema, parse_tool_calls, tool

QA = "tools/MultiHopQA-v0"
COUNTDOWN = "tools/Countdown-v0"
TOOL_IDS = [s.id for s in envhub.registry.values() if s.id.startswith("tools/")]


class Counter(ToolEnv):
    """Reach ``goal`` by adding; ``submit`` ends the episode."""

    instructions = "Add numbers until the total is 10, then submit."
    final_tools = ("submit",)

    def _reset(self, options):
        self.total = 0
        return "The total is 0.", {}

    @tool
    def add(self, amount: int, note: str = "") -> str:
        """Add an amount to the total.

        Args:
            amount: how much to add.
            note: a remark, ignored.
        """
        if amount > 100:
            raise ToolError("amounts above 100 are refused")
        self.total += amount
        return f"The total is {self.total}."

    @tool
    def submit(self) -> ToolResult:
        """Finish the episode.

        Args:
        """
        return ToolResult("Submitted.", float(self.total == 10), info={"total": self.total})

    def state_key(self):
        return str(self.total)

    def is_success(self):
        return self.total == 10

    def render_text(self):
        return f"total {self.total}"

    def expert_action(self):
        return self.call_action("add", amount=10 - self.total) if self.total != 10 else self.call_action("submit")


# ---------------------------------------------------------------------------------------- schemas


def lookup(city: str, days: int, unit: Literal["c", "f"] = "c", tags: list[str] | None = None, exact: bool = False) -> str:
    """Look up the weather forecast.

    Args:
        city: the city's name.
        days: how many days
            ahead to forecast.
        unit: the temperature unit.
        tags: labels to attach.
        exact: whether to match the name exactly.
    """
    return city


def test_schema_comes_from_the_signature_and_docstring_as_transformers_builds_it():
    schema = json_schema(lookup)
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "lookup"
    assert function["description"] == "Look up the weather forecast."
    properties = function["parameters"]["properties"]
    assert properties["days"] == {"type": "integer", "description": "how many days ahead to forecast."}
    assert properties["unit"] == {"enum": ["c", "f"], "type": "string", "description": "the temperature unit."}
    assert properties["tags"] == {"type": "array", "items": {"type": "string"}, "nullable": True, "description": "labels to attach."}
    assert function["parameters"]["required"] == ["city", "days"]
    transformers_utils = pytest.importorskip("transformers.utils")
    reference = transformers_utils.get_json_schema(lookup)
    reference["function"].pop("return")  # transformers also describes the return value; chat templates do not show it
    assert reference == schema


def test_a_tool_that_cannot_be_described_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match="needs a type annotation"):

        class Untyped(Counter):
            @tool
            def look(self, where) -> str:
                """Look.

                Args:
                    where: where.
                """

    with pytest.raises(TypeError, match="does not describe 'where'"):

        class Undocumented(Counter):
            @tool
            def look(self, where: str) -> str:
                """Look somewhere."""

    with pytest.raises(TypeError, match="final_tools names"):

        class WrongFinal(Counter):
            final_tools = ("finish",)


# ---------------------------------------------------------------------------------------- the format


SCHEMAS = Counter().tool_schema_map()


@pytest.mark.parametrize(
    "reply, reason, well_formed",
    [
        ("no call at all", "the reply calls no tool", False),
        ("<tool_call>{\"name\": \"add\", \"arguments\": {\"amount\": 1}", "1 <tool_call> and 0 </tool_call>", False),
        ("<tool_call>{\"name\": \"add\", \"arguments\": {\"amount\": 1}</tool_call>", "not valid JSON", False),
        ("<tool_call><tool_call>{}</tool_call></tool_call>", "nested or out of order", False),
        ("<tool_call>[1]</tool_call>", "got array", False),
        ("<tool_call>{\"name\": \"mul\", \"arguments\": {}}</tool_call>", "there is no tool called 'mul'; the tools are: add, submit", True),
        ("<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>", "add() is missing the required argument 'amount'", True),
        ("<tool_call>{\"name\": \"add\", \"arguments\": {\"amount\": \"3\"}}</tool_call>", "add() argument 'amount' must be integer, got string", True),
        ("<tool_call>{\"name\": \"add\", \"arguments\": {\"amount\": true}}</tool_call>", "must be integer, got boolean", True),
        ("<tool_call>{\"name\": \"add\", \"arguments\": {\"amount\": 1, \"x\": 2}}</tool_call>", "unexpected argument 'x'", True),
        ("<tool_call>{\"name\": \"add\", \"arguments\": {\"amount\": 1, \"note\": \"%s\"}}</tool_call>" % ("n" * 5000), "5000 characters long", True),
    ],
)
def test_a_bad_call_is_invalid_and_says_exactly_what_was_wrong(reply, reason, well_formed):
    parsed = get_format("tool-call").parse(reply, None, SCHEMAS)
    assert not parsed.valid and reason in parsed.error and parsed.format_valid is well_formed
    env = Counter()
    env.reset(seed=0)
    outcome = apply_reply(env, reply, get_format("tool-call"))
    assert outcome.info["action_is_valid"] is False and outcome.info["state_key"] == "0"
    assert outcome.observation == f"Error: {parsed.error}"


def test_calls_may_carry_reasoning_arguments_as_a_json_string_and_several_up_to_the_cap():
    one = '<tool_call>{"name": "add", "arguments": {"amount": 4}}</tool_call>'
    as_string = '<tool_call>{"name": "add", "arguments": "{\\"amount\\": 4}"}</tool_call>'
    assert parse_tool_calls(as_string, SCHEMAS).calls == (ToolCall("add", {"amount": 4}),)
    parsed = parse_tool_calls(f"I will add twice. {one}\n{one}\n{one}", SCHEMAS, max_calls=2)
    assert parsed.error is None and len(parsed.calls) == 2 and parsed.dropped == 1
    env = Counter()
    env.reset(seed=0)
    outcome = apply_reply(env, f"{one}{one}", get_format("tool-calls"))
    assert outcome.observations == ("The total is 4.", "The total is 8.") and env.turn == 2
    assert get_format("tool-call").parse(f"{one}{one}", None, SCHEMAS).actions == (ToolCall("add", {"amount": 4}).to_json(),)


def test_tool_env_actions_are_canonical_json_and_final_tools_end_the_episode():
    env = Counter()
    env.reset(seed=0)
    assert env.valid_actions() is None and env.expert_action() == '{"name": "add", "arguments": {"amount": 10}}'
    observation, _, _, _, info = env.step('{"arguments": {"amount": 500}, "name": "add"}')
    assert observation == "Error: amounts above 100 are refused" and info["action_is_valid"] and info["tool_error"]
    env.step("<tool_call>" + env.expert_action() + "</tool_call>")
    observation, reward, terminated, truncated, info = env.step(env.expert_action())
    assert (observation, reward, terminated, truncated, info["total"], info["success"]) == ("Submitted.", 1.0, True, False, 10, True)


def test_tool_fuzz_corpus_holds_the_named_kinds_of_junk():
    replies = list(malformed_tool_calls(Counter().tool_schemas(), 500))
    assert len(replies) >= 500
    assert any(len(r) > 1 << 20 for r in replies) and any(r.count("<tool_call>") > 1 for r in replies)
    assert any('"amount": 1}' in r or '"amount": "' in r for r in replies) and any("[[[[" in r for r in replies)
    env = Counter()
    env.reset(seed=0)
    for reply in replies:
        outcome = apply_reply(env, reply, get_format("tool-call"))
        assert outcome.info["action_is_valid"] is False, reply[:100]
        assert outcome.observation.startswith("Error: ") and "\n" not in outcome.observation[:200]


def test_people_type_calls_as_python():
    assert call_from_python('add(3, note="hi")', SCHEMAS) == ToolCall("add", {"amount": 3, "note": "hi"})
    assert call_from_python("add(__import__('os'))", SCHEMAS) is None and call_from_python("print(1)", SCHEMAS) is None
    answers = iter(["help", 'calculate("1 + 2")'])
    shown = []
    human = HumanGenerator(prompt=lambda _: next(answers), show=shown.append)
    with EnvGroupManager(COUNTDOWN, 1, 1, seed=0) as manager:
        manager.reset()
        reply = human.generate(manager.prompts(), SamplingParams())[0].text
    assert reply == '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    assert "calculate(expression: string)" in shown[0]


# ---------------------------------------------------------------------------------------- the envs


@pytest.mark.parametrize("env_id", TOOL_IDS)
def test_the_expert_solves_every_generated_episode(env_id):
    env = envhub.make(env_id)
    seeds = 20 if "Large" in env_id else 150
    for seed in range(seeds):
        env.reset(seed=seed)
        while True:
            _, reward, terminated, truncated, info = env.step(env.expert_action())
            assert info["action_is_valid"], (seed, info)
            if terminated or truncated:
                break
        assert terminated and info["success"] and reward == 1.0, (env_id, seed, env.render_text())


def test_multihop_questions_need_their_hops_and_report_f1():
    env = envhub.make("tools/MultiHopQA4Hop-v0")
    _, info = env.reset(seed=5)
    assert info["hops"] == 4 and len(env.question.chain) == 5 and "What is the name of" in env.question.text
    first = env.entities[env.question.chain[0]].name
    assert first in env.question.text and env.gold_answer not in env.question.text
    observation, *_ = env.step(env.call_action("search", query=first))
    assert observation.startswith(f"[1] {first}: ")
    gold_last = env.gold_answer.split()[-1]
    _, reward, terminated, _, info = env.step(env.call_action("submit", answer=f"the {gold_last}"))
    assert terminated and reward == float(info["exact_match"]) and 0.0 <= info["f1"] <= 1.0 and info["gold_answer"] == env.gold_answer
    env.reset(seed=5)
    *_, info = env.step(env.call_action("submit", answer=f"  The {env.gold_answer.upper()}. "))
    assert info["exact_match"] and info["f1"] == 1.0 and info["success"]


def test_multihop_state_key_is_the_question_and_the_documents_seen():
    env = envhub.make(QA)
    _, info = env.reset(seed=2)
    key = info["state_key"]
    name = env.entities[env.question.chain[0]].name
    *_, first = env.step(env.call_action("search", query=name))
    *_, again = env.step(env.call_action("search", query=f"  {name.lower()} "))
    assert first["state_key"] != key and again["state_key"] == first["state_key"]  # nothing new seen: same state


MULTIHOP_DIGEST = """
import envhub, hashlib, json
env = envhub.make({env_id!r})
worlds = []
for seed in range(5):
    env.reset(seed=seed)
    worlds.append([env.question.text, [e.document for e in env.entities], env.search(env.question.text)])
print(hashlib.sha256(json.dumps(worlds).encode()).hexdigest())
"""


@pytest.mark.parametrize("env_id", [QA, COUNTDOWN])
def test_generators_are_deterministic_across_processes(env_id):
    code = MULTIHOP_DIGEST.format(env_id=env_id)
    if env_id == COUNTDOWN:
        code = code.replace("[env.question.text, [e.document for e in env.entities], env.search(env.question.text)]", "[env.numbers, env.target, env.solution]")
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": h}).stdout
        for h in ("0", "987")
    }
    assert len(digests) == 1


@pytest.mark.parametrize(
    "expression, error",
    [
        ("__import__('os').system('true')", "not call"),
        ("2 ** 10", "only + - * /"),
        ("x + 1", "not name"),
        ("1.5 * 2", "only whole numbers"),
        ("1 / (2 - 2)", "division by zero"),
        ("99999999 * 99999999", "exceeds"),
        ("(" * 95 + "1" + ")" * 95, ""),
        ("1 +", "cannot read"),
    ],
)
def test_calculate_is_a_safe_evaluator_whose_failures_are_results(expression, error):
    env = envhub.make(COUNTDOWN)
    env.reset(seed=0)
    observation, _, terminated, _, info = env.step(env.call_action("calculate", expression=expression))
    assert info["action_is_valid"] and not terminated
    if expression.startswith("(("):
        assert observation.endswith("= 1") or observation.startswith("Error: ")
    else:
        assert observation.startswith("Error: ") and error in observation


def test_countdown_submit_needs_every_number_once_and_the_target():
    env = envhub.make(COUNTDOWN)
    env.reset(seed=4)
    numbers, target = env.numbers, env.target
    observation, reward, terminated, _, info = env.step(env.call_action("submit", expression=" + ".join(map(str, numbers[:-1]))))
    assert terminated and reward == 0.0 and not info["numbers_ok"] and "exactly once" in observation
    env.reset(seed=4)
    *_, info = env.step(env.call_action("calculate", expression=env.solution))
    assert info["action_is_valid"] and f"= {target}" in env.calculate(env.solution)


# ---------------------------------------------------------------------------------------- the manager


def test_manager_plays_tool_envs_in_the_tool_call_format_with_tool_messages():
    with EnvGroupManager(QA, 3, 2, seed=0) as manager:
        assert manager.fmt == get_format("tool-call")
        trajectories = rollout(manager, ExpertGenerator())
    assert batch_metrics(trajectories)["success_rate"] == 1.0
    for trajectory in trajectories:
        roles = [m["role"] for m in trajectory.messages]
        assert roles[:3] == ["system", "user", "assistant"] and roles[3::2] == ["tool"] * (trajectory.num_turns - 1)
        assert "<tools>" in trajectory.messages[0]["content"] and '"name": "search"' in trajectory.messages[0]["content"]
        assert all(turn.reply.startswith("<tool_call>\n{") for turn in trajectory.turns)
        assert trajectory.tools == envhub.make(QA).tool_schemas()


class ToolTemplateTokenizer(CharTokenizer):
    """CharTokenizer with a template that renders ``tools=`` in the system turn and ``tool`` turns as its own role."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, tools=None):
        if tools:
            names = ",".join(t["function"]["name"] for t in tools)
            messages = [{"role": "system", "content": f"{messages[0]['content']}|tools:{names}"}, *messages[1:]]
        return super().apply_chat_template(messages, tokenize=tokenize, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("tokenizer_class", [ToolTemplateTokenizer, CharTokenizer])
@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_tool_conversations_are_token_exact_with_tool_results_masked(tokenizer_class, layout):
    tokenizer = tokenizer_class()
    with EnvGroupManager(COUNTDOWN, 2, 2, seed=1, tokenizer=tokenizer, layout=layout, history_turns=1) as manager:
        assert manager.tokens.renders_tools is (tokenizer_class is ToolTemplateTokenizer)
        trajectories = rollout(manager, ExpertGenerator(tokenizer))
    for trajectory in trajectories:
        system = trajectory.messages[0]["content"]
        assert ("<tools>" in system) is (tokenizer_class is CharTokenizer)  # the fallback writes the tools out
        if layout == "step":
            continue
        sample = trajectory.sample()
        tools = {"tools": trajectory.tools} if tokenizer_class is ToolTemplateTokenizer else {}
        expected = tokenizer.apply_chat_template(trajectory.messages, tokenize=True, **tools)
        assert sample.prompt_ids + sample.completion_ids == expected[:-1]
        env_tokens = tokenizer.decode([t for t, m in zip(sample.completion_ids, sample.env_mask) if not m])
        assert "tool\n" in env_tokens and "= " in env_tokens  # the calculator's result is an environment token
        model_tokens = tokenizer.decode([t for t, m in zip(sample.completion_ids, sample.env_mask) if m])
        assert model_tokens.count("<tool_call>") == trajectory.num_turns and "= " not in model_tokens


def test_a_mix_of_tool_and_text_envs_plays_each_in_its_own_format():
    with EnvGroupManager({QA: 1, "frozenlake/FrozenLakeNotSlippery-v0": 1}, group_size=2, seed=0) as manager:
        assert set(manager.formats.values()) == {get_format("tool-call"), get_format("answer")}
        trajectories = rollout(manager, ExpertGenerator())
    assert batch_metrics(trajectories)["invalid_action_rate"] == 0.0
    assert {t.env_id: t.turns[0].reply.split(">")[0] for t in trajectories} == {QA: "<tool_call", "frozenlake/FrozenLakeNotSlippery-v0": "<answer"}
