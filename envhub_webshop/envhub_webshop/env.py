"""WebShop as an envhub text environment (SPEC section 4)."""

from __future__ import annotations

import json
import os
from typing import Any

from envhub.core import TextEnv, stable_key
from envhub.error import InvalidAction
from envhub_webshop.catalog import SMALL
from envhub_webshop.errors import UnknownGoal
from envhub_webshop.goals import DEFAULT_PRICE_SEED, cumulative_weights, weighted_index
from envhub_webshop.oracle import Oracle, oracle_for
from envhub_webshop.render import OBSERVATION_MODES, TEXT, TEXT_RICH, observe
from envhub_webshop.shop import SEARCH, ShopSession, load_shop

INSTRUCTIONS = (
    "You are shopping in WebShop, an online store with {n} products. Buy the product the instruction "
    "describes, with the options it asks for, within its price limit.\n"
    "Actions:\n"
    "- search[QUERY]: search the store (allowed on every page), e.g. search[men's leather sandals].\n"
    "- click[TEXT]: click a button, a product id on the results page, or an option value on a "
    "product page, e.g. click[next >], click[b07nz173gy], click[size 13], click[buy now].\n"
    "Clicking 'Buy Now' ends the episode with a reward between 0 and 1 for how well the product, its "
    "attributes, its options and its price match; a perfect purchase scores 1."
)

#: Queries longer than this (in characters) stand in ``state_key`` as their SHA-256 digest.
STATE_KEY_QUERY_CHARS = 256


class WebShopEnv(TextEnv):
    """Shop for the product an instruction describes; buying it scores upstream's reward.

    Each reset picks a goal of ``split``: ``options={"goal": i}`` takes the split's ``i``-th goal,
    ``options={"goal_index": j}`` upstream's goal ``j`` (its session id); otherwise the seed picks
    one, uniformly (as the RL ports do) or with upstream's weights (``goal_sampling="weighted"``).

    Args:
        split: ``"train"`` (goals 1500+), ``"eval"`` (500-1499), ``"test"`` (0-499) or ``"all"``.
        observation_mode: ``"text"`` (pieces joined by `` [SEP] ``) or ``"text_rich"`` (one line each).
        show_actions: append the available actions to every observation.
        num_prev_obs: earlier observations to prefix, as upstream's option.
        num_prev_actions: earlier actions to prefix, as upstream's option.
        upstream_quirks: keep upstream's colour normalisation of goal options (458 goals cannot be
            won) and its off-by-one weighted sampler; False fixes both.
        goal_sampling: ``"uniform"`` or ``"weighted"``.
        show_attrs: offer the ``Attributes`` sub-page.
        data_dir: the data directory (default ``$ENVHUB_WEBSHOP_DATA`` or the cache directory).
        setting: ``"small"`` (1,000 products) or ``"full"``.
        price_seed: seed of product prices and price limits.
        title_tagger: ``"auto"`` (spaCy when its English model is installed), ``"spacy"`` or ``"builtin"``.
        render_mode: ``"ansi"`` or None.
    """

    def __init__(
        self,
        split: str = "train",
        observation_mode: str = TEXT,
        show_actions: bool = True,
        num_prev_obs: int = 0,
        num_prev_actions: int = 0,
        upstream_quirks: bool = True,
        goal_sampling: str = "uniform",
        show_attrs: bool = False,
        data_dir: str | os.PathLike[str] | None = None,
        setting: str = SMALL,
        price_seed: int = DEFAULT_PRICE_SEED,
        title_tagger: str = "auto",
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        if goal_sampling not in ("uniform", "weighted"):
            raise ValueError(f"goal_sampling must be 'uniform' or 'weighted', got {goal_sampling!r}")
        self.shop = load_shop(data_dir, setting=setting, price_seed=price_seed, title_tagger=title_tagger)
        self.split = split
        self.goal_indices = self.shop.goal_set.split(split)
        if not self.goal_indices:
            raise UnknownGoal(f"split {split!r} has no goals in this catalogue")
        self.observation_mode = observation_mode
        self.show_actions = show_actions
        self.num_prev_obs, self.num_prev_actions = num_prev_obs, num_prev_actions
        self.upstream_quirks = upstream_quirks
        self.goal_sampling = goal_sampling
        self.show_attrs = show_attrs
        self.oracle: Oracle = oracle_for(self.shop)
        self.instructions = INSTRUCTIONS.format(n=len(self.shop.catalog))
        self.session: ShopSession | None = None
        self._cum_weights: list[float] | None = None
        self._prev_obs: list[str] = []
        self._prev_actions: list[str] = []

    # ------------------------------------------------------------------ goals

    def _pick_goal(self, options: dict[str, Any]) -> int:
        if "goal_index" in options:
            index = int(options["goal_index"])
            if index not in self.goal_indices:
                raise UnknownGoal(f"goal_index {index} is not in split {self.split!r} ({self.goal_indices})")
            return index
        if "goal" in options:
            position = int(options["goal"])
            if not 0 <= position < len(self.goal_indices):
                raise UnknownGoal(f"goal {position} is out of range: split {self.split!r} has {len(self.goal_indices)} goals")
            return self.goal_indices[position]
        if self.goal_sampling == "weighted":
            if self._cum_weights is None:
                self._cum_weights = cumulative_weights([self.shop.goals[i].weight for i in self.goal_indices])
            return self.goal_indices[weighted_index(self._cum_weights, self.np_random, self.upstream_quirks)]
        return self.goal_indices[int(self.np_random.integers(len(self.goal_indices)))]

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._pick_goal(options)
        goal = self.shop.goals[index]
        self.session = ShopSession(self.shop, goal, index, self.show_attrs, self.upstream_quirks)
        page = observe(self.session, self.observation_mode)
        self._prev_obs, self._prev_actions = [page], []
        info = {
            "goal_index": index,
            "split": self.split,
            "instruction": goal.instruction_text,
            "title_tagger": self.shop.nouns.name,
        }
        return self._with_actions(page), info

    def parse_action(self, action: str) -> str:
        """Return the canonical ``search[query]`` / ``click[text]`` for a legal ``action``.

        Raises:
            InvalidAction: for anything upstream would not act on, with the reason.
        """
        if self.session is None:
            raise InvalidAction("reset() the environment first")
        name, arg = self.session.check(action)
        return f"{name}[{arg}]"

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self.session is not None
        name, _, rest = action.partition("[")
        reward, done = self.session.act(name, rest[:-1])
        page = observe(self.session, self.observation_mode)
        self._prev_actions.append(action)
        pieces = [page]
        for k in range(1, 1 + max(self.num_prev_obs, self.num_prev_actions)):
            if k <= min(self.num_prev_actions, len(self._prev_actions)):
                pieces.append(self._prev_actions[-k])
            if k <= min(self.num_prev_obs, len(self._prev_obs)):
                pieces.append(self._prev_obs[-k])
        self._prev_obs.append(page)
        extra: dict[str, Any] = {"page": self.session.page}
        if done:
            extra["reward_details"] = self.session.reward_info
            extra["purchased"] = self.session.asin
        return self._with_actions(" [SEP] ".join(reversed(pieces))), reward, done, extra

    def _with_actions(self, observation: str) -> str:
        if not self.show_actions or self.session is None or self.session.reward is not None:
            return observation
        shown = (["search[<your query>]"] if self.session.has_search_bar else []) + self._click_actions()
        return f"{observation}\nAvailable actions: {', '.join(shown)}"

    def _click_actions(self) -> list[str]:
        assert self.session is not None
        return [f"click[{key}]" for key in self.session.clickables() if key != "search"]

    def valid_actions(self) -> list[str] | None:
        """The clicks the page offers; None on the search page, where the query is free text.

        ``search[...]`` is also legal on every page (as upstream); the list holds the clicks, the
        finite part a policy can choose from. It never holds a concrete search: the oracle's query
        would hand the goal product's title to any policy that reads the list.
        """
        if self.session is None or self.session.page == SEARCH:
            return None
        return self._click_actions()

    def expert_action(self) -> str | None:
        """The oracle's next action: search, open the goal product, pick its options, buy."""
        if self.session is None:
            return None
        return self.oracle.next_action(self.session)

    def state_key(self) -> str:
        """Page, query, results page, product, options and goal (plus visited links in rich mode)."""
        if self.session is None:
            return ""
        state = self.session.state()
        if self.observation_mode != TEXT_RICH:
            del state["visited"]
        keywords = state.get("keywords")
        if isinstance(keywords, list) and sum(len(k) for k in keywords) > STATE_KEY_QUERY_CHARS:
            # A long query stands in the key as its digest: same query, same key, bounded size.
            digest = stable_key("\x00".join(keywords))
            state["keywords"] = [f"sha256:{digest}"]
        return json.dumps(state, sort_keys=True, separators=(",", ":"))

    def is_success(self) -> bool:
        """Whether the purchase scored 1.0."""
        return self.session is not None and self.session.reward == 1.0

    def render_text(self) -> str:
        """The current page in the env's observation mode."""
        if self.session is None:
            return ""
        return observe(self.session, self.observation_mode)
