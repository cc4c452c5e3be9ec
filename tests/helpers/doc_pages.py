"""The project's documentation as the tests read it: the README and every page of the
site in docs/, and the fenced blocks (snippets) they hold."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pages() -> dict[str, str]:
    """Each page's text by its path from the project's root: README.md, docs/*.md."""
    paths = ["README.md"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    texts = {}
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            texts[path] = f.read()
    return texts


def snippets(language: str) -> list[tuple[str, str]]:
    """(page, code) of every block fenced as ```language, in page order."""
    return [(page, code) for page, text in pages().items()
            for code in re.findall(rf"```{language}\n(.*?)```", text, re.S)]


def snippet(containing: str, language: str = "python") -> str:
    """The one block of that language holding ``containing``, wherever it is."""
    found = [code for _, code in snippets(language) if containing in code]
    assert len(found) == 1, f"{len(found)} {language} snippets hold {containing!r}"
    return found[0]
