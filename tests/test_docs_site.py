"""The documentation site: ``mkdocs build --strict`` must pass, offline, so that a broken
link, a page left out of the navigation or a docstring mkdocstrings cannot render fails
the suite."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _nav_pages(nav):
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            if isinstance(value, list):
                yield from _nav_pages(value)
            else:
                yield value


def test_every_docs_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = {page.name for page in (ROOT / "docs").glob("*.md")}
    assert set(_nav_pages(config["nav"])) == pages


def test_mkdocs_builds_the_site_strictly(tmp_path):
    site = tmp_path / "site"
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    reference = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("statevar.Optimizer", "apply_gradients", "statevar.summary", "RestoreResult"):
        assert name in reference, name
    # Docstring examples render as highlighted code, not as quoted text.
    text = re.sub(r"<[^>]+>", "", reference)
    assert "&gt;&gt;&gt; import statevar" in text and "<blockquote>" not in reference
    assert (site / "interop" / "index.html").is_file()
