"""A griffe extension for the docs site: reads statevar's ``Example:`` docstring sections
as Google-style ``Examples:`` sections, so that their ``>>>`` doctests render as code.

griffe's Google parser knows only the plural; statevar's docstrings use the singular
(``STYLE.md``). Loaded by ``mkdocs.yml`` (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Renames every ``Example:`` section header to ``Examples:`` before parsing."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\g<indent>Examples:", obj.docstring.value)
