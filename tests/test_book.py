"""Static checks of the Jupyter Book: the table of contents, the notebook sources, citations and the
build settings that make a failing cell fail CI. Fast (nothing is executed); the book build and nbval
execute the chapters."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
from pathlib import Path

import jupytext
import pytest
import yaml

import flashspec

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py")) + sorted((ROOT / "notebooks").glob("*.md"))
PAGE_SUFFIXES = (".md", ".py", ".ipynb")


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return files


def resolve_page(name: str) -> Path | None:
    for suffix in PAGE_SUFFIXES:
        if (ROOT / f"{name}{suffix}").exists():
            return ROOT / f"{name}{suffix}"
    return None


def code_cells(path: Path) -> list[dict]:
    return [cell for cell in jupytext.read(path).cells if cell.cell_type == "code"]


def test_every_toc_entry_exists() -> None:
    missing = [name for name in toc_files() if resolve_page(name) is None]
    assert not missing, f"_toc.yml lists pages that do not exist: {missing}"


def test_every_notebook_is_in_the_toc() -> None:
    listed = {resolve_page(name) for name in toc_files()}
    orphans = [path.name for path in NOTEBOOKS if path not in listed]
    assert not orphans, f"notebooks missing from _toc.yml (they would never be built or checked): {orphans}"


def test_no_ipynb_is_committed() -> None:
    tracked = subprocess.run(["git", "ls-files", "notebooks"], cwd=ROOT, capture_output=True, text=True).stdout
    committed = [line for line in tracked.splitlines() if line.endswith(".ipynb")]
    assert not committed, f"commit jupytext sources only, not notebooks with outputs: {committed}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_is_an_executable_jupytext_source(path: Path) -> None:
    notebook = jupytext.read(path)
    assert "jupytext" in notebook.metadata, f"{path.name}: no jupytext header; myst-nb would not execute it"
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec python3 missing"
    assert code_cells(path), f"{path.name} has no code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_imports_flashspec(path: Path) -> None:
    source = "\n".join(cell.source for cell in code_cells(path))
    assert re.search(r"^\s*(import flashspec|from flashspec)", source, re.M), f"{path.name} never imports flashspec"


def library_names() -> set[str]:
    """Module-level public functions and classes defined in flashspec (and flashspec.kernels)."""
    names: set[str] = set()
    modules = [flashspec.__name__ + "." + info.name for info in pkgutil.iter_modules(flashspec.__path__)]
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an optional dependency (e.g. triton) is missing
            continue
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != module_name:
                continue
            if callable(value):
                names.add(name)
    return names


def test_library_names_see_the_public_api() -> None:
    names = library_names()
    assert {"verify", "warp_logits", "SamplingParams", "sample_sequences", "expected_tokens_per_step"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_does_not_redefine_library_functions(path: Path) -> None:
    """A notebook imports what flashspec has; it never writes its own copy under the same name."""
    defined = set()
    for cell in code_cells(path):
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
    clashes = sorted(defined & library_names())
    assert not clashes, f"{path.name} re-implements flashspec functions {clashes}: import them instead"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_gpu_only_cells_are_skipped_by_both_runners(path: Path) -> None:
    """myst-nb honours `skip-execution`, nbval only `nbval-skip`: a GPU-only cell needs both."""
    for cell in code_cells(path):
        tags = set(cell.metadata.get("tags", []))
        if tags & {"skip-execution", "nbval-skip"}:
            assert {"skip-execution", "nbval-skip"} <= tags, f"{path.name}: a cell has only {sorted(tags)}"


def test_every_citation_is_in_the_bibliography() -> None:
    keys = set(re.findall(r"@\w+\{([^,\s]+),", (ROOT / "book" / "references.bib").read_text()))
    pages = NOTEBOOKS + sorted((ROOT / "book").glob("*.md"))
    cited = {key.strip() for page in pages for group in re.findall(r"\{cite[pt]?\}`([^`]+)`", page.read_text())
             for key in group.split(",")}
    assert cited, "no citations found: the pattern is broken"
    assert cited <= keys, f"cited but not in book/references.bib: {sorted(cited - keys)}"


def test_build_settings_make_a_failing_cell_fail_the_build() -> None:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "force"
    assert config["execute"]["allow_errors"] is False
    assert config["sphinx"]["config"]["nb_execution_raise_on_error"] is True
    excluded = config["exclude_patterns"]
    assert "notebooks/*.ipynb" in excluded and "_build" in excluded, "generated notebooks must not become pages"
    assert "book/references.bib" in config["bibtex_bibfiles"]
