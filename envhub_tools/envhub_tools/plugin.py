"""Registers the tool-calling environments with envhub."""

from envhub import hookimpl

MULTIHOP = "envhub_tools.multihop:MultiHopQAEnv"
COUNTDOWN = "envhub_tools.countdown:CountdownEnv"

#: (name, entry point, kwargs, turn limit, description).
VARIANTS = (
    ("MultiHopQA-v0", MULTIHOP, {"min_hops": 2, "max_hops": 4, "corpus_size": 60}, 10,
     "2-4 hop questions over 60 generated documents; search(query) (BM25 top 3) and submit(answer); exact match"),
    ("MultiHopQA2Hop-v0", MULTIHOP, {"min_hops": 2, "max_hops": 2, "corpus_size": 60}, 6,
     "2-hop questions over 60 generated documents, 6 turns"),
    ("MultiHopQA4Hop-v0", MULTIHOP, {"min_hops": 4, "max_hops": 4, "corpus_size": 60}, 10,
     "4-hop questions over 60 generated documents, 10 turns"),
    ("MultiHopQALarge-v0", MULTIHOP, {"min_hops": 2, "max_hops": 4, "corpus_size": 1000}, 10,
     "2-4 hop questions over 1000 generated documents (more distractors per search), 10 turns"),
    ("Countdown-v0", COUNTDOWN, {"min_numbers": 3, "max_numbers": 4, "max_number": 25, "max_target": 250}, 8,
     "reach a target from 3-4 numbers (each used once); calculate(expression) and submit(expression)"),
    ("Countdown3-v0", COUNTDOWN, {"min_numbers": 3, "max_numbers": 3, "max_number": 25, "max_target": 250}, 6,
     "Countdown with 3 numbers, 6 turns"),
    ("Countdown5-v0", COUNTDOWN, {"min_numbers": 5, "max_numbers": 5, "max_number": 50, "max_target": 999}, 10,
     "Countdown with 5 numbers up to 50 and targets up to 999, 10 turns"),
)


@hookimpl
def register_envs(register):
    for name, entry, kwargs, turns, description in VARIANTS:
        register(f"tools/{name}", entry, kwargs=kwargs, max_turns=turns, description=description)
