"""The expert: search for the goal product, open it, pick the goal options, buy.

For each goal product the oracle needs a query that puts the product in the top 50. It tries,
in order, the product's instruction (what the shopper reads, without options and price), its
title, and its whole search document, and keeps the first that finds it; plans are computed
once per product and shared by every session of the shop.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import weakref

from envhub_webshop.shop import DONE, ITEM, RESULTS, RESULTS_PER_PAGE, SEARCH, Shop, ShopSession

_UNSAFE = re.compile(r"[\[\]\n\r]+")


@dataclasses.dataclass(frozen=True)
class SearchPlan:
    """How the oracle finds a product: the query, and the results page the product is on."""

    query: str
    page: int


def _clean(text: str) -> str:
    # Brackets and newlines would change how search[...] parses; spaces do not change the terms.
    return " ".join(_UNSAFE.sub(" ", text).lower().split())


#: One oracle per shop, shared by every env on it (its plans are cached per goal).
_ORACLES: weakref.WeakKeyDictionary[Shop, Oracle] = weakref.WeakKeyDictionary()
_ORACLES_LOCK = threading.Lock()


def oracle_for(shop: Shop) -> Oracle:
    """The shop's :class:`Oracle`, made on first use and shared (thread-safe)."""
    with _ORACLES_LOCK:
        oracle = _ORACLES.get(shop)
        if oracle is None:
            oracle = _ORACLES[shop] = Oracle(shop)
    return oracle


class Oracle:
    """Plans and next actions for the shop's goals.

    Args:
        shop: the shop whose search the plans are made with.
    """

    def __init__(self, shop: Shop):
        self.shop = shop
        self._plans: dict[str, SearchPlan | None] = {}
        self._lock = threading.Lock()

    def plan(self, asin: str) -> SearchPlan | None:
        """Return the search plan for ``asin``, or None if no candidate query finds it."""
        if asin not in self._plans:
            product = self.shop.catalog[asin]
            found = None
            for candidate in (product.instruction or "", product.title, product.search_text):
                query = _clean(candidate)
                if not query:
                    continue
                hits = self.shop.search(query)
                if asin in hits:
                    found = SearchPlan(query, hits.index(asin) // RESULTS_PER_PAGE + 1)
                    break
            with self._lock:
                self._plans[asin] = found
        return self._plans[asin]

    def search_action(self, session: ShopSession) -> str:
        """The search the oracle types for ``session``'s goal (its title when no plan exists)."""
        plan = self.plan(session.goal.asin)
        return f"search[{plan.query if plan else _clean(session.goal.name) or 'product'}]"

    def next_action(self, session: ShopSession) -> str | None:
        """Return the oracle's next action in ``session``, or None once the purchase is made."""
        goal = session.goal
        plan = self.plan(goal.asin)
        page = session.page
        if page == DONE:
            return None
        if page == SEARCH:
            return self.search_action(session)
        if page == RESULTS:
            if plan is None or session.query != plan.query:
                return "click[back to search]"
            if goal.asin in session.page_hits():
                return f"click[{goal.asin.lower()}]"
            return "click[next >]" if session.results_page < plan.page else "click[< prev]"
        if page == ITEM:
            if session.asin != goal.asin:
                return "click[< prev]"
            clickables = session.clickables()
            for name, value in goal.goal_options.items():
                target = clickables.get(value)
                if session.options.get(name) != value and target is not None and target.name == name:
                    return f"click[{value}]"
            return "click[buy now]"
        return "click[< prev]"
