"""TextArena games as envhub environments."""

# Importing the package registers its ids with envhub and Gymnasium (Gymnasium 1.x loads no plugins).
from envhub.plugins import load_on_import as _load_on_import  # noqa: E402

_load_on_import("textarena")
