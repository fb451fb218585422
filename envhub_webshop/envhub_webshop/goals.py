"""WebShop's synthetic goals (SPEC section 2): prices, price limits, option combinations, splits.

Upstream draws product prices and price limits from Python's process-global ``random`` without a
seed, so its goals change from run to run. Here one ``random.Random(price_seed)`` makes the same
draws in the same order (every two-price product's ``uniform``, then one ``sample`` per goal
product), so the goals are identical in every process; seed 4 is the one upstream's demo runner
happens to set. The shuffle uses its own ``Random(233)``, as upstream reseeds before shuffling.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from envhub_webshop.catalog import Product
from envhub_webshop.errors import UnknownGoal

#: Price limits a goal can ask for: 10, 20, ..., 990 dollars.
PRICE_GRID = [10.0 * i for i in range(1, 100)]
#: The limit of goals whose product costs 980 or more: no price clause in the instruction.
NO_PRICE_LIMIT = 1000000
SHUFFLE_SEED = 233
DEFAULT_PRICE_SEED = 4

#: Goal index ranges of each split, as the baseline uses them (``None``: to the end).
SPLITS: dict[str, tuple[int, int | None]] = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)}


@dataclasses.dataclass(slots=True)
class Goal:
    """One shopping task (SPEC 2.5).

    Attributes:
        asin: the product to buy.
        category: its category.
        query: its lower-cased scrape query.
        product_category: its breadcrumb.
        name: its title.
        instruction_text: what the shopper is told.
        attributes: the attributes the reward checks.
        price_upper: the price limit.
        goal_options: option name -> the value to pick.
        weight: upstream's sampling weight (mean inverse frequency of the attributes).
    """

    asin: str
    category: str
    query: str
    product_category: str
    name: str
    instruction_text: str
    attributes: list[str]
    price_upper: float
    goal_options: dict[str, str]
    weight: float = 0.0


class _Uniform(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def sample_prices(products: Sequence[Product], rng: random.Random) -> dict[str, float]:
    """Return every product's single price (SPEC 1.3): the price, or a uniform draw in its range."""
    prices = {}
    for product in products:
        if len(product.pricing) == 1:
            prices[product.asin] = product.pricing[0]
        else:
            prices[product.asin] = rng.uniform(product.pricing[0], product.pricing[1])
    return prices


def price_limit(price: float, rng: random.Random) -> tuple[float, str]:
    """Return ``(price_upper, price_text)`` for a product costing ``price`` (SPEC 2.2)."""
    candidates = [p for p in PRICE_GRID if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_LIMIT, ""
    upper = max(rng.sample(candidates, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def product_goals(product: Product, price_upper: float, price_text: str) -> list[Goal]:
    """Return one goal per combination of the product's option values, in list order (SPEC 2.3-2.4)."""
    names = sorted(product.options)
    goals = []
    for combination in itertools.product(*(product.options[name] for name in names)):
        goal_options = dict(zip(names, combination))
        option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
        option_text = " with " + option_text if option_text else ""
        goals.append(
            Goal(
                asin=product.asin,
                category=product.category,
                query=product.query,
                product_category=product.product_category,
                name=product.title,
                instruction_text=f"{product.instruction}{option_text}{price_text}",
                attributes=list(product.instruction_attributes or []),
                price_upper=price_upper,
                goal_options=goal_options,
            )
        )
    return goals


@dataclasses.dataclass
class GoalSet:
    """The shuffled goals and the product prices they were drawn with.

    Attributes:
        goals: every goal, in upstream's shuffled order (the index is upstream's session id).
        prices: asin -> the single price the reward compares with ``price_upper``.
    """

    goals: list[Goal]
    prices: dict[str, float]

    def split(self, name: str) -> range:
        """Return the goal indices of split ``name`` (``test``, ``eval``, ``train`` or ``all``)."""
        if name == "all":
            return range(len(self.goals))
        if name not in SPLITS:
            raise UnknownGoal(f"unknown split {name!r}; choose one of {sorted(SPLITS) + ['all']}")
        start, stop = SPLITS[name]
        return range(min(start, len(self.goals)), len(self.goals) if stop is None else min(stop, len(self.goals)))


def build_goals(products: Sequence[Product], price_seed: int = DEFAULT_PRICE_SEED) -> GoalSet:
    """Generate the synthetic goals of ``products`` (6,910 for the small setting).

    Args:
        products: the catalogue, in file order.
        price_seed: seed of the one RNG behind prices and price limits.
    """
    rng = random.Random(price_seed)
    prices = sample_prices(products, rng)
    goals: list[Goal] = []
    for product in products:
        if product.instruction is None:
            continue
        upper, text = price_limit(prices[product.asin], rng)
        goals.extend(product_goals(product, upper, text))
    counts = Counter(a for goal in goals for a in goal.attributes)
    for goal in goals:
        if goal.attributes:
            goal.weight = sum(1.0 / counts[a] for a in goal.attributes) / len(goal.attributes)
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return GoalSet(goals, prices)


def cumulative_weights(weights: Sequence[float]) -> list[float]:
    """Return ``[0, w0, w0+w1, ...]``, the table :func:`weighted_index` samples from."""
    return [0.0, *itertools.accumulate(weights)]


def weighted_index(cum_weights: Sequence[float], rng: _Uniform, upstream_quirks: bool = True) -> int:
    """Draw a goal index with probability proportional to its weight.

    With ``upstream_quirks`` this is upstream's ``random_idx``: ``bisect_right`` on the cumulative
    table without subtracting one, so goal ``i`` is drawn with weight ``w[i-1]``, goal 0 (almost)
    never, and the last goal also absorbs ``w[n-1]``. Without, goal ``i`` gets weight ``w[i]``.
    """
    pos = rng.uniform(0, cum_weights[-1])
    idx = bisect.bisect_right(cum_weights, pos)
    if upstream_quirks:
        return min(idx, len(cum_weights) - 2)
    return max(0, min(idx - 1, len(cum_weights) - 2))
