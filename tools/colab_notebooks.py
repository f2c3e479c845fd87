"""Keep colab/*.ipynb, the notebooks Colab opens, in step with the jupytext chapter sources.

Colab opens only .ipynb files from GitHub, while the chapters live in notebooks/ as jupytext sources
(no .ipynb there: generated files are not committed).  So colab/ holds one output-free notebook per chapter, generated from its
source; the book's Colab buttons point there (book/_ext/colab_links.py).

    python tools/colab_notebooks.py          # regenerate colab/ after editing a chapter
    python tools/colab_notebooks.py --check  # exit 1 when colab/ is stale (CI and tests/test_book.py)

The check compares cell types, sources and tags, not the jupytext version stamps, so another jupytext
release does not make CI fail.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks"
COLAB = ROOT / "colab"
GPU_CHAPTERS = ("02_kernel", "04_throughput")  # live GPU timings: ask Colab for a GPU runtime


def chapter_sources() -> list[Path]:
    return sorted(SOURCES.glob("*.py"))


REPOSITORY = "https://github.com/flashspec/flashspec"


def setup_cells(source: Path) -> list[nbformat.NotebookNode]:
    """The Colab-only first cells: clone the repository (code and committed results), install the
    package (with the NF4 extra on a GPU runtime for the chapters that use it), its lab (the chapters import
    flashspec_lab) and myst-nb (their `glue` calls), and work from notebooks/.
    They live only in the Colab copy, so the book opens each chapter with its ideas, not with set-up."""
    extras = ('extras = "[nf4]" if shutil.which("nvidia-smi") else ""  # bitsandbytes 4-bit on a GPU runtime\n'
              if source.stem in GPU_CHAPTERS else 'extras = ""\n')
    code = ("# Colab set-up: fetch the repository and install flashspec into this runtime (runs once per session)\n"
            "import importlib, os, shutil, subprocess, sys\n"
            "from pathlib import Path\n\n"
            "if not Path(\"flashspec\").exists() and Path.cwd().name != \"notebooks\":\n"
            f"    subprocess.run([\"git\", \"clone\", \"--depth\", \"1\", \"{REPOSITORY}\"], check=True)\n"
            + extras +
            "if Path(\"flashspec\").exists():  # the library, its lab, and myst-nb for the chapters' glue\n"
            "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", f\"./flashspec{extras}\",\n"
            "                    \"./flashspec/lab\", \"myst-nb\"], check=True)\n"
            "    os.chdir(\"flashspec/notebooks\")\n"
            "importlib.invalidate_caches()")
    return [nbformat.v4.new_markdown_cell("**On Colab, run this cell first**: it clones the FlashSpec repository and "
                                          "installs the package (about a minute)."),
            nbformat.v4.new_code_cell(code)]


def colab_notebook(source: Path) -> nbformat.NotebookNode:
    """The chapter as an output-free notebook with Colab metadata (a GPU runtime where the chapter times one),
    opened by the Colab-only set-up cells."""
    notebook = jupytext.read(source)
    notebook.cells = setup_cells(source) + notebook.cells
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["colab"] = {"name": source.stem + ".ipynb", "provenance": []}
    if source.stem in GPU_CHAPTERS:
        notebook.metadata["accelerator"] = "GPU"
    for index, cell in enumerate(notebook.cells):
        cell.id = f"{source.stem}-{index}"  # stable ids: regenerating an unchanged chapter changes nothing
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return notebook


def target_path(source: Path) -> Path:
    return COLAB / f"{source.stem}.ipynb"


def fingerprint(notebook: nbformat.NotebookNode) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(cell.cell_type, cell.source, tuple(cell.metadata.get("tags", ()))) for cell in notebook.cells]


def stale_notebooks() -> list[str]:
    """Names of colab/ notebooks that are missing, out of date, or have no chapter any more."""
    problems = []
    expected = {target_path(source): source for source in chapter_sources()}
    for path, source in expected.items():
        if not path.exists():
            problems.append(f"{path.name}: missing")
        elif fingerprint(nbformat.read(path, as_version=4)) != fingerprint(colab_notebook(source)):
            problems.append(f"{path.name}: differs from notebooks/{source.name}")
    problems += [f"{path.name}: no chapter notebooks/{path.stem}.py"
                 for path in sorted(COLAB.glob("*.ipynb")) if path not in expected]
    return problems


def write_all() -> list[Path]:
    COLAB.mkdir(exist_ok=True)
    written = []
    for source in chapter_sources():
        path = target_path(source)
        nbformat.write(colab_notebook(source), path)
        written.append(path)
    for path in COLAB.glob("*.ipynb"):
        if path not in written:
            path.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale notebooks (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_notebooks()
        for problem in problems:
            print(f"colab/{problem}", file=sys.stderr)
        if problems:
            print("run: python tools/colab_notebooks.py", file=sys.stderr)
        return 1 if problems else 0
    for path in write_all():
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
