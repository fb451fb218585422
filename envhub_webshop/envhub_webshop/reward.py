"""WebShop's purchase reward (SPEC section 3): type, attributes, options, price.

The fuzzy matcher is thefuzz 0.19's ``token_set_ratio``: its preprocessing (``str()``, drop
U+0080-U+00FF, ``\\W`` to spaces, lower-case, strip) done here, the scoring by ``rapidfuzz``
(Indel ratio, the same ``> 85`` decisions as 0.19's difflib on every pair of the data).

Title nouns come from spaCy's ``en_core_web_sm`` when it is installed, as upstream; otherwise
from :class:`BuiltinNounTagger`, a deterministic stand-in that needs no download. Which one ran
is reported as ``title_tagger`` in the reward details and in the environment's info.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from rapidfuzz import fuzz as _rfuzz

from envhub_webshop.catalog import Product
from envhub_webshop.goals import Goal

MATCH_THRESHOLD = 85

#: upstream's colour list, in its order: the first one found wins.
COLORS = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown "
    "burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac "
    "copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite "
    "grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light "
    "lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural navy "
    "nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire seashell "
    "silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut "
    "wheat white wine yellow"
).split()

_LATIN1 = {c: None for c in range(0x80, 0x100)}
_NON_WORD = re.compile(r"(?u)\W")


@functools.lru_cache(maxsize=1 << 16)
def _process_str(text: str) -> str:
    return _NON_WORD.sub(" ", text.translate(_LATIN1)).lower().strip()


def fuzz_preprocess(value: Any) -> str:
    """thefuzz 0.19's ``token_set_ratio`` preprocessing of ``value`` (tuples become their repr)."""
    return _process_str(str(value))


def fuzz_score(a: Any, b: Any) -> float:
    """``token_set_ratio(a, b)``: 0 when either side is empty after preprocessing."""
    pa, pb = fuzz_preprocess(a), fuzz_preprocess(b)
    if not pa or not pb:
        return 0.0
    return _rfuzz.token_set_ratio(pa, pb)


def fuzz_match(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` match: token set ratio above 85."""
    return fuzz_score(a, b) > MATCH_THRESHOLD


def normalize_color(value: Any) -> Any:
    """Return the first colour of :data:`COLORS` that is ``in value``, else ``value``.

    For a string ``in`` is a substring test (``rectangular`` becomes ``tan``); for a
    ``(name, value)`` tuple it is element equality, so a pair only becomes a colour when one side
    *is* a colour. That asymmetry is upstream's, and makes 458 goals unwinnable.
    """
    for color in COLORS:
        if color in value:
            return color
    return value


# ---------------------------------------------------------------------- title nouns


class BuiltinNounTagger:
    """Nouns of a product title without a language model.

    A title is split into words the way spaCy splits it (whitespace, then punctuation at the
    edges and around hyphens); a word counts as a noun when it has a letter, is longer than one
    character, and is not a function word (articles, prepositions, conjunctions, pronouns,
    auxiliaries) nor a possessive ending. Product titles are noun phrases, so this keeps what
    spaCy marks NOUN/PROPN and drops what it marks ADP/DET/CCONJ/PRON/NUM/PUNCT.
    """

    name = "builtin"

    FUNCTION_WORDS = frozenset(
        "a an the and or nor but for with without of in on at to from by as into onto over under "
        "up down off out per via vs than then so if is are be was were been am it its it's this that "
        "these those your you my our their his her we they i me us he she them not no very too all "
        "any each every both more most plus also only just can will".split()
    )
    _WORD = re.compile(r"[^\W\d_](?:[\w']*\w)?|\d[\w.']*")

    def __call__(self, title: str) -> list[str]:
        """Return the lower-cased nouns of ``title``, duplicates kept, in order."""
        nouns = []
        for word in self._WORD.findall(title):
            lower = word.lower()
            if lower.endswith(("'s", "’s")):
                lower = lower[:-2]
            if len(lower) < 2 or not any(ch.isalpha() for ch in lower) or lower in self.FUNCTION_WORDS:
                continue
            nouns.append(lower)
        return nouns


class SpacyNounTagger:
    """Upstream's title nouns: spaCy ``en_core_web_sm`` tokens tagged NOUN or PROPN."""

    def __init__(self, model: str = "en_core_web_sm"):
        import spacy  # optional dependency: only when a model is installed

        self.nlp = spacy.load(model)
        self.name = f"spacy:{model}"

    def __call__(self, title: str) -> list[str]:
        """Return the lower-cased NOUN/PROPN tokens of ``title``."""
        return [t.text.lower() for t in self.nlp(title) if t.pos_ in ("PNOUN", "NOUN", "PROPN")]


@functools.lru_cache(maxsize=None)
def get_tagger(kind: str = "auto") -> Callable[[str], list[str]]:
    """Return the title-noun tagger: ``"spacy"``, ``"builtin"`` or ``"auto"`` (spaCy if it loads).

    Raises:
        ImportError, OSError: when ``"spacy"`` is asked for and spaCy or its model is missing.
    """
    if kind == "builtin":
        return BuiltinNounTagger()
    if kind == "spacy":
        return SpacyNounTagger()
    if kind != "auto":
        raise ValueError(f"title_tagger must be 'auto', 'spacy' or 'builtin', got {kind!r}")
    try:
        return SpacyNounTagger()
    except (ImportError, OSError):
        return BuiltinNounTagger()


class TitleNouns:
    """A tagger with a cache: each title is tagged once per process."""

    def __init__(self, tagger: Callable[[str], list[str]]):
        self.tagger = tagger
        self.name: str = getattr(tagger, "name", type(tagger).__name__)
        self._cache: dict[str, list[str]] = {}

    def __call__(self, title: str) -> list[str]:
        """Return the nouns of ``title``."""
        found = self._cache.get(title)
        if found is None:
            found = self._cache[title] = self.tagger(title)
        return found


# ---------------------------------------------------------------------- the parts of the reward


def type_reward(purchased: Product, goal: Goal, nouns: Callable[[str], list[str]]) -> dict[str, Any]:
    """``r_type`` and its inputs (SPEC 3.1)."""
    query_match = purchased.query == goal.query
    purchased_cats = {x.strip() for x in purchased.product_category.split("›")}
    goal_cats = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(purchased_cats & goal_cats) >= 2
    purchased_nouns, goal_nouns = nouns(purchased.title), nouns(goal.name)
    title_score = 0.2 if not goal_nouns else len(set(purchased_nouns) & set(goal_nouns)) / len(goal_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_matches(purchased: Product, goal_attributes: Iterable[str]) -> int:
    """How many goal attributes the product has (SPEC 3.2): fuzzy, then substring of its texts."""
    title, bullets, description = None, None, None
    matches = 0
    for g in goal_attributes:
        if any(fuzz_match(p, g) for p in purchased.attributes):
            matches += 1
            continue
        if title is None:
            title = purchased.title.lower()
            bullets = " ".join(purchased.bullet_points).lower()
            description = purchased.description.lower()
        if g in title or g in bullets or g in description:
            matches += 1
    return matches


def option_matches(selected: Iterable[str], goal_options: dict[str, str], upstream_quirks: bool = True) -> int:
    """How many goal options the selected values match (SPEC 3.3).

    With ``upstream_quirks`` the goal side is normalised as ``(name, value)`` pairs, as upstream
    does; without, as values, like the purchased side, so both sides normalise the same way.
    """
    purchased = [normalize_color(v) for v in selected]
    if upstream_quirks:
        goal_items = [normalize_color(t) for t in goal_options.items()]
    else:
        goal_items = [normalize_color(v) for v in goal_options.values()]
    return sum(1 for g in goal_items if any(fuzz_match(p, g) for p in purchased))


def get_reward(
    purchased: Product,
    goal: Goal,
    price: float,
    options: dict[str, str],
    nouns: Callable[[str], list[str]],
    upstream_quirks: bool = True,
) -> tuple[float, dict[str, Any]]:
    """Score a purchase (SPEC 3.4).

    Args:
        purchased: the product bought.
        goal: the task.
        price: the product's sampled price.
        options: the options selected when buying (name -> value), possibly incomplete.
        nouns: the title-noun tagger.
        upstream_quirks: keep upstream's colour normalisation of goal options.

    Returns:
        ``(total, details)``; details carry upstream's verbose keys plus ``title_tagger``.
    """
    details = type_reward(purchased, goal, nouns)
    n_attr = len(goal.attributes)
    attr_hits = attribute_matches(purchased, goal.attributes)
    n_opt = len(goal.goal_options)
    opt_hits = option_matches(options.values(), goal.goal_options, upstream_quirks) if n_opt else 0
    r_price = price <= goal.price_upper if goal.price_upper > 0 else None
    denom = n_attr + n_opt + 1
    total = (attr_hits + opt_hits + bool(r_price)) / denom * details["r_type"]
    details["r_att"] = attr_hits / n_attr if n_attr else None
    details["w_att"] = n_attr / denom
    if n_opt:
        details["r_option"] = opt_hits / n_opt
        details["w_option"] = n_opt / denom
    details["r_price"] = r_price
    details["w_price"] = 1 / denom
    details["title_tagger"] = getattr(nouns, "name", type(nouns).__name__)
    return total, details
