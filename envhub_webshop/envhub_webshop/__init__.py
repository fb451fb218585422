"""WebShop for envhub: the shop offline, synthetic goals, upstream's reward, a text env and a web page."""

__all__ = ["WebShopEnv"]


def __getattr__(name: str):
    """``from envhub_webshop import WebShopEnv``, imported on first use: loading the plugin (which
    imports this package) must not import the shop."""
    if name == "WebShopEnv":
        from envhub_webshop.env import WebShopEnv

        return WebShopEnv
    raise AttributeError(f"module 'envhub_webshop' has no attribute {name!r}")
