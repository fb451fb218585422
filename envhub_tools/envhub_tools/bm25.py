"""Okapi BM25 over a small corpus of short documents: the index behind MultiHopQA's ``search`` tool.

Pure Python over an inverted index (term -> postings), so a query costs time in the postings of
its terms, not in the corpus size. Ties are broken by document index, so rankings are the same in
every process.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_TOKEN = re.compile(r"[a-z0-9]+")
#: Words too common to rank by.
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were what which who whom with".split()
)


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words of ``text``, stop words removed."""
    return [word for word in _TOKEN.findall(text.lower()) if word not in STOPWORDS]


class BM25Index:
    """BM25 (Robertson and Zaragoza's Okapi weighting) over ``documents``.

    Args:
        documents: the texts to search.
        k1: term-frequency saturation.
        b: document-length normalisation.
    """

    def __init__(self, documents: Sequence[str], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.size = len(documents)
        lengths = []
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for index, text in enumerate(documents):
            counts = Counter(tokenize(text))
            lengths.append(sum(counts.values()))
            for term, count in counts.items():
                self.postings.setdefault(term, []).append((index, count))
        self.lengths = lengths
        self.mean_length = (sum(lengths) / len(lengths)) if lengths else 0.0
        self.idf = {
            term: math.log(1.0 + (self.size - len(posting) + 0.5) / (len(posting) + 0.5)) for term, posting in self.postings.items()
        }

    def scores(self, query: str) -> dict[int, float]:
        """Document index -> BM25 score, for every document that shares a term with ``query``."""
        scores: dict[int, float] = {}
        k1, b, mean = self.k1, self.b, self.mean_length or 1.0
        for term in set(tokenize(query)):
            posting = self.postings.get(term)
            if posting is None:
                continue
            idf = self.idf[term]
            for index, count in posting:
                norm = count + k1 * (1.0 - b + b * self.lengths[index] / mean)
                scores[index] = scores.get(index, 0.0) + idf * count * (k1 + 1.0) / norm
        return scores

    def search(self, query: str, k: int) -> list[int]:
        """The indices of the ``k`` best documents for ``query``, best first (ties: lower index first)."""
        scores = self.scores(query)
        return sorted(scores, key=lambda index: (-scores[index], index))[:k]
