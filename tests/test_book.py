"""Static checks of the Jupyter Book: the table of contents, the notebook sources, citations and the
build settings that make a failing cell fail CI. Fast (nothing is executed); the book build and nbval
execute the chapters."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import subprocess
from pathlib import Path

import jupytext
import pytest
import yaml

import flashspec
import flashspec_lab

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
    """Module-level public functions and classes defined in flashspec and the lab (their subpackages too)."""
    names: set[str] = set()
    modules = [info.name for package in (flashspec, flashspec_lab)
               for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
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
    assert {"verify", "warp_logits", "SamplingParams", "sample_sequences", "expected_tokens_per_step",
            "load_zoo", "prepare_verify", "caption"} <= names


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


def _load_tool(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_colab_notebooks_match_the_chapters() -> None:
    """colab/*.ipynb (what the Colab buttons open) is regenerated whenever a chapter changes."""
    tool = _load_tool(ROOT / "tools" / "colab_notebooks.py", "colab_notebooks")
    assert tool.stale_notebooks() == [], "colab/ is stale: run `python tools/colab_notebooks.py`"
    for path in sorted((ROOT / "colab").glob("*.ipynb")):
        notebook = jupytext.read(path)
        outputs = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.get("outputs")]
        assert not outputs, f"{path.name} carries outputs; Colab copies must be output-free"


def test_colab_check_catches_a_stale_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _load_tool(ROOT / "tools" / "colab_notebooks.py", "colab_notebooks_stale")
    source = tmp_path / "notebooks" / "01_demo.py"
    source.parent.mkdir()
    source.write_text("# %% [markdown]\n# # Demo\n\n# %%\nimport flashspec\n")
    monkeypatch.setattr(tool, "SOURCES", source.parent)
    monkeypatch.setattr(tool, "COLAB", tmp_path / "colab")
    assert tool.stale_notebooks() == ["01_demo.ipynb: missing"]
    tool.write_all()
    assert tool.stale_notebooks() == []
    source.write_text(source.read_text() + "print(1)\n")
    assert tool.stale_notebooks() == ["01_demo.ipynb: differs from notebooks/01_demo.py"]
    assert tool.main(["--check"]) == 1


def test_colab_button_is_rewritten_to_the_committed_notebook() -> None:
    extension = _load_tool(ROOT / "book" / "_ext" / "colab_links.py", "colab_links")
    theme_url = "https://colab.research.google.com/github/flashspec/flashspec/blob/main/notebooks/05_domain_shift.ipynb"
    context = {"header_buttons": [{"buttons": [{"text": "Colab", "url": theme_url},
                                               {"text": "Binder", "url": "https://mybinder.org/x"}]}]}
    extension.rewrite_colab_links(None, "notebooks/05_domain_shift", "page.html", context, None)
    buttons = context["header_buttons"][0]["buttons"]
    assert buttons[0]["url"] == ("https://colab.research.google.com/github/flashspec/flashspec/blob/main/"
                                 "colab/05_domain_shift.ipynb")
    assert (ROOT / "colab" / "05_domain_shift.ipynb").exists()
    assert buttons[1]["url"] == "https://mybinder.org/x"
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["local_extensions"] == {"colab_links": "book/_ext"}


def test_intro_has_a_colab_badge_per_chapter() -> None:
    intro = (ROOT / "book" / "intro.md").read_text()
    linked = set(re.findall(r"colab\.research\.google\.com/github/flashspec/flashspec/blob/main/colab/(\w+)\.ipynb", intro))
    chapters = {path.stem for path in NOTEBOOKS}
    assert linked == chapters, f"intro badges {sorted(linked)} != chapters {sorted(chapters)}"
    assert all((ROOT / "colab" / f"{stem}.ipynb").exists() for stem in linked)
