"""Shared test set-up: no model hub, and helpers to build throwaway environments."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
