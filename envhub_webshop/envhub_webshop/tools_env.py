"""``webshop/WebShopTools-v0``: the WebShop played through tools, ``search``, ``click`` and ``buy``.

The same shop state machine, goals, oracle and reward as ``webshop/WebShop-v0``
(:class:`~envhub_webshop.env.WebShopEnv`, which this env drives): only the action syntax differs.
``search(query)`` is ``search[query]``, ``click(target)`` is ``click[target]`` and ``buy()`` is
``click[buy now]``, the final tool. A call the page does not allow (a click on something not
shown, ``buy()`` away from a product page) is an invalid action with the shop's reason, as an
illegal ``click[...]`` is in the text env.
"""

from __future__ import annotations

from typing import Any

from envhub.core import ToolEnv
from envhub.error import InvalidAction
from envhub.tools import ToolResult, tool

from envhub_webshop.env import WebShopEnv

INSTRUCTIONS = (
    "You are shopping in WebShop, an online store with {n} products. Buy the product the instruction "
    "describes, with the options it asks for, within its price limit.\n"
    "Tools: search(query) searches the store (from any page); click(target) clicks a button, a product id on "
    "the results page, or an option value on a product page (e.g. 'next >', 'b07nz173gy', 'size 13'); "
    "buy() buys the product on the current page with the options chosen and ends the episode.\n"
    "The reward, between 0 and 1, is how well the product, its attributes, its options and its price match; "
    "a perfect purchase scores 1."
)


class WebShopToolsEnv(ToolEnv):
    """WebShop with tools; every keyword argument is :class:`~envhub_webshop.env.WebShopEnv`'s
    (``show_actions`` lists the page's click targets after each result)."""

    final_tools = ("buy",)
    max_argument_chars = 500

    def __init__(self, render_mode: str | None = None, show_actions: bool = True, **kwargs: Any):
        super().__init__(render_mode)
        self.shop_env = WebShopEnv(show_actions=False, **kwargs)
        self.show_actions = show_actions
        self.instructions = INSTRUCTIONS.format(n=len(self.shop_env.shop.catalog))

    # ------------------------------------------------------------------ tools

    @tool
    def search(self, query: str) -> ToolResult:
        """Search the store for products.

        Args:
            query: what to search for, e.g. "men's leather sandals".
        """
        return self._act(f"search[{query}]")

    @tool
    def click(self, target: str) -> ToolResult:
        """Click a button, a product id on the results page, or an option value on a product page.

        Args:
            target: the text of what to click, e.g. "next >", "b07nz173gy" or "size 13".
        """
        return self._act(f"click[{target}]")

    @tool
    def buy(self) -> ToolResult:
        """Buy the product on the current page with the options chosen; this ends the episode.

        Args:
        """
        return self._act("click[buy now]")

    # ------------------------------------------------------------------ the env

    @staticmethod
    def _shop_action(name: str, arguments: dict[str, Any]) -> str:
        if name == "search":
            return f"search[{arguments['query']}]"
        if name == "click":
            return f"click[{arguments['target']}]"
        return "click[buy now]"

    def parse_action(self, action: str) -> str:
        """The call as canonical JSON once the current page allows it (else ``InvalidAction`` with the shop's reason)."""
        import json

        call = json.loads(super().parse_action(action))
        self.shop_env.parse_action(self._shop_action(call["name"], call["arguments"]))
        return self.call_action(call["name"], **call["arguments"])

    def _act(self, shop_action: str) -> ToolResult:
        legal = self.shop_env.parse_action(shop_action)
        page, reward, done, extra = self.shop_env._step(legal)
        return ToolResult(self._with_targets(page), reward, done, extra)

    def _with_targets(self, page: str) -> str:
        session = self.shop_env.session
        if not self.show_actions or session is None or session.reward is not None:
            return page
        targets = [key for key in session.clickables() if key not in ("search", "buy now")]
        if not targets:
            return f"{page}\nCall search(query) to search the store."
        buy = " buy() is available." if "buy now" in session.clickables() else ""
        return f"{page}\nClickable: {', '.join(targets)}.{buy}"

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.shop_env.np_random = self.np_random  # one random stream: the goal comes from this env's seed
        page, info = self.shop_env._reset(options)
        return self._with_targets(page), info

    def expert_action(self) -> str | None:
        """The WebShop oracle's next action as a tool call."""
        action = self.shop_env.expert_action()
        if action is None:
            return None
        name, _, rest = action.partition("[")
        argument = rest[:-1]
        if name == "search":
            return self.call_action("search", query=argument)
        if argument == "buy now":
            return self.call_action("buy")
        return self.call_action("click", target=argument)

    def state_key(self) -> str:
        return self.shop_env.state_key()

    def is_success(self) -> bool:
        return self.shop_env.is_success()

    def render_text(self) -> str:
        return self.shop_env.render_text()
