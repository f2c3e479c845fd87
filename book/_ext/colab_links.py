"""Sphinx extension: point the book's Colab launch buttons at colab/<chapter>.ipynb.

sphinx-book-theme builds the Colab URL from the page's own path (notebooks/<chapter>.ipynb, which is
generated for the build and never committed), so its button would open a 404.  This handler runs after
the theme's (priority 501) and rewrites that URL to the committed notebook tools/colab_notebooks.py writes.
"""
from __future__ import annotations

from typing import Any

SOURCE_FOLDER = "notebooks/"
COLAB_FOLDER = "colab/"


def rewrite_colab_links(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    if not pagename.startswith(SOURCE_FOLDER):
        return
    stem = pagename[len(SOURCE_FOLDER):]
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []):
            url = button.get("url", "")
            if button.get("text") == "Colab" and "/blob/" in url:
                prefix = url.split("/blob/")[0]
                branch = url.split("/blob/")[1].split("/")[0]
                button["url"] = f"{prefix}/blob/{branch}/{COLAB_FOLDER}{stem}.ipynb"


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", rewrite_colab_links, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
