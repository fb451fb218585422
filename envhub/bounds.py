"""Numeric bounds of settings, declared once per field and checked before anything uses them.

A value out of range would otherwise fail late (``group_size: 0`` divides by zero inside TRL,
``temperature: -1`` only once the first evaluation samples) or silently mean something else
(``max_steps: -3`` trains by epochs). :class:`envhub.prompts.PromptSettings` declares the bounds of
its fields here, and the trainer's config adds its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float and not a bool (which Python counts as an int)."""
    return not isinstance(value, bool) and isinstance(value, (int, float))


@dataclass(frozen=True)
class Bounds:
    """The values a numeric config field accepts: finite numbers from ``low`` to ``high`` (each
    bound inclusive unless open; None: unbounded), or one of ``also``; None where the field allows it.

    Attributes:
        low: the smallest value (None: no lower bound).
        high: the largest value (None: no upper bound).
        low_open: ``low`` itself is refused.
        high_open: ``high`` itself is refused.
        also: values outside the range that mean something (``max_steps=-1``: train by epochs).
        meaning: what the values of ``also`` mean, for the message.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()
    meaning: str = ""

    def admits(self, value: float) -> bool:
        """Whether ``value`` is in bounds."""
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or (value < self.high or (not self.high_open and value == self.high))

    def describe(self) -> str:
        """The bounds in words: ``> 0``, ``in [0, 1]``, ``>= 1, or -1 (...)``."""
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        else:
            text = "a finite number"
        if self.also:
            text += f", or {' or '.join(f'{v:g}' for v in self.also)} ({self.meaning})"
        return text


AT_LEAST_ONE = Bounds(low=1)
NON_NEGATIVE = Bounds(low=0)


def check_bounds(values: Any, bounds: dict[str, Bounds]) -> None:
    """Refuse the first field of ``values`` (an object with those attributes) out of its bounds.

    None passes (where a field allows None, it means "unset"); a bool is not a number here.

    Raises:
        ValueError: naming the field, its bounds and the value.
    """
    for name, allowed in bounds.items():
        value = getattr(values, name, None)
        if value is None:
            continue
        if not is_number(value) or not allowed.admits(value):
            raise ValueError(f"{name} must be {allowed.describe()}, got {value!r}")
