"""Tool-calling environments for envhub (``tools/MultiHopQA-v0``, ``tools/Countdown-v0`` and variants)."""

__version__ = "0.1.0"

# Importing the package registers its ids with envhub and Gymnasium (Gymnasium 1.x loads no plugins).
from envhub.plugins import load_on_import as _load_on_import  # noqa: E402

_load_on_import("tools")
