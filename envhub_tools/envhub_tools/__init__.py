"""Tool-calling environments for envhub (``tools/MultiHopQA-v0``, ``tools/Countdown-v0`` and variants)."""

__version__ = "0.1.0"
