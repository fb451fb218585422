"""What a model plays on ALFWorld, command by command, beside the search expert.

A success rate of 0% says nothing of what a model learnt. This reads the JSON lines of
``envhub run alfworld/ALFWorldGenerated-v0 --policy MODEL --json`` and replays each episode in the
search expert's env (``expert="search"``): at every turn, the expert's command in that state beside
the model's, counted by what the expert does (``go`` to search on, ``go`` where its plan goes,
``open``, ``take``...). It also counts the model's invalid commands that repeat its previous one
(a policy stuck on a command the env refused), and prints each episode's first disagreement.
Writes ``bench/results/alfworld_replies.json``.

    envhub run alfworld/ALFWorldGenerated-v0 --policy OUT/final --seed 500000000 --episodes 64 \\
        --max-turns 40 --env-kwarg expert=search --json > runs.jsonl
    python bench/alfworld_replies.py runs.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

from envhub_alfworld.env import ALFWorldEnv

RESULTS = pathlib.Path(__file__).parent / "results" / "alfworld_replies.json"


def expert_kind(env: ALFWorldEnv, command: str | None) -> str:
    """The expert's command as a kind: its verb, and for ``go`` whether it follows the plan or searches."""
    verb = (command or "none").split()[0]
    if verb != "go":
        return verb
    plan = env.plan()
    return "go (plan)" if plan and plan[0] == command else "go (search)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=pathlib.Path, help="JSON lines of `envhub run ... --json`")
    parser.add_argument("--first-errors", type=int, default=8, help="episodes whose first disagreement is printed")
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()

    env = ALFWorldEnv(expert="search")
    agree, total = collections.Counter(), collections.Counter()
    episodes = wins = commands = invalid = repeats = 0
    firsts = []
    for line in args.runs.read_text().splitlines():
        record = json.loads(line)
        if "transcript" not in record:
            continue
        episodes += 1
        wins += bool(record["success"])
        env.reset(seed=record["seed"])
        previous, disagreed = None, False
        for turn in record["transcript"][1:]:
            wanted, played = env.expert_action(), turn["action"]
            kind = expert_kind(env, wanted)
            total[kind] += 1
            agree[kind] += played == wanted
            commands += 1
            if not turn["info"].get("action_is_valid", True):
                invalid += 1
                repeats += played == previous
            if played != wanted and not disagreed:
                disagreed = True
                firsts.append({"seed": record["seed"], "observation": env.render_text()[:90].replace("\n", " "), "expert": wanted, "model": played})
            previous = played
            _, _, terminated, truncated, _ = env.step(played)
            if terminated or truncated:
                break
    env.close()

    print(f"{episodes} episodes, {wins} won; {commands} commands, {invalid} invalid ({invalid / max(commands, 1):.0%}), {repeats} of them repeating the one before")
    print(f"{'the expert':<14} the model played the same")
    for kind in sorted(total, key=total.get, reverse=True):
        print(f"{kind:<14} {agree[kind]} / {total[kind]}")
    for first in firsts[: args.first_errors]:
        print(f"seed {first['seed']}: {first['observation']!r}: expert {first['expert']!r}, model {first['model']!r}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({
        "episodes": episodes, "won": wins, "commands": commands, "invalid": invalid, "invalid_repeating_the_previous": repeats,
        "agreement": {kind: {"same": agree[kind], "of": total[kind]} for kind in total}, "first_disagreements": firsts,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
