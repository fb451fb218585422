"""Text analysis as Anserini's default English analyzer does it, with no Java.

The steps, in Lucene's order: StandardTokenizer (UAX#29 word boundaries), English possessive
removal, lower-casing, Lucene's 33 English stopwords, Porter stemming (:mod:`porter`).

The tokenizer is a regular expression over the UAX#29 character classes that matter for this
catalogue: runs of letters and digits (``10x50``), joined through ``.``, ``'`` and ``’`` between
letters (``d.o.n``, ``men's``) and through ``.``, ``,``, ``;``, ``'`` between digits (``12.5``,
``1,000``), ``_`` joining anything; hyphens, slashes and other punctuation split. CJK ideographs
and hiragana are one token per character, katakana runs one token, emoji one token each, as
Lucene's StandardTokenizer emits them. Tokens longer than 255 characters are dropped
(Lucene splits them; no product text has one).
"""

from __future__ import annotations

import functools
import re

from envhub_webshop.porter import stem

#: Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)

MAX_TOKEN_LENGTH = 255

_IDEO = "\u3005\u3007\u3021-\u3029\u3038-\u303b\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_HIRAGANA = "\u3041-\u309f"
_KATAKANA = "\u30a0-\u30ff\u31f0-\u31ff\u32d0-\u32fe\u3300-\u3357\uff66-\uff9f"
_EMOJI = "\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9\u21aa\u231a\u231b\u2328\u23cf\u23e9-\u23f3\u23f8-\u23fa\u24c2\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe\u2600-\u27bf\u2934\u2935\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55\u3030\u303d\u3297\u3299\U0001f000-\U0001faff"
_EXTEND = "\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u0610-\u061a\u064b-\u065f\u0900-\u0903\u093a-\u094f\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u200c\u200d\u00ad\ufe00-\ufe0f\U0001f3fb-\U0001f3ff"
_NOT_WORD = f"_{_IDEO}{_HIRAGANA}{_KATAKANA}"
_ALNUM = rf"[^\W{_NOT_WORD}]"  # letters and digits, less the scripts tokenised per character
_WORD_CHAR = rf"(?:[^\W{_NOT_WORD[1:]}]|[{_EXTEND}])"  # the same plus "_" and combining marks
_LETTER = r"[^\W\d_]"
_MID_LETTER = ":\u00b7\u0387\u05f4\u2027\ufe13\ufe55\uff1a"
_MID_NUM = ",;\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54\uff0c\uff1b"
_MID_NUM_LET = ".'\u2018\u2019\u2024\ufe52\uff07\uff0e"
_JOIN = rf"(?:(?<={_LETTER})[{_MID_LETTER}{_MID_NUM_LET}](?={_LETTER})|(?<=\d)[{_MID_NUM}{_MID_NUM_LET}](?=\d))"

TOKEN_RE = re.compile(
    rf"{_ALNUM}{_WORD_CHAR}*(?:{_JOIN}{_WORD_CHAR}+)*"
    rf"|[{_KATAKANA}]+"
    rf"|[{_IDEO}{_HIRAGANA}][{_EXTEND}]*"
    rf"|[{_EMOJI}][{_EXTEND}]*"
)
#: The same rules for ASCII text, several times faster (most product text is ASCII).
ASCII_TOKEN_RE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9_]*(?:(?:(?<=[A-Za-z])[.':](?=[A-Za-z])|(?<=[0-9])[.,;'](?=[0-9]))[A-Za-z0-9_]+)*"
)

_POSSESSIVE = re.compile("['\u2019\uff07][sS]$")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into StandardTokenizer tokens (case preserved)."""
    pattern = ASCII_TOKEN_RE if text.isascii() else TOKEN_RE
    return [t for t in pattern.findall(text) if len(t) <= MAX_TOKEN_LENGTH]


@functools.lru_cache(maxsize=1 << 18)
def normalize_token(token: str) -> str | None:
    """Possessive, lower-case, stopword and Porter steps for one token; None for a stopword."""
    token = _POSSESSIVE.sub("", token).lower()
    if not token or token in STOPWORDS:
        return None
    return stem(token)


def analyze(text: str) -> list[str]:
    """Return the index terms of ``text``, in order, repeated as often as they occur."""
    terms = []
    for token in tokenize(text):
        term = normalize_token(token)
        if term is not None:
            terms.append(term)
    return terms
