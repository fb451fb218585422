"""A fictional world drawn from a seed, written out as short documents, and multi-hop questions over it.

People, organisations, cities and regions get invented names (syllables drawn from the random
generator, so no model has seen them in training) and functional relations: a person was born
in one city, works for one organisation and was mentored by one person; an organisation is
headquartered in one city and was founded by one person; a city lies in one region; a region has
one capital. A question follows a chain of 2 to 4 of these relations from a named entity, so its
answer is unique, and answering it needs one document per hop.
"""

from __future__ import annotations

import dataclasses
import re
import string

import numpy as np

ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st", "th", "sh", "tr")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou", "ia")
CODAS = ("", "", "n", "r", "l", "s", "k", "th", "m")
PROFESSIONS = ("painter", "engineer", "botanist", "cartographer", "violinist", "surgeon", "archivist", "glassblower", "astronomer", "weaver")
ORG_KINDS = (("Guild", "guild"), ("Institute", "research institute"), ("Company", "trading company"), ("Society", "learned society"),
             ("Foundry", "foundry"), ("Observatory", "observatory"))
CITY_SUFFIXES = ("ford", "ton", "vale", "mouth", "holm", "gard", "wick")
REGION_SUFFIXES = ("ia", "land", "mark", "aria")
KNOWN_FOR = ("its bridges", "its salt mines", "a spring festival", "its libraries", "river trade", "copper works", "its orchards")

#: Each relation: (subject kind, object kind, the phrase naming the object given the subject, the fact's sentence).
RELATIONS: dict[str, tuple[str, str, str, str]] = {
    "born_in": ("person", "city", "the city where {x} was born", "{s} was born in {o}."),
    "works_for": ("person", "org", "the organisation that {x} works for", "{s} works for the {o}."),
    "mentor": ("person", "person", "the person who mentored {x}", "{s} was mentored by {o}."),
    "headquarters": ("org", "city", "the city where the {x} is headquartered", "The {s} is headquartered in {o}."),
    "founder": ("org", "person", "the founder of the {x}", "The {s} was founded by {o}."),
    "region": ("city", "region", "the region that {x} lies in", "{s} lies in the region of {o}."),
    "capital": ("region", "city", "the capital of {x}", "The capital of {s} is {o}."),
}


@dataclasses.dataclass
class Entity:
    """One thing of the world: its kind, name, facts (relation -> entity index) and document."""

    kind: str
    name: str
    facts: dict[str, int] = dataclasses.field(default_factory=dict)
    description: str = ""
    document: str = ""


@dataclasses.dataclass
class Question:
    """A multi-hop question: the chain of entities (start first, answer last) and relations."""

    text: str
    chain: list[int]
    relations: list[str]

    @property
    def hops(self) -> int:
        """How many relations the question follows (= documents it needs)."""
        return len(self.relations)


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = [ONSETS[int(rng.integers(len(ONSETS)))] + VOWELS[int(rng.integers(len(VOWELS)))] for _ in range(syllables)]
    return ("".join(parts) + CODAS[int(rng.integers(len(CODAS)))]).capitalize()


def _fresh(rng: np.random.Generator, taken: set[str], make) -> str:
    """A name from ``make() -> (name, invented words)`` whose name and invented words are new."""
    while True:
        name, words = make()
        keys = {name.lower(), *(w.lower() for w in words)}
        if not keys & taken:
            taken.update(keys)
            return name


def _person(rng: np.random.Generator) -> tuple[str, list[str]]:
    first, last = _word(rng, 2), _word(rng, 2)
    return f"{first} {last}", [first, last]


def _suffixed(rng: np.random.Generator, syllables: int, suffixes: tuple[str, ...], joiner: str = "") -> tuple[str, list[str]]:
    base = _word(rng, syllables)
    name = f"{base}{joiner}{suffixes[int(rng.integers(len(suffixes)))]}"
    return name, [base if joiner else name]


def generate_world(rng: np.random.Generator, size: int) -> list[Entity]:
    """``size`` entities (at least 12): half people, a fifth organisations, a fifth cities, the rest
    regions, with every relation filled and every document written."""
    if size < 12:
        raise ValueError(f"a world needs at least 12 documents, got {size}")
    regions = max(2, size // 10)
    cities = max(3, size // 5)
    orgs = max(2, size // 5)
    people = size - regions - cities - orgs
    taken: set[str] = set()
    entities: list[Entity] = []

    def add(kind: str, name: str, description: str) -> int:
        entities.append(Entity(kind, name, description=description))
        return len(entities) - 1

    # Every word of every name is unique in the world, so a name's words point at one entity.
    person_ids = [
        add("person", _fresh(rng, taken, lambda: _person(rng)), f"a {PROFESSIONS[int(rng.integers(len(PROFESSIONS)))]}")
        for _ in range(people)
    ]
    org_ids = []
    for _ in range(orgs):
        suffix, kind = ORG_KINDS[int(rng.integers(len(ORG_KINDS)))]
        org_ids.append(add("org", _fresh(rng, taken, lambda: _suffixed(rng, 2, (suffix,), " ")), f"a {kind}"))
    city_ids = [
        add("city", _fresh(rng, taken, lambda: _suffixed(rng, 1, CITY_SUFFIXES)), f"a city known for {KNOWN_FOR[int(rng.integers(len(KNOWN_FOR)))]}")
        for _ in range(cities)
    ]
    region_ids = [add("region", _fresh(rng, taken, lambda: _suffixed(rng, 2, REGION_SUFFIXES)), "a region") for _ in range(regions)]
    for position, city in enumerate(city_ids):  # every region gets a city first, then at random
        region = region_ids[position] if position < len(region_ids) else region_ids[int(rng.integers(len(region_ids)))]
        entities[city].facts["region"] = region
    for region in region_ids:
        own = [c for c in city_ids if entities[c].facts["region"] == region]
        entities[region].facts["capital"] = own[int(rng.integers(len(own)))]
    for person in person_ids:
        entities[person].facts["born_in"] = city_ids[int(rng.integers(len(city_ids)))]
        entities[person].facts["works_for"] = org_ids[int(rng.integers(len(org_ids)))]
        other = int(rng.integers(len(person_ids) - 1))  # anyone but the person: skip their own index
        entities[person].facts["mentor"] = person_ids[other + (other >= person)]  # people are entities 0 .. people-1
    for org in org_ids:
        entities[org].facts["headquarters"] = city_ids[int(rng.integers(len(city_ids)))]
        entities[org].facts["founder"] = person_ids[int(rng.integers(len(person_ids)))]
    for entity in entities:
        entity.document = _document(entity, entities)
    return entities


def _document(entity: Entity, entities: list[Entity]) -> str:
    article = "The " if entity.kind == "org" else ""
    sentences = [f"{article}{entity.name} is {entity.description}."]
    for relation, target in entity.facts.items():
        sentences.append(RELATIONS[relation][3].format(s=entity.name, o=entities[target].name))
    return " ".join(sentences)


def make_question(rng: np.random.Generator, entities: list[Entity], hops: int, attempts: int = 1000) -> Question:
    """A question that follows ``hops`` relations from a random entity, visiting no entity twice."""
    for _ in range(attempts):
        chain = [int(rng.integers(len(entities)))]
        relations: list[str] = []
        while len(relations) < hops:
            options = sorted(entities[chain[-1]].facts)
            relation = options[int(rng.integers(len(options)))]
            target = entities[chain[-1]].facts[relation]
            if target in chain:
                break
            chain.append(target)
            relations.append(relation)
        if len(relations) == hops:
            phrase = entities[chain[0]].name
            for relation in relations:
                phrase = RELATIONS[relation][2].format(x=phrase)
            return Question(f"What is the name of {phrase}?", chain, relations)
    raise RuntimeError(f"no {hops}-hop chain found in {attempts} attempts")


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, gold: str) -> bool:
    """Whether the normalised prediction equals the normalised gold answer."""
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    """SQuAD's token F1 between the normalised prediction and gold answer."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum(min(predicted.count(t), wanted.count(t)) for t in set(predicted) & set(wanted))
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)
