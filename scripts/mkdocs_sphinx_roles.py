"""A Griffe extension for the docs site: Sphinx roles in docstrings become Markdown code spans.

The docstrings name other objects the Sphinx way (:class:`~envhub.manager.EnvGroupManager`), which
Markdown would print as written. mkdocstrings loads this file (mkdocs.yml) and, before rendering,
turns each role into a code span of its target: the last part after ``~``, as Sphinx shows it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|obj|exc|const):`(~?)([^`<]+?)(?:\s*<[^`>]+>)?`")


def _code_span(match: re.Match[str]) -> str:
    shortened, target = match.group(1), match.group(2).strip()
    return f"`{target.rsplit('.', 1)[-1] if shortened else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring Griffe reads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_code_span, obj.docstring.value)
