"""What the book's pages share: `glue`, the way a number computed in a cell reaches the prose."""
from __future__ import annotations

from typing import Any


def glue(name: str, value: Any, display: bool = True) -> None:
    """myst-nb's `glue` (the book's prose shows `value` wherever it names `name`); where myst-nb is not installed
    (a Colab runtime runs the chapters without the book's tooling) the value is printed instead."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        print(f"{name}: {value}")
        return
    myst_glue(name, value, display=display)
