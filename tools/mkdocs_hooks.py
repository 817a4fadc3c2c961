"""MkDocs hooks (mkdocs.yml `hooks:`): the generated reference pages are filled in as the site builds."""

from __future__ import annotations

from typing import Any

from tools.docs_reference import fill


def on_page_markdown(markdown: str, **_: Any) -> str:
    return fill(markdown)
