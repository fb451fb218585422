"""Exceptions the WebShop plugin raises, on envhub's error hierarchy."""

from __future__ import annotations

from envhub.error import EnvhubError


class DataNotFound(EnvhubError, FileNotFoundError):
    """The WebShop data files are not where they were looked for; the message says what to fetch."""


class UnknownGoal(EnvhubError, LookupError):
    """A goal index or split that does not exist was asked for."""
