"""The Porter stemmer as Lucene's ``PorterStemFilter`` runs it.

Lucene's ``PorterStemmer`` is a port of Martin Porter's reference C implementation, which differs
from the published algorithm in three places: words of one or two letters are left alone,
``-bli`` becomes ``-ble`` (the paper has ``-abli`` to ``-able``) and ``-logi`` becomes ``-log``.
Snowball's "porter" and NLTK's ``ORIGINAL_ALGORITHM`` follow the paper, so they stem ``us``,
``possibly`` and ``biology`` differently from Anserini's index; this module follows Lucene.
"""

from __future__ import annotations

_VOWELS = frozenset("aeiou")


class _Word:
    """One word being stemmed: the buffer ``b``, its end ``k`` and the suffix boundary ``j``."""

    __slots__ = ("b", "k", "j")

    def __init__(self, word: str):
        self.b = list(word)
        self.k = len(word) - 1
        self.j = 0

    def cons(self, i: int) -> bool:
        ch = self.b[i]
        if ch in _VOWELS:
            return False
        if ch == "y":
            return i == 0 or not self.cons(i - 1)
        return True

    def m(self) -> int:
        """The number of vowel-consonant sequences between 0 and ``j``."""
        n, i, j = 0, 0, self.j
        while True:
            if i > j:
                return n
            if not self.cons(i):
                break
            i += 1
        i += 1
        while True:
            while True:
                if i > j:
                    return n
                if self.cons(i):
                    break
                i += 1
            i += 1
            n += 1
            while True:
                if i > j:
                    return n
                if not self.cons(i):
                    break
                i += 1
            i += 1

    def vowel_in_stem(self) -> bool:
        return any(not self.cons(i) for i in range(self.j + 1))

    def doublec(self, j: int) -> bool:
        return j >= 1 and self.b[j] == self.b[j - 1] and self.cons(j)

    def cvc(self, i: int) -> bool:
        if i < 2 or not self.cons(i) or self.cons(i - 1) or not self.cons(i - 2):
            return False
        return self.b[i] not in "wxy"

    def ends(self, s: str) -> bool:
        length = len(s)
        if length > self.k + 1:
            return False
        if "".join(self.b[self.k - length + 1 : self.k + 1]) != s:
            return False
        self.j = self.k - length
        return True

    def setto(self, s: str) -> None:
        start = self.j + 1
        self.b[start : self.k + 1] = list(s)
        self.k = start + len(s) - 1

    def r(self, s: str) -> None:
        if self.m() > 0:
            self.setto(s)

    def step1(self) -> None:
        if self.b[self.k] == "s":
            if self.ends("sses"):
                self.k -= 2
            elif self.ends("ies"):
                self.setto("i")
            elif self.b[self.k - 1] != "s":
                self.k -= 1
        if self.ends("eed"):
            if self.m() > 0:
                self.k -= 1
        elif (self.ends("ed") or self.ends("ing")) and self.vowel_in_stem():
            self.k = self.j
            if self.ends("at"):
                self.setto("ate")
            elif self.ends("bl"):
                self.setto("ble")
            elif self.ends("iz"):
                self.setto("ize")
            elif self.doublec(self.k):
                self.k -= 1
                if self.b[self.k] in "lsz":
                    self.k += 1
            elif self.m() == 1 and self.cvc(self.k):
                self.setto("e")

    def step2(self) -> None:
        if self.ends("y") and self.vowel_in_stem():
            self.b[self.k] = "i"

    def step3(self) -> None:
        if self.k == 0:
            return
        for suffix, repl in _STEP3.get(self.b[self.k - 1], ()):
            if self.ends(suffix):
                self.r(repl)
                return

    def step4(self) -> None:
        for suffix, repl in _STEP4.get(self.b[self.k], ()):
            if self.ends(suffix):
                self.r(repl)
                return

    def step5(self) -> None:
        if self.k == 0:
            return
        for suffix in _STEP5.get(self.b[self.k - 1], ()):
            if self.ends(suffix):
                if suffix == "ion" and not (self.j >= 0 and self.b[self.j] in "st"):
                    return
                if self.m() > 1:
                    self.k = self.j
                return

    def step6(self) -> None:
        self.j = self.k
        if self.b[self.k] == "e":
            a = self.m()
            if a > 1 or (a == 1 and not self.cvc(self.k - 1)):
                self.k -= 1
        if self.b[self.k] == "l" and self.doublec(self.k) and self.m() > 1:
            self.k -= 1


_STEP3: dict[str, tuple[tuple[str, str], ...]] = {
    "a": (("ational", "ate"), ("tional", "tion")),
    "c": (("enci", "ence"), ("anci", "ance")),
    "e": (("izer", "ize"),),
    "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
    "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
    "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
    "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
    "g": (("logi", "log"),),
}
_STEP4: dict[str, tuple[tuple[str, str], ...]] = {
    "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
    "i": (("iciti", "ic"),),
    "l": (("ical", "ic"), ("ful", "")),
    "s": (("ness", ""),),
}
_STEP5: dict[str, tuple[str, ...]] = {
    "a": ("al",),
    "c": ("ance", "ence"),
    "e": ("er",),
    "i": ("ic",),
    "l": ("able", "ible"),
    "n": ("ant", "ement", "ment", "ent"),
    "o": ("ion", "ou"),
    "s": ("ism",),
    "t": ("ate", "iti"),
    "u": ("ous",),
    "v": ("ive",),
    "z": ("ize",),
}


def stem(word: str) -> str:
    """Return the Porter stem of a lower-case ``word`` exactly as Lucene computes it."""
    if len(word) <= 2:
        return word
    w = _Word(word)
    w.step1()
    if w.k > 0:
        w.step2()
        w.step3()
        w.step4()
        w.step5()
        w.step6()
    return "".join(w.b[: w.k + 1])
