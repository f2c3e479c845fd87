"""Sphinx extension: point the book's Colab launch buttons at colab/<chapter>.ipynb, and only on chapters.

sphinx-book-theme builds the Colab URL from the page's own path (notebooks/<chapter>.ipynb, which is
generated for the build and never committed), so its button would open a 404.  This handler runs after
the theme's (priority 501) and rewrites that URL to the committed notebook tools/colab_notebooks.py writes.
Pages outside notebooks/ (the lab notebook's pages read committed results and have no Colab copy) lose the
Colab button, and a launch group left empty goes with it.
"""
from __future__ import annotations

from typing import Any

SOURCE_FOLDER = "notebooks/"
COLAB_FOLDER = "colab/"


def _is_colab(button: dict[str, Any]) -> bool:
    return button.get("text") == "Colab"


def rewrite_colab_links(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    groups = context.get("header_buttons", [])
    if not pagename.startswith(SOURCE_FOLDER):
        for group in groups:
            if "buttons" in group:
                group["buttons"] = [button for button in group["buttons"] if not _is_colab(button)]
        context["header_buttons"] = [group for group in groups
                                     if group.get("type") != "group" or group.get("buttons")]
        return
    stem = pagename[len(SOURCE_FOLDER):]
    for group in groups:
        for button in group.get("buttons", []):
            url = button.get("url", "")
            if _is_colab(button) and "/blob/" in url:
                prefix = url.split("/blob/")[0]
                branch = url.split("/blob/")[1].split("/")[0]
                button["url"] = f"{prefix}/blob/{branch}/{COLAB_FOLDER}{stem}.ipynb"


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", rewrite_colab_links, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
