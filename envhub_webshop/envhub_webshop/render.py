"""Observations from page segments: upstream's ``text`` and ``text_rich`` modes (SPEC 4.3)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from envhub_webshop.shop import Segment, ShopSession

TEXT, TEXT_RICH = "text", "text_rich"
OBSERVATION_MODES = (TEXT, TEXT_RICH)


def render_text(segments: Iterable[Segment]) -> str:
    """``text`` mode: the stripped segments joined by `` [SEP] ``."""
    return " [SEP] ".join(s.text.strip() for s in segments)


def render_rich(segments: Iterable[Segment], visited: set[str], options: dict[str, str]) -> str:
    """``text_rich`` mode: one line per segment, buttons in ``[button] ... [button_]`` brackets.

    Visited product links and chosen option values are ``[clicked button]``; each chosen value
    also prepends ``You have clicked VALUE.`` to the page, the later ones first. A value counts as
    chosen when ``"VALUE"`` occurs in ``json.dumps(options)``, as upstream tests the item URL.
    """
    chosen = json.dumps(options)
    lines: list[str] = []
    prefix = ""
    for s in segments:
        if s.kind == "button":
            lines.append(f"[button] {s.text} [button_]\n")
        elif s.kind == "link":
            if s.text in visited:
                lines.append(f"\n[clicked button] {s.text} [clicked button_]\n")
            else:
                lines.append(f"\n[button] {s.text} [button_]\n")
        elif s.kind == "label":
            if f'"{s.text}"' in chosen:
                lines.append(f"  [clicked button] {s.text} [clicked button_]\n")
                prefix = f"You have clicked {s.text}.\n" + prefix
            else:
                lines.append(f"  [button] {s.text} [button_]\n")
        else:
            lines.append(s.text + "\n")
    return prefix + "".join(lines)


def observe(session: ShopSession, mode: str = TEXT) -> str:
    """Render ``session``'s current page in ``mode``."""
    segments = session.segments()
    if mode == TEXT:
        return render_text(segments)
    if mode == TEXT_RICH:
        return render_rich(segments, session.visited, session.options)
    raise ValueError(f"observation mode must be one of {OBSERVATION_MODES}, got {mode!r}")
