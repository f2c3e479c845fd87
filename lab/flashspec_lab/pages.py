"""What the book's pages share: `glue`, the way a number computed in a cell reaches the prose, and the lab pages'
readers of committed results (`result_file`, `body`, `list_records`) and `print_wrapped`."""
from __future__ import annotations

import textwrap
from typing import Any

from flashspec_lab import provenance


def glue(name: str, value: Any, display: bool = True) -> None:
    """myst-nb's `glue` (the book's prose shows `value` wherever it names `name`); where myst-nb is not installed
    (a Colab runtime runs the chapters without the book's tooling) the value is printed instead."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        print(f"{name}: {value}")
        return
    myst_glue(name, value, display=display)


def print_wrapped(text: str, indent: str = "  ") -> None:
    """Print `text` in lines that fit the page (84 characters)."""
    print(textwrap.fill(text, 84, subsequent_indent=indent, break_on_hyphens=False))


def body(record: dict) -> dict:
    """A results file's payload."""
    return record["results"]


def result_file(name: str) -> dict | None:
    """A committed results file (".json" optional), or None when it is not there."""
    name = name if name.endswith(".json") else f"{name}.json"
    return provenance.load_result(name) if (provenance.results_dir() / name).exists() else None


def list_records(names: list[str]) -> None:
    """Each results file of a page, newest first: date, path, where it was measured."""
    names = [name.removeprefix("results/") for name in names]
    found = [(result_file(name), name) for name in names]
    dated = sorted(((record["provenance"].get("date_utc", ""), name, record)
                    for record, name in found if record), reverse=True)
    for date, name, record in dated:
        gpu = record["provenance"].get("hardware", {}).get("gpu") or "CPU"
        print(f"{date[:16].replace('T', ' ')}  results/{name}  ({gpu})")
    for record, name in found:
        if record is None:
            print(f"not committed: results/{name}")
