"""BM25 search over product documents, scored as Lucene 8 / Anserini score it (SPEC section 5).

``score(d) = sum over query terms of weight - weight / (1 + tf * inv_norm[d])`` in float32, with
``weight = count_in_query * idf``, ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
``inv_norm[d] = 1 / (k1 * (1 - b + b * dl'[d] / avgdl))``, where ``dl'`` is the document length
quantised the way Lucene stores norms. That is ``tf / (tf + norm)`` rewritten the way Lucene
computes it, so float32 results agree with Lucene's to the last bit up to summation order.
Documents that match no query term are not returned; ties go to the smaller document id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from envhub_webshop.analysis import analyze, normalize_token, tokenize

K1 = 0.9
B = 0.4
TOP_K = 50


def quantize_length(length: int) -> int:
    """Return the document length Lucene's ``SmallFloat.intToByte4`` norm decodes to.

    Lengths below 24 are exact; above, the excess over 24 keeps its 4 most significant bits.
    """
    if length < 24:
        return length
    excess = length - 24
    bits = excess.bit_length()
    if bits < 4:
        return length
    shift = bits - 4
    return 24 + ((excess >> shift) << shift)


class BM25Index:
    """An inverted index of documents with Lucene's BM25 scoring.

    Args:
        doc_ids: one id per document (asins); ties in score are broken by ascending id.
        texts: the documents' text, analysed with :func:`analysis.analyze`.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.
    """

    def __init__(self, doc_ids: Sequence[str], texts: Iterable[str], k1: float = K1, b: float = B):
        self.doc_ids = list(doc_ids)
        self.k1, self.b = k1, b
        vocab: dict[str, int] = {}
        raw_terms: dict[str, int] = {}
        doc_col: list[np.ndarray] = []
        lengths = np.zeros(len(self.doc_ids), dtype=np.int64)
        for d, text in enumerate(texts):
            ids = []
            for token in tokenize(text):
                tid = raw_terms.get(token)
                if tid is None:
                    term = normalize_token(token)
                    tid = -1 if term is None else vocab.setdefault(term, len(vocab))
                    raw_terms[token] = tid
                if tid >= 0:
                    ids.append(tid)
            lengths[d] = len(ids)
            doc_col.append(np.asarray(ids, dtype=np.int32))
        if len(doc_col) != len(self.doc_ids):
            raise ValueError(f"{len(self.doc_ids)} document ids but {len(doc_col)} texts")
        self.vocab = vocab
        n_docs = len(self.doc_ids)
        # (term, doc) pairs -> term frequencies, grouped by term: the postings.
        docs = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
        terms = np.concatenate(doc_col).astype(np.int64) if doc_col else np.zeros(0, dtype=np.int64)
        del doc_col
        keys, tf = np.unique(terms * max(n_docs, 1) + docs, return_counts=True)
        del docs, terms
        post_terms, post_docs = np.divmod(keys, max(n_docs, 1))
        self._post_docs = post_docs.astype(np.int32)
        self._post_tf = tf.astype(np.float32)
        self._offsets = np.searchsorted(post_terms, np.arange(len(vocab) + 1))
        df = np.diff(self._offsets)
        self.idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
        avgdl = np.float32(lengths.sum() / n_docs) if n_docs else np.float32(1.0)
        quantized = np.array([quantize_length(int(n)) for n in lengths], dtype=np.float32)
        norm = np.float32(k1) * (np.float32(1 - b) + np.float32(b) * quantized / avgdl)
        self._inv_norm = (np.float32(1.0) / norm).astype(np.float32)
        # Sorting by (-score, id) needs each document's rank in id order.
        self._id_rank = np.argsort(np.argsort(np.array(self.doc_ids, dtype=object), kind="stable"), kind="stable")

    def __len__(self) -> int:
        return len(self.doc_ids)

    def scores(self, query: str) -> np.ndarray:
        """Return the float32 BM25 score of every document for ``query`` (0 where nothing matches)."""
        counts: dict[int, int] = {}
        for term in analyze(query):
            tid = self.vocab.get(term)
            if tid is not None:
                counts[tid] = counts.get(tid, 0) + 1
        total = np.zeros(len(self.doc_ids), dtype=np.float32)
        for tid, count in counts.items():
            lo, hi = self._offsets[tid], self._offsets[tid + 1]
            docs = self._post_docs[lo:hi]
            weight = np.float32(count) * self.idf[tid]
            total[docs] += weight - weight / (np.float32(1.0) + self._post_tf[lo:hi] * self._inv_norm[docs])
        return total

    def search(self, query: str, k: int = TOP_K) -> list[tuple[str, float]]:
        """Return up to ``k`` ``(doc_id, score)`` hits, best first; only documents that match."""
        scores = self.scores(query)
        matched = np.flatnonzero(scores > 0)
        if len(matched) > k:
            # Keep every document tied with the k-th best so the id tie-break sees them all.
            kth = np.partition(scores[matched], len(matched) - k)[len(matched) - k]
            matched = matched[scores[matched] >= kth]
        order = np.lexsort((self._id_rank[matched], -scores[matched]))[:k]
        return [(self.doc_ids[i], float(scores[i])) for i in matched[order]]
