"""WebShop for envhub: the shop offline, synthetic goals, upstream's reward, a text env and a web page."""

__all__ = ["WebShopEnv"]


def __getattr__(name: str):
    """``from envhub_webshop import WebShopEnv``, imported on first use: loading the plugin (which
    imports this package) must not import the shop."""
    if name == "WebShopEnv":
        from envhub_webshop.env import WebShopEnv

        return WebShopEnv
    raise AttributeError(f"module 'envhub_webshop' has no attribute {name!r}")

# Importing the package registers its ids with envhub and Gymnasium (Gymnasium 1.x loads no plugins).
from envhub.plugins import load_on_import as _load_on_import  # noqa: E402

_load_on_import("webshop")
