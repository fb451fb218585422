"""The shop's state machine (SPEC section 4.1-4.2), shared by the text env and the web page.

:class:`Shop` holds what every visitor shares and nobody changes: catalogue, search index, goals,
prices, the title tagger. :class:`ShopSession` is one shopper's state: goal, keywords, results
page, product, visited products, selected options, and the purchase once made. Its pages are
lists of :class:`Segment` (text, button, label, link) that :mod:`render` turns into observations
and the web server into HTML.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
from typing import Any

from envhub.error import InvalidAction
from envhub_webshop.catalog import SMALL, Catalog, Product
from envhub_webshop.goals import DEFAULT_PRICE_SEED, Goal, GoalSet, build_goals
from envhub_webshop.reward import TitleNouns, get_reward, get_tagger
from envhub_webshop.search import BM25Index

SEARCH, RESULTS, ITEM, DONE = "search", "results", "item", "done"
DESCRIPTION, FEATURES, REVIEWS, ATTRIBUTES = "description", "features", "reviews", "attributes"
SUB_PAGES = (DESCRIPTION, FEATURES, REVIEWS, ATTRIBUTES)

RESULTS_PER_PAGE = 10
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "Back to Search", "Next >", "< Prev", "Buy Now"


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    """One piece of a page: ``kind`` is ``text``, ``button``, ``label`` (option value) or ``link`` (asin)."""

    kind: str
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Clickable:
    """What clicking a key does: a ``button``, opening ``asin``, or choosing ``option`` ``name``."""

    kind: str
    target: str
    name: str | None = None


#: The search cache's bound in query characters, and the longest query it keeps.
SEARCH_CACHE_CHARS = 4_000_000
SEARCH_CACHE_QUERY_CHARS = 1_000


class Shop:
    """Everything shoppers share: catalogue, search index, goals and prices, title tagger.

    Args:
        catalog: the products.
        price_seed: seed of the prices and price limits (:func:`goals.build_goals`).
        title_tagger: ``"auto"``, ``"spacy"`` or ``"builtin"`` (:func:`reward.get_tagger`).
    """

    def __init__(self, catalog: Catalog, price_seed: int = DEFAULT_PRICE_SEED, title_tagger: str = "auto"):
        self.catalog = catalog
        self.index = BM25Index([p.asin for p in catalog.products], (p.search_text for p in catalog.products))
        self.goal_set: GoalSet = build_goals(catalog.products, price_seed)
        self.goals: list[Goal] = self.goal_set.goals
        self.prices = self.goal_set.prices
        self.nouns = TitleNouns(get_tagger(title_tagger))
        self._search_lock = threading.Lock()
        self._search_cache: dict[str, list[str]] = {}
        self._search_cache_chars = 0

    def search(self, query: str) -> list[str]:
        """Return the asins of the top hits for ``query`` (cached per query, thread-safe).

        The cache is bounded by size, not only by entries: it holds at most
        :data:`SEARCH_CACHE_CHARS` characters of queries (and 50,000 of them), and a query longer
        than :data:`SEARCH_CACHE_QUERY_CHARS` is searched but never cached.
        """
        found = self._search_cache.get(query)
        if found is None:
            found = [asin for asin, _ in self.index.search(query)]
            if len(query) <= SEARCH_CACHE_QUERY_CHARS:
                with self._search_lock:
                    if len(self._search_cache) >= 50_000 or self._search_cache_chars + len(query) > SEARCH_CACHE_CHARS:
                        self._search_cache.clear()
                        self._search_cache_chars = 0
                    if query not in self._search_cache:
                        self._search_cache_chars += len(query)
                    self._search_cache[query] = found
        return found

    def reward(self, asin: str, goal: Goal, options: dict[str, str], upstream_quirks: bool = True) -> tuple[float, dict[str, Any]]:
        """Score buying ``asin`` with ``options`` for ``goal``."""
        return get_reward(self.catalog[asin], goal, self.prices[asin], options, self.nouns, upstream_quirks)


@functools.lru_cache(maxsize=4)
def _load_shop(data_dir: str | None, setting: str, limit: int | None, price_seed: int, title_tagger: str) -> Shop:
    return Shop(Catalog.load(data_dir, setting=setting, limit=limit), price_seed, title_tagger)


def load_shop(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    setting: str = SMALL,
    limit: int | None = None,
    price_seed: int = DEFAULT_PRICE_SEED,
    title_tagger: str = "auto",
) -> Shop:
    """Return the shop for these data, built once per process and shared by every env and visitor."""
    directory = os.fspath(data_dir) if data_dir is not None else os.environ.get("ENVHUB_WEBSHOP_DATA")
    return _load_shop(os.path.abspath(directory) if directory else None, setting, limit, price_seed, title_tagger)


def parse_action(action: str) -> tuple[str, str]:
    """Split ``name[arg]`` as upstream's ``(.+)\\[(.+)\\]`` does, in linear time.

    The match is anchored at the start and cannot cross a newline; both groups are greedy, so
    the argument runs from the last ``[`` that still leaves a non-empty argument to the last
    ``]``, and anything after that ``]`` is ignored. Only the argument is lower-cased.

    Raises:
        InvalidAction: when the text is not of that form.
    """
    line = action.split("\n", 1)[0]
    close = line.rfind("]")
    if close < 2:
        raise InvalidAction("an action looks like search[query] or click[button]")
    open_ = line.rfind("[", 0, close - 1)
    if open_ < 1:
        raise InvalidAction("an action looks like search[query] or click[button]")
    return line[:open_], line[open_ + 1 : close].lower()


class ShopSession:
    """One shopper's state on the shop's pages.

    Args:
        shop: the shared shop.
        goal: the task.
        goal_index: the goal's index (upstream's session id), for the done page and state keys.
        show_attrs: offer the ``Attributes`` sub-page on item pages, as upstream's option does.
        upstream_quirks: passed to the reward.
    """

    def __init__(self, shop: Shop, goal: Goal, goal_index: int, show_attrs: bool = False, upstream_quirks: bool = True):
        self.shop, self.goal, self.goal_index = shop, goal, goal_index
        self.show_attrs, self.upstream_quirks = show_attrs, upstream_quirks
        self.page = SEARCH
        self.keywords: list[str] = []
        self.results_page = 1
        self.asin: str | None = None
        self.visited: set[str] = set()
        self.options: dict[str, str] = {}
        self.reward: float | None = None
        self.reward_info: dict[str, Any] | None = None
        self.purchased: tuple[str, dict[str, str]] | None = None
        self._clickables: dict[str, Clickable] | None = None

    # ------------------------------------------------------------------ what the page offers

    @property
    def query(self) -> str:
        """The search query: the keywords joined by spaces."""
        return " ".join(self.keywords)

    @property
    def product(self) -> Product | None:
        """The product on the item page and its sub-pages."""
        return self.shop.catalog.by_asin.get(self.asin) if self.asin else None

    def hits(self) -> list[str]:
        """All hits of the current search (at most 50)."""
        return self.shop.search(self.query)

    def page_hits(self) -> list[str]:
        """The hits shown on the current results page."""
        start = (self.results_page - 1) * RESULTS_PER_PAGE
        return self.hits()[start : start + RESULTS_PER_PAGE]

    def buttons(self) -> list[str]:
        """The button texts of the current page, in document order."""
        if self.page == SEARCH:
            return ["Search"]
        if self.page == RESULTS:
            return [BACK_TO_SEARCH] + ([PREV_PAGE] if self.results_page > 1 else []) + [NEXT_PAGE]
        if self.page == ITEM:
            subs = ["Description", "Features", "Reviews"] + (["Attributes"] if self.show_attrs else [])
            return [BACK_TO_SEARCH, PREV_PAGE, *subs, BUY_NOW]
        if self.page in SUB_PAGES:
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def clickables(self) -> dict[str, Clickable]:
        """Lower-cased clickable text -> what it does, in upstream's order (SPEC 4.2)."""
        if self._clickables is None:
            found = {b.lower(): Clickable("button", b.lower()) for b in self.buttons()}
            if self.page == RESULTS:
                for asin in self.page_hits():
                    found[asin.lower()] = Clickable("asin", asin)
            if self.page == ITEM and self.product is not None:
                for name, values in self.product.options.items():
                    for value in values:
                        found[value] = Clickable("option", value, name)
            self._clickables = found
        return self._clickables

    @property
    def has_search_bar(self) -> bool:
        """Whether the page has the search box (only the search page)."""
        return self.page == SEARCH

    # ------------------------------------------------------------------ acting

    def check(self, action: str) -> tuple[str, str]:
        """Return ``(name, lower-cased argument)`` of a legal ``action``.

        Raises:
            InvalidAction: saying why the action cannot be taken on this page.
        """
        if not isinstance(action, str):
            raise InvalidAction(f"an action is text, got {type(action).__name__}")
        name, arg = parse_action(action.strip())
        if self.page == DONE:
            raise InvalidAction("the purchase is done; the episode is over")
        if name == "search":
            return name, arg
        if name == "click":
            if arg != "search" and arg in self.clickables():
                return name, arg
            options = ", ".join(k for k in self.clickables() if k != "search") or "nothing (use search[...])"
            raise InvalidAction(f"'{arg[:60]}' is not clickable on this page; you can click: {options}")
        raise InvalidAction(f"unknown action '{name[:40]}'; use search[query] or click[button]")

    def act(self, name: str, arg: str) -> tuple[float, bool]:
        """Apply a legal action (from :meth:`check`); return ``(reward, done)``."""
        try:
            return self._act(name, arg)
        finally:
            self._clickables = None

    def _act(self, name: str, arg: str) -> tuple[float, bool]:
        if name == "search":
            self.keywords = arg.split(" ")
            self.results_page, self.page, self.asin, self.options = 1, RESULTS, None, {}
            return 0.0, False
        clickable = self._dispatch(arg)
        if clickable.kind == "asin":
            self.asin = clickable.target.upper()
            self.visited.add(self.asin)
            self.page = ITEM
        elif clickable.kind == "option":
            self.options[clickable.name] = clickable.target
        elif arg == "back to search":
            self.page, self.keywords, self.results_page, self.asin = SEARCH, [], 1, None
            self.visited, self.options = set(), {}
        elif arg == "next >":
            self.results_page += 1
        elif arg == "< prev":
            if self.page == RESULTS:
                self.results_page -= 1
            elif self.page == ITEM:
                self.page, self.asin, self.options = RESULTS, None, {}
            else:
                self.page = ITEM
        elif arg in SUB_PAGES:
            self.page = arg
        elif arg == "buy now":
            return self._buy(), True
        return 0.0, False

    def _dispatch(self, arg: str) -> Clickable:
        # A page's own buttons win over an option value spelled the same (upstream checks names first).
        if arg in {b.lower() for b in self.buttons()}:
            return Clickable("button", arg)
        return self.clickables()[arg]

    def _buy(self) -> float:
        """Buy the product on the page with the selected options; return the reward."""
        assert self.asin is not None
        reward, info = self.shop.reward(self.asin, self.goal, dict(self.options), self.upstream_quirks)
        self.reward, self.reward_info = reward, info
        self.purchased = (self.asin, dict(self.options))
        self.page = DONE
        return reward

    # ------------------------------------------------------------------ pages

    def segments(self) -> list[Segment]:
        """The current page as segments, in document order (SPEC 4.3)."""
        out: list[Segment] = []

        def add(kind: str, text: str) -> None:
            if text == "":
                return
            if not text.strip():
                if "\n" in text:
                    return
                text = " "
            out.append(Segment(kind, text))

        instruction = self.goal.instruction_text
        if self.page == SEARCH:
            add("text", "WebShop")
            add("text", "Instruction: ")
            add("text", instruction)
            add("button", "Search")
            return out
        if self.page == DONE:
            for text in self._done_texts():
                add("text", text)
            return out
        add("text", "Instruction:")
        add("text", instruction)
        add("button", BACK_TO_SEARCH)
        if self.page == RESULTS:
            add("text", f"Page {self.results_page} (Total results: {len(self.hits())})")
            if self.results_page > 1:
                add("button", PREV_PAGE)
            add("button", NEXT_PAGE)
            for asin in self.page_hits():
                product = self.shop.catalog[asin]
                add("link", asin)
                add("text", product.title)
                add("text", product.price_tag)
            return out
        add("button", PREV_PAGE)
        product = self.product
        assert product is not None
        if self.page == ITEM:
            for name, values in product.options.items():
                add("text", name)
                for value in values:
                    add("label", value)
            add("text", product.title)
            add("text", f"Price: {product.price_tag}")
            add("text", "Rating: N.A.")
            for button in self.buttons()[2:]:
                add("button", button)
        elif self.page == DESCRIPTION:
            add("text", product.description)
        elif self.page == FEATURES:
            for bullet in product.bullet_points:
                add("text", " " + bullet)
        elif self.page == ATTRIBUTES:
            for attribute in product.attributes:
                add("text", " " + attribute)
            add("text", product.category)
            add("text", product.query)
            add("text", product.product_category)
        return out

    def _done_texts(self) -> list[str]:
        asin, options = self.purchased or ("", {})
        options_json = (
            json.dumps(options, sort_keys=True)
            .replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
            .replace("'", "\\u0027")
        )
        return [
            "Thank you for shopping with us!", "Your code: ", "None", " (Paste it in your MTurk interface.)",
            "Purchased", "asin", asin, "options", options_json, "attrs", "None", "category", "None",
            "query", "None", "product category", "None", "Target", "asin", "options", "attrs",
            "price upper", "instuction text", "category", "product category", "query", "Goal ", "None",
            "Reward", "Your score (min 0.0, max 1.0)", str(self.reward), "Reward Details ", "None",
        ]  # fmt: skip

    def state(self) -> dict[str, Any]:
        """The state as a JSON-ready dict (the text env's state key is built from it)."""
        return {
            "goal": self.goal_index,
            "page": self.page,
            "keywords": self.keywords,
            "results_page": self.results_page,
            "asin": self.asin,
            "options": dict(sorted(self.options.items())),
            "visited": sorted(self.visited),
            "reward": self.reward,
        }
