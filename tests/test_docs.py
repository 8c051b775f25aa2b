"""Runs the code in ``docs/*.md``, so the documentation cannot drift from the code.

Every ```` ```python ```` block of a file runs, in order, in one namespace shared by that
file's blocks, like the cells of a notebook, with the working directory set to a fresh
temporary directory (blocks may write files). A ```` ```output ```` block placed right after
a python block states what that block prints; the test checks it.

A page without python blocks must be generated from the docstrings (``::: statevar.X``),
like the API reference; `test_docs_site` builds those with mkdocs. The R page
(``docs/r.md``) holds ```` ```r ```` blocks instead, which `test_r` runs with Rscript.

Soft device placement warns when a page asks for a device this machine lacks (``"gpu:0"``
on a CPU-only machine); that warning is expected and allowed. Any other warning fails the
test, as everywhere else in the suite.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import pathlib
import re
import sys
import warnings
from dataclasses import dataclass

import pytest

import statevar

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass
class Block:
    language: str
    line: int  # 1-based line of the block's first code line in the file
    source: str
    expected_output: str | None = None


def read_blocks(text: str, language: str = "python") -> list[Block]:
    """Returns the fenced code blocks of ``language`` in a Markdown text, pairing each
    ``output`` block with the block of that language right before it."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        info = opening["info"].split()
        body, j = [], i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            j += 1
        blocks.append(Block(info[0].lower() if info else "", i + 2, "\n".join(body) + "\n"))
        i = j + 1
    paired: list[Block] = []
    previous: Block | None = None
    for block in blocks:
        if block.language == "output" and previous is not None and previous.language == language:
            previous.expected_output = block.source
        elif block.language == language:
            paired.append(block)
        previous = block
    return paired


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda page: page.name)
def test_doc_page_runs(page, tmp_path, monkeypatch, request):
    text = page.read_text(encoding="utf-8")
    blocks = read_blocks(text)
    # A page of code examples must have some; the API reference is generated instead, and
    # the R page's ```r blocks run in tests/test_r.py.
    assert blocks or "\n::: statevar." in text or read_blocks(text, "r"), (
        f"{page.name} has no ```python blocks"
    )
    monkeypatch.chdir(tmp_path)
    logger = logging.getLogger("statevar")
    request.addfinalizer(functools.partial(logger.setLevel, logger.level))
    namespace = {"__name__": f"docs.{page.stem}"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")
        warnings.filterwarnings("always", category=statevar.PlacementWarning)
        for block in blocks:
            # Pad with blank lines so tracebacks show the line number in the .md file.
            code = compile("\n" * (block.line - 1) + block.source, str(page), "exec")
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(code, namespace)
            sys.stdout.write(printed.getvalue())
            if block.expected_output is not None:
                assert _normalize(printed.getvalue()) == _normalize(block.expected_output), (
                    f"{page.name}, block at line {block.line}: the printed output differs "
                    "from the ```output block after it"
                )
    assert all(issubclass(w.category, statevar.PlacementWarning) for w in caught)


def test_read_blocks_pairs_output_and_skips_other_languages():
    text = (
        "# Title\n"
        "```python\nx = 1\nprint(x)\n```\n"
        "```output\n1\n```\n"
        "```bash\nls\n```\n"
        "- item\n"
        "  ```python\n  y = x + 1\n  ```\n"
    )
    blocks = read_blocks(text)
    assert [(b.line, b.source, b.expected_output) for b in blocks] == [
        (3, "x = 1\nprint(x)\n", "1\n"),
        (14, "y = x + 1\n", None),
    ]


def test_read_blocks_of_another_language_pairs_their_outputs():
    text = "```python\nx = 1\n```\n```r\nx <- 1\nx\n```\n```output\n[1] 1\n```\n"
    assert [(b.language, b.line, b.source, b.expected_output) for b in read_blocks(text, "r")] == [
        ("r", 5, "x <- 1\nx\n", "[1] 1\n")
    ]
    assert [b.expected_output for b in read_blocks(text)] == [None]
