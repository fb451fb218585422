"""TextWorld games from its challenge generators, compiled once and cached on disk.

A game is named by its challenge (``tw-simple``, ``tw-cooking``), the challenge's settings and a
seed. :func:`game_file` returns the compiled ``.z8`` story (with TextWorld's ``.json`` beside it),
generating and compiling it the first time and reading the cache afterwards.

Generation runs in a fresh interpreter with ``PYTHONHASHSEED=0``: TextWorld's generators iterate
over sets, so a game generated in two processes with different hash seeds can differ (TextWorld
itself refuses to compile a second, different game under the same id). With the hash seed fixed,
one seed gives the same game in any process, and a crash or hang of Inform7 stays out of the
caller. Files are written to a temporary folder and moved into place, so processes that ask for
the same game at once never read a half-written one.

Inform7 writes the compile date into the story's header as its serial number, so a game compiled
on another day differed in that one field (and a game's banner printed it). :func:`stamp_serial`
replaces it with :data:`SERIAL`, which makes a game's bytes depend on its challenge, settings and
seed alone.

Cache: ``$ENVHUB_TEXTWORLD_CACHE``, else ``$XDG_CACHE_HOME/envhub/textworld`` (``~/.cache/...``),
one folder per TextWorld version and cache format.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envhub.error import EnvhubError, MissingDependency

INSTALL = "pip install envhub-textworld (it pins textworld==1.7.0)"

#: The serial number every compiled game carries in place of its compile date (Z-machine header
#: bytes 0x12-0x17, six ASCII characters; the header's checksum covers bytes from 0x40 only).
SERIAL = b"000000"

#: Raised when the files a cache holds change meaning: 2 = serial number stamped.
CACHE_FORMAT = 2

#: Seconds one game may take to generate and compile before it is abandoned.
GENERATION_TIMEOUT = 600


class GenerationError(EnvhubError, RuntimeError):
    """TextWorld could not generate or compile a game; the message gives its error."""


def cache_root() -> Path:
    """``$ENVHUB_TEXTWORLD_CACHE``, else ``$XDG_CACHE_HOME/envhub/textworld`` (``~/.cache/...``),
    under a folder for the installed TextWorld version and :data:`CACHE_FORMAT`."""
    root = os.environ.get("ENVHUB_TEXTWORLD_CACHE")
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(cache, "envhub", "textworld")
    return Path(root) / f"textworld-{_textworld_version()}-cache{CACHE_FORMAT}"


def game_name(challenge: str, settings: Mapping[str, Any], seed: int) -> str:
    """A file name that identifies the game: challenge, a digest of the settings, the seed."""
    digest = hashlib.sha256(json.dumps(dict(settings), sort_keys=True).encode()).hexdigest()[:12]
    return f"{challenge}-{digest}-seed{seed}"


def game_file(challenge: str, settings: Mapping[str, Any], seed: int, batch: Sequence[int] = ()) -> Path:
    """Return the compiled game, generating it on first use.

    Args:
        batch: more seeds to generate in the same interpreter when this game is missing (each
            interpreter parses TextWorld's grammars once, the bulk of a lone game's cost).

    Raises:
        MissingDependency: TextWorld is not installed.
        GenerationError: TextWorld failed (its message included).
    """
    story = story_path(challenge, settings, seed)
    if not _complete(story):
        missing = [s for s in dict.fromkeys([seed, *batch]) if not _complete(story_path(challenge, settings, s))]
        generate(challenge, settings, missing)
    return story


def story_path(challenge: str, settings: Mapping[str, Any], seed: int) -> Path:
    """Where the cache keeps the game's ``.z8`` (its ``.json`` beside it)."""
    return cache_root() / challenge / f"{game_name(challenge, settings, seed)}.z8"


def _complete(story: Path) -> bool:
    return story.exists() and story.with_suffix(".json").exists()


def generate(challenge: str, settings: Mapping[str, Any], seeds: Sequence[int]) -> dict[int, dict[str, float]]:
    """Generate and compile games into the cache, in one fresh interpreter with a fixed hash seed.

    Returns:
        Per seed, the seconds spent generating and compiling: ``{"generate_s": ..., "compile_s": ...}``
        (the first game of a batch also pays for parsing TextWorld's grammars).
    """
    folder = cache_root() / challenge
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".generating-") as tmp:
        request = json.dumps({"challenge": challenge, "settings": dict(settings), "seeds": list(seeds), "folder": tmp})
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "envhub_textworld.generator", request],
                capture_output=True, text=True, env=env, timeout=GENERATION_TIMEOUT * max(1, len(seeds)),
            )
        except subprocess.TimeoutExpired as exc:
            raise GenerationError(f"{challenge} seeds {list(seeds)}: generation took over {GENERATION_TIMEOUT} s a game") from exc
        if proc.returncode != 0:
            if "No module named 'textworld'" in proc.stderr:
                raise MissingDependency(f"TextWorld is not installed: {INSTALL}")
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise GenerationError(f"{challenge} seeds {list(seeds)} with {dict(settings)}: TextWorld failed: {last}")
        timings = {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
        for seed in seeds:
            made = Path(tmp) / story_path(challenge, settings, seed).name
            story = story_path(challenge, settings, seed)
            # The .json first: a .z8 in place means the game is complete.
            os.replace(made.with_suffix(".json"), story.with_suffix(".json"))
            os.replace(made, story)
    return timings


def _generate_here(challenge: str, settings: Mapping[str, Any], seed: int, path: str) -> dict[str, float]:
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game

    if challenge not in textworld.challenges.CHALLENGES:
        raise ValueError(f"unknown TextWorld challenge {challenge!r}; known: {sorted(textworld.challenges.CHALLENGES)}")
    _, make, _ = textworld.challenges.CHALLENGES[challenge]
    options = textworld.GameOptions()
    options.seeds = seed
    options.path = path
    options.file_ext = ".z8"
    options.force_recompile = True
    start = time.perf_counter()
    game = make(dict(settings), options)
    generated = time.perf_counter()
    compile_game(game, options)
    stamp_serial(Path(path))
    return {"generate_s": generated - start, "compile_s": time.perf_counter() - generated}


def stamp_serial(story: Path) -> None:
    """Overwrite the compile date Inform7 writes as the story's serial number with :data:`SERIAL`."""
    with open(story, "r+b") as f:
        header = f.read(0x18)
        if len(header) < 0x18 or not header[0x12:0x18].isdigit():
            raise GenerationError(f"{story}: not a Z-machine story with a serial number (header {header[:0x18]!r})")
        f.seek(0x12)
        f.write(SERIAL)


def _textworld_version() -> str:
    try:
        from importlib.metadata import version

        return version("textworld")
    except Exception as exc:
        raise MissingDependency(f"TextWorld is not installed: {INSTALL}") from exc


def _main(argv: list[str]) -> int:
    """``python -m envhub_textworld.generator REQUEST_JSON``: generate games, print their timings."""
    if len(argv) != 1:
        print("usage: python -m envhub_textworld.generator REQUEST_JSON", file=sys.stderr)
        return 2
    request = json.loads(argv[0])
    challenge, settings = request["challenge"], request["settings"]
    timings = {
        seed: _generate_here(challenge, settings, seed, os.path.join(request["folder"], f"{game_name(challenge, settings, seed)}.z8"))
        for seed in request["seeds"]
    }
    print(json.dumps(timings))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
