"""A tiny Qwen2-style model and a byte-level BPE tokenizer, built locally for tests and the demo.

No model hub is needed: the tokenizer is trained with ``tokenizers`` on text the installed
environments produce (their instructions, observations and the manager's chat messages), and the
model is a freshly initialised ``Qwen2ForCausalLM`` (head size 64, as vLLM's CPU attention wants).
``build_tiny(path)`` saves both in one folder that ``transformers`` and ``vllm`` load like any
Hugging Face checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import envhub
from envhub.actions import ReplyFormat, env_format_name, get_format
from envhub.chat import ChatRenderer
from envhub.core import ToolEnv

#: The special tokens: padding/end of text, and ChatML's turn markers (``<|im_end|>`` ends a reply).
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

#: ChatML, as Qwen2 models use it, with Qwen2.5's tool calling: ``tools=`` are written into the
#: system message (Hermes' wording, as :func:`envhub.tools.tools_text`), an assistant message's
#: ``tool_calls`` become ``<tool_call>`` blocks, and consecutive ``tool`` messages become one user
#: turn of ``<tool_response>`` blocks. Without tools or tool messages it
#: renders exactly as plain ChatML.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}"
    "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first and tools %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set call = call['function'] if call.get('function') else call %}"
    "{%- if not loop.first or message['content'] %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\\\"name\\\": \\\"' + call['name'] + '\\\", \\\"arguments\\\": ' + (call['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def environment_corpus(
    env_ids: Iterable[str] | None = None,
    seeds: int = 8,
    turns: int = 6,
    env_kwargs: dict[str, Any] | None = None,
    kwargs_by_env: dict[str, dict[str, Any]] | None = None,
    system_per_episode: bool = False,
) -> Iterator[str]:
    """Yield text the environments produce: chat-rendered instructions, observations and replies.

    Each environment plays ``seeds`` short episodes of its expert (or its first legal action) so the
    tokenizer sees the states an agent meets, in the env's own reply format (tool envs: their
    tools in the system message, ``<tool_call>`` replies, ``<tool_response>`` results). Environments
    that fail to make are skipped, and an episode ends where its env raises (at reset or in a
    step), as it would in training.
    ``env_kwargs`` go to every ``envhub.make`` (e.g. an observation view that changes the text);
    ``kwargs_by_env`` gives some envs their own instead. ``system_per_episode`` yields each env's
    system message once per episode, as often as training shows it, instead of once.
    """
    for env_id in env_ids if env_ids is not None else list(envhub.registry):
        try:
            env = envhub.make(env_id, **(kwargs_by_env or {}).get(env_id, env_kwargs or {}))
        except Exception:  # a broken plugin must not stop the tokenizer from being built
            continue
        fmt = get_format(env_format_name(env))
        renderer = ChatRenderer(fmt)
        tools = env.tool_schemas() if isinstance(env, ToolEnv) else None
        system = f"{IM_START}system\n{renderer.system(env.instructions, tools)}{IM_END}\n"
        yield system
        for seed in range(seeds):
            if system_per_episode and seed:
                yield system
            yield from _episode_text(env, seed, turns, fmt, renderer, tools)


def _episode_text(env: Any, seed: int, turns: int, fmt: ReplyFormat, renderer: ChatRenderer, tools: Any) -> Iterator[str]:
    """The chat text of one episode of ``env`` from ``seed``, played by its expert (or its first
    legal action), up to ``turns`` turns; it ends where the env raises."""
    try:
        observation, _ = env.reset(seed=seed)
        for turn in range(turns):
            legal = env.valid_actions()
            if tools is not None and turn > 0:
                yield f"{IM_START}user\n<tool_response>\n{observation}\n</tool_response>{IM_END}\n"
            else:
                yield f"{IM_START}user\n{renderer.user(observation, turn, env.max_turns, legal)}{IM_END}\n"
            action = env.expert_action() or (legal[0] if legal else "wait")
            yield f"{IM_START}assistant\n{fmt.render(action)}{IM_END}\n"
            observation, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    except Exception:  # an env that fails mid-episode must not stop the tokenizer from being built
        return


def build_tokenizer(
    corpus: Iterable[str] | None = None, vocab_size: int = 1024, phrases: Iterable[str] = ()
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with ChatML special tokens and chat template.

    Args:
        corpus: training text; by default :func:`environment_corpus` over every registered env.
        vocab_size: the vocabulary size (specials and the 256 byte symbols included).
        phrases: strings that become one token each, on top of ``vocab_size`` (matched before
            BPE, wherever they occur): see :attr:`envhub.core.TextEnv.phrases`.
    """
    tokenizer = Tokenizer(models.BPE())
    # Every digit and punctuation character is a token of its own (as Llama 3 and Qwen split
    # digits), and so is every capital letter that does not start a word ("PO", "OOO", "XG" but
    # not "Left"): a text grid such as FrozenLake's "PO_G" or Sokoban's "#_X#" becomes one token
    # per cell, so a cell's neighbours sit at fixed token distances.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[^\s\p{L}]|\p{Lu}(?!\p{Ll})"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus if corpus is not None else environment_corpus()), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    phrases = list(dict.fromkeys(phrases))
    if phrases:
        fast.add_tokens(phrases)
    return fast


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    max_positions: int = 4096,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM sized for ``tokenizer`` (head size ``hidden_size / num_heads``)."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be a multiple of num_heads {num_heads}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


#: The tool-call scaffolding :attr:`TinySpec.tool_call_tokens` makes single tokens: envhub's call
#: blocks (:class:`envhub.tools.ToolCall`) and the chat template's tool results.
TOOL_CALL_PHRASES = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", '{"name": ', ', "arguments": ')


@dataclasses.dataclass(frozen=True)
class TinySpec:
    """How ``--model tiny`` is built: a config file's ``tiny`` mapping (the defaults are the
    model every earlier figure was measured with).

    Attributes:
        hidden_size: the width (head size is ``hidden_size / num_heads``; vLLM's CPU attention
            wants 64).
        num_layers: transformer layers.
        num_heads: attention heads.
        vocab_size: the BPE vocabulary, phrase tokens not counted.
        phrase_tokens: each phrase the envs declare (:attr:`envhub.core.TextEnv.phrases`, e.g.
            FrozenLake's local view "Down: hole.") becomes one token. Without them the model must
            learn which tile word follows which direction word; with uniform attention at the
            start it sees a bag of words, where "Down: ice. Right: hole." and "Down: hole. Right:
            ice." look the same, and at most training seeds it never leaves that plateau.
        system_per_episode: the tokenizer's corpus holds each env's system message once per
            episode, as often as training shows it, rather than once: BPE merges it into fewer
            tokens, and a shorter constant prefix leaves the observation more of the attention.
        tool_call_tokens: the scaffolding of a tool call and its result (:data:`TOOL_CALL_PHRASES`)
            becomes one token each, as ``<tool_call>`` is one token of Qwen2.5's vocabulary.
            The tokenizer splits every punctuation mark off, so a FrozenLake ``move`` call is 68
            tokens without them and 28 with them: for an agent trained through the proxy
            (``envhub train --agent``), whose calls the corpus of ``env_ids`` does not hold.
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    vocab_size: int = 1024
    phrase_tokens: bool = False
    system_per_episode: bool = False
    tool_call_tokens: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), bool if f.type in ("bool", bool) else int
            if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 1)):
                raise ValueError(f"tiny.{f.name} must be {'true or false' if kind is bool else 'a positive integer'}, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"tiny.hidden_size {self.hidden_size} must be a multiple of tiny.num_heads {self.num_heads}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "TinySpec":
        """From a config file's ``tiny`` mapping; an unknown key is an error that lists the known ones."""
        from envhub_trl.config_file import settings_from_mapping

        return cls() if values is None else settings_from_mapping(cls, values, "tiny")

    def build(
        self,
        env_ids: Sequence[str] | None,
        seed: int = 0,
        env_kwargs: dict[str, Any] | None = None,
        kwargs_by_env: dict[str, dict[str, Any]] | None = None,
    ) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
        """The model (weights seeded with ``seed``) and its tokenizer, trained on the text of
        ``env_ids`` made with ``env_kwargs`` (``kwargs_by_env``: each env its own)."""
        corpus = environment_corpus(env_ids, env_kwargs=env_kwargs, kwargs_by_env=kwargs_by_env, system_per_episode=self.system_per_episode)
        phrases = list(environment_phrases(env_ids, env_kwargs, kwargs_by_env)) if self.phrase_tokens else []
        phrases += TOOL_CALL_PHRASES if self.tool_call_tokens else ()
        tokenizer = build_tokenizer(corpus, vocab_size=self.vocab_size, phrases=phrases)
        model = build_model(tokenizer, hidden_size=self.hidden_size, num_layers=self.num_layers, num_heads=self.num_heads, seed=seed)
        return model, tokenizer


def environment_phrases(
    env_ids: Iterable[str] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    kwargs_by_env: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """The :attr:`~envhub.core.TextEnv.phrases` of ``env_ids`` (None: every registered env), each
    made as :func:`environment_corpus` makes it; envs that fail to make are skipped."""
    phrases: list[str] = []
    for env_id in env_ids if env_ids is not None else list(envhub.registry):
        try:
            env = envhub.make(env_id, **(kwargs_by_env or {}).get(env_id, env_kwargs or {}))
        except Exception:  # as environment_corpus: a broken plugin must not stop the tokenizer
            continue
        phrases.extend(getattr(getattr(env, "unwrapped", env), "phrases", ()))
    return phrases


def build_tiny(
    path: str | Path,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    env_ids: Iterable[str] | None = None,
    spec: TinySpec | None = None,
) -> Path:
    """Build the tiny tokenizer and model and save them to ``path``; return the path.

    The folder loads with ``AutoTokenizer``/``AutoModelForCausalLM.from_pretrained`` and with
    ``vllm.LLM(model=path)``.

    Args:
        path: the folder to write.
        seed: seeds the model's initial weights.
        corpus: the tokenizer's training text; by default :func:`environment_corpus` of ``env_ids``.
        env_ids: the environments whose text trains the tokenizer; None for every registered one
            (so the vocabulary depends on the installed plugins; pass ids for a fixed one).
        spec: the model's size and tokenizer options (None: :class:`TinySpec`'s defaults);
            ``corpus``, when given, replaces the one it would build.
    """
    path = Path(path)
    spec = spec or TinySpec()
    if corpus is None:
        env_ids = list(env_ids) if env_ids is not None else None
        model, tokenizer = spec.build(env_ids, seed)
    else:
        tokenizer = build_tokenizer(corpus, vocab_size=spec.vocab_size)
        model = build_model(tokenizer, hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_heads=spec.num_heads, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path
