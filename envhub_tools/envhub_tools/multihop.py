"""``tools/MultiHopQA-v0``: answer a multi-hop question by searching a generated knowledge base.

Every seed draws a new fictional world (:mod:`envhub_tools.knowledge`), writes it out as one short
document per entity, indexes the documents with BM25 (:mod:`envhub_tools.bm25`) and asks a
question that follows 2 to 4 relations. The agent calls ``search(query)`` (the top ``top_k``
documents) as often as the turn limit allows, then ``submit(answer)``. The reward is the exact
match of the submitted answer (SQuAD's normalisation); its token F1 is reported in ``info``.

The state an agent acts in is the question and the set of documents it has been shown, so
``state_key`` is those two; the expert follows the question's hop chain, searching for the next
entity whose document it has not yet seen, and submits once it has seen them all.
"""

from __future__ import annotations

from typing import Any

from envhub.core import ToolEnv, stable_key
from envhub.tools import ToolResult, tool

from envhub_tools.bm25 import BM25Index
from envhub_tools.knowledge import Entity, Question, exact_match, f1_score, generate_world, make_question


class MultiHopQAEnv(ToolEnv):
    """Multi-hop question answering with a search tool over a knowledge base drawn from the seed.

    Args:
        min_hops: the fewest relations a question follows (at least 1).
        max_hops: the most (each episode draws the count uniformly between the two).
        corpus_size: how many documents (entities) the world has (at least 12).
        top_k: how many documents one search returns.
        render_mode: ``"ansi"`` or None.
    """

    final_tools = ("submit",)
    max_argument_chars = 300

    def __init__(self, min_hops: int = 2, max_hops: int = 4, corpus_size: int = 60, top_k: int = 3, render_mode: str | None = None):
        super().__init__(render_mode)
        if not 1 <= min_hops <= max_hops <= 6:
            raise ValueError(f"need 1 <= min_hops <= max_hops <= 6, got min_hops={min_hops}, max_hops={max_hops}")
        if corpus_size < 12:
            raise ValueError(f"corpus_size must be at least 12 documents, got {corpus_size}")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        self.min_hops, self.max_hops, self.corpus_size, self.top_k = min_hops, max_hops, corpus_size, top_k
        self.entities: list[Entity] = []
        self.question: Question | None = None
        self.index: BM25Index | None = None
        self.seen: set[int] = set()
        self.submitted: str | None = None
        self.instructions = (
            "Answer a question about a fictional world of people, organisations, cities and regions. "
            f"Its facts are written in {corpus_size} short documents, one per person, organisation, city or region; "
            "nothing you already know about the real world applies. The question follows a chain of "
            f"{min_hops if min_hops == max_hops else f'{min_hops} to {max_hops}'} facts, each stated in one document.\n"
            f"Tools: search(query) returns the {top_k} documents that best match the query (search for a name to get its "
            "document); submit(answer) ends the episode with your answer, just the name asked for. "
            "The reward is 1 when the answer matches exactly."
        )

    # ------------------------------------------------------------------ tools

    @tool
    def search(self, query: str) -> str:
        """Search the knowledge base and return the best-matching documents.

        Args:
            query: words to look for, such as a name.
        """
        hits = self.index.search(query, self.top_k) if self.index is not None else []
        if not hits:
            return f"No document matches {query!r}."
        self.seen.update(hits)
        lines = [f"[{rank}] {self.entities[i].name}: {self.entities[i].document}" for rank, i in enumerate(hits, 1)]
        return "\n".join(lines)

    @tool
    def submit(self, answer: str) -> ToolResult:
        """Submit the final answer; this ends the episode.

        Args:
            answer: the name the question asks for.
        """
        gold = self.gold_answer
        self.submitted = answer
        correct = exact_match(answer, gold)
        f1 = f1_score(answer, gold)
        verdict = "correct" if correct else f"not correct; the answer was {gold}"
        return ToolResult(f"You answered {answer!r}: {verdict}.", float(correct), True, {"exact_match": correct, "f1": f1, "gold_answer": gold})

    # ------------------------------------------------------------------ the env

    @property
    def gold_answer(self) -> str:
        """The name the question asks for."""
        return self.entities[self.question.chain[-1]].name if self.question else ""

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.entities = generate_world(self.np_random, self.corpus_size)
        hops = int(self.np_random.integers(self.min_hops, self.max_hops + 1))
        self.question = make_question(self.np_random, self.entities, hops)
        self.index = BM25Index([f"{e.name}. {e.document}" for e in self.entities])
        self.seen = set()
        self.submitted = None
        return f"Question: {self.question.text}", {"hops": hops}

    def state_key(self) -> str:
        question = self.question.text if self.question else ""
        digest = stable_key(question, 16)
        seen = ",".join(str(i) for i in sorted(self.seen))
        done = "" if self.submitted is None else "|submitted=" + stable_key(self.submitted, 8)
        return f"q={digest}|seen={seen}{done}"

    def is_success(self) -> bool:
        return self.submitted is not None and exact_match(self.submitted, self.gold_answer)

    def render_text(self) -> str:
        if self.question is None:
            return "(no episode)"
        lines = [f"Question: {self.question.text}", f"Documents seen: {', '.join(self.entities[i].name for i in sorted(self.seen)) or 'none'}"]
        if self.submitted is not None:
            lines.append(f"Submitted: {self.submitted} ({'correct' if self.is_success() else 'wrong'}; answer {self.gold_answer})")
        return "\n".join(lines)

    def expert_action(self) -> str | None:
        """Search for the first entity of the hop chain whose document has not been seen; submit
        the answer once every document of the chain has been."""
        if self.question is None or self.submitted is not None:
            return None
        for entity in self.question.chain[:-1]:
            if entity not in self.seen:
                return self.call_action("search", query=self.entities[entity].name)
        return self.call_action("submit", answer=self.gold_answer)
