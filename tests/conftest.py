"""Shared test set-up: no model hub, and helpers to build throwaway environments."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# WebShop's data sits beside the repository (../shared/data/webshop) unless the caller points elsewhere.
os.environ.setdefault(
    "ENVHUB_WEBSHOP_DATA",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.pardir, "shared", "data", "webshop"),
)
