"""Where the TextArena adapter's per-step overhead goes (the breakdown behind the figures in docs/results.md).

On the workload of ``bench/textgames.py`` (the expert's moves of whole games, replayed with their
resets), times the adapter and the bare library as that benchmark does, then each part of the
adapter alone (``timeit``, best of 7) at states halfway through the first games: the state key,
the random-generator swap, the legal-move listing and match, the observation text, and the reset
beyond the bare game's. What is left is the step's bookkeeping.

Prints the figures and writes ``bench/results/textarena_parts.json``.

Usage: ``python bench/textarena_parts.py [ENV_ID ...]``
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
import timeit
from collections.abc import Callable

import envhub
from envhub.core import TextEnv

DEFAULT_IDS = ("textarena/TowerOfHanoi-hard-v0", "textarena/GuessTheNumber-hardcore-v0")
RESULTS = pathlib.Path(__file__).parent / "results" / "textarena_parts.json"


def _best(run: Callable[[], None], repeat: int = 9) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _timed(stmt: str, namespace: dict, number: int = 5000) -> float:
    """Microseconds per execution of ``stmt``, best of 7."""
    return min(timeit.repeat(stmt, globals=namespace, number=number, repeat=7)) / number * 1e6


def breakdown(env_id: str, steps: int = 2000) -> dict[str, float]:
    """Print and return the adapter's and the bare library's time per step (us) and the adapter's parts."""
    env = envhub.make(env_id)
    env.max_turns = None
    games, total = [], 0
    while total < steps:
        env.reset(seed=len(games))
        moves = []
        while not env.game_over():
            moves.append(env.expert_action())
            env.step(moves[-1])
        games.append((len(games), env.game_seed, moves))
        total += len(moves)

    def adapter() -> None:
        for seed, _, moves in games:
            env.reset(seed=seed)
            for move in moves:
                env.step(move)

    def bare(play: bool = True) -> None:
        for _, game_seed, moves in games:
            game = env._make_game()
            game.reset(num_players=1, seed=game_seed)
            for move in moves if play else ():
                game.step(move)
                game.get_observation()

    def resets() -> None:
        for seed, _, _ in games:
            env.reset(seed=seed)

    per_step = 1e6 / total
    adapter_us, bare_us = _best(adapter) * per_step, _best(bare) * per_step
    reset_us = (_best(resets) - _best(lambda: bare(play=False))) * per_step

    parts: dict[str, list[float]] = {"state key": [], "random swap and stdout": [], "legal listing and match": [], "observation text": []}
    for seed, _, moves in games[:5]:
        env.reset(seed=seed)
        for move in moves[: len(moves) // 2]:
            env.step(move)
        move = moves[len(moves) // 2]
        namespace = {"env": env, "TextEnv": TextEnv, "move": move}
        parts["state key"].append(_timed("env._compute_key()", namespace))
        parts["random swap and stdout"].append(_timed("env._in_game(len, '')", namespace) - _timed("len('')", namespace))
        parts["legal listing and match"].append(_timed("TextEnv.parse_action(env, move)", namespace))
        state = env.game.state
        env._in_game(env.game.step, move)  # the messages one move leaves, read as _take_text reads them
        namespace.update(state=state, messages=list(state.observations[0]))
        refill = "state.observations[0] = list(messages)"
        parts["observation text"].append(_timed(f"{refill}; env._take_text(0)", namespace) - _timed(refill, namespace))

    rows = {name: sum(values) / len(values) for name, values in parts.items()}
    key_us = rows["state key"]
    rows["state key"] = key_us * (total + len(games)) / total  # one per step and one per reset
    rows["reset beyond the bare game's, amortised"] = reset_us - key_us * len(games) / total
    print(f"{env_id}: {total} steps in {len(games)} games; us a step: adapter {adapter_us:.2f}, bare {bare_us:.2f} "
          f"({adapter_us / bare_us:.2f}x)")
    for name, us in rows.items():
        print(f"  {us:5.2f} us  {name} ({us / bare_us:.2f}x a bare step)")
    rest = adapter_us - bare_us - sum(rows.values())
    print(f"  {rest:5.2f} us  the rest: the step's bookkeeping ({rest / bare_us:.2f}x a bare step)", flush=True)
    return {"adapter": adapter_us, "bare": bare_us, **rows, "the rest": rest}


def main() -> None:
    results = {env_id: breakdown(env_id) for env_id in sys.argv[1:] or DEFAULT_IDS}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
