"""Benchmark the TextArena and TextWorld plugins.

- adapter overhead: seconds per step through envhub divided by seconds per step of the wrapped
  library on the same move sequence, measured in the same run (target: at most 1.5x);
- TextWorld generation and compile time per game, in a fresh cache (the first game of a batch
  also pays for parsing TextWorld's grammars once).

Prints the figures and writes ``bench/results/textgames.json``.

Usage: ``python bench/textgames.py [--steps N] [--games N]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import tempfile
import time

import envhub

RESULTS = pathlib.Path(__file__).parent / "results" / "textgames.json"


def textarena_overhead(env_id: str, steps: int) -> dict[str, float]:
    """The expert's moves of whole games, replayed on the bare TextArena env and through envhub."""
    env = envhub.make(env_id)
    env.max_turns = None
    games, moves = [], []
    seed = 0
    while len(moves) < steps:
        env.reset(seed=seed)
        game = []
        while not env.game_over():
            game.append(env.expert_action())
            env.step(game[-1])
        games.append((seed, env.game_seed, game))
        moves += game
        seed += 1

    start = time.perf_counter()
    for seed, _, game in games:
        env.reset(seed=seed)
        for move in game:
            env.step(move)
    adapter = time.perf_counter() - start

    start = time.perf_counter()
    for _, game_seed, game in games:
        bare = env._make_game()
        bare.reset(num_players=1, seed=game_seed)
        for move in game:
            bare.step(move)
            bare.get_observation()
    library = time.perf_counter() - start
    return {"steps": len(moves), "adapter_steps_per_s": len(moves) / adapter, "library_steps_per_s": len(moves) / library,
            "overhead": adapter / library}


def textworld_overhead(env_id: str, steps: int) -> dict[str, float]:
    """The walkthrough of the pool's games, replayed on TextWorld's env and through envhub."""
    import textworld

    from envhub_textworld.generator import story_path

    env = envhub.make(env_id)
    env.max_turns = None
    episodes = []
    total = 0
    seed = 0
    while total < steps:
        env.reset(seed=seed)
        commands = []
        while env.expert_action() is not None:
            commands.append(env.expert_action())
            env.step(commands[-1])
        episodes.append((seed, env.game_seed, commands))
        total += len(commands)
        seed += 1

    start = time.perf_counter()
    for seed, _, commands in episodes:
        env.reset(seed=seed)
        for command in commands:
            env.step(command)
    adapter = time.perf_counter() - start

    bare = {game_seed: textworld.start(str(story_path(env.challenge, env.settings, game_seed)), request_infos=env._infos) for _, game_seed, _ in episodes}
    start = time.perf_counter()
    for _, game_seed, commands in episodes:
        bare[game_seed].reset()
        for command in commands:
            bare[game_seed].step(command)
    library = time.perf_counter() - start
    return {"steps": total, "adapter_steps_per_s": total / adapter, "library_steps_per_s": total / library,
            "overhead": adapter / library}


def generation_times(games: int) -> dict[str, list[dict[str, float]]]:
    """Generate ``games`` games per registered setting into a throwaway cache."""
    from envhub_textworld.generator import generate
    from envhub_textworld.plugin import VARIANTS

    figures = {}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["ENVHUB_TEXTWORLD_CACHE"] = cache
        for name, challenge, settings, _, _ in VARIANTS:
            start = time.perf_counter()
            timings = generate(challenge, settings, list(range(1000, 1000 + games)))
            figures[name] = {"per_game": list(timings.values()), "wall_s": time.perf_counter() - start}
            print(f"{name}: {games} games in {figures[name]['wall_s']:.1f} s "
                  + ", ".join(f"gen {t['generate_s']:.1f} s + compile {t['compile_s']:.1f} s" for t in timings.values()), flush=True)
        del os.environ["ENVHUB_TEXTWORLD_CACHE"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--games", type=int, default=3, help="games per setting to generate; 0 keeps the last run's figures")
    args = parser.parse_args()
    random.seed(0)
    results: dict[str, object] = {"overhead": {}}
    for env_id in ("textarena/TowerOfHanoi-hard-v0", "textarena/GuessTheNumber-hardcore-v0"):
        results["overhead"][env_id] = figures = textarena_overhead(env_id, args.steps)
        print(f"{env_id}: {figures['adapter_steps_per_s']:.0f} steps/s through envhub, "
              f"{figures['library_steps_per_s']:.0f} bare: {figures['overhead']:.2f}x", flush=True)
    for env_id in ("textworld/Cooking-level1-v0", "textworld/Simple-v0"):
        results["overhead"][env_id] = figures = textworld_overhead(env_id, args.steps // 10)
        print(f"{env_id}: {figures['adapter_steps_per_s']:.0f} steps/s through envhub, "
              f"{figures['library_steps_per_s']:.0f} bare: {figures['overhead']:.2f}x", flush=True)
    if args.games:
        results["textworld_generation"] = generation_times(args.games)
    elif RESULTS.exists():  # keep the generation figures of an earlier run
        results["textworld_generation"] = json.loads(RESULTS.read_text()).get("textworld_generation")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
