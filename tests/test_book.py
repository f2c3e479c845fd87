"""Static checks of the Jupyter Book: the table of contents, the notebook sources, the rules every tutorial
chapter keeps (length, no project history, numbers through glue), citations of the paper and of the results files,
the README's front door and the build settings that make a failing cell fail CI. Fast (nothing is executed); the
book build and nbval execute the pages."""
from __future__ import annotations

import ast
import fnmatch
import importlib
import importlib.util
import json
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
RESULTS = ROOT / "results"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py")) + sorted((ROOT / "notebooks").glob("*.md"))
LAB_PAGES = sorted((ROOT / "book" / "lab").glob("*.py"))  # the lab notebook's executed pages
SOURCES = NOTEBOOKS + LAB_PAGES  # every jupytext page the book executes
PAGE_SUFFIXES = (".md", ".py", ".ipynb")
MAX_CHAPTER_LINES = 700
MAX_MARKDOWN_DISPLAYS = 3
MAX_README_LINES = 150
README_TEST = "python -m pytest -q -n auto"


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
    orphans = [path.relative_to(ROOT).as_posix() for path in SOURCES if path not in listed]
    assert not orphans, f"notebooks missing from _toc.yml (they would never be built or checked): {orphans}"


def test_no_ipynb_is_committed() -> None:
    tracked = subprocess.run(["git", "ls-files", "notebooks"], cwd=ROOT, capture_output=True, text=True).stdout
    committed = [line for line in tracked.splitlines() if line.endswith(".ipynb")]
    assert not committed, f"commit jupytext sources only, not notebooks with outputs: {committed}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
def test_notebook_is_an_executable_jupytext_source(path: Path) -> None:
    notebook = jupytext.read(path)
    assert "jupytext" in notebook.metadata, f"{path.name}: no jupytext header; myst-nb would not execute it"
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec python3 missing"
    assert code_cells(path), f"{path.name} has no code"


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
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


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
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


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
def test_gpu_only_cells_are_skipped_by_both_runners(path: Path) -> None:
    """myst-nb honours `skip-execution`, nbval only `nbval-skip`: a GPU-only cell needs both."""
    for cell in code_cells(path):
        tags = set(cell.metadata.get("tags", []))
        if tags & {"skip-execution", "nbval-skip"}:
            assert {"skip-execution", "nbval-skip"} <= tags, f"{path.name}: a cell has only {sorted(tags)}"


def test_every_citation_is_in_the_bibliography() -> None:
    keys = set(re.findall(r"@\w+\{([^,\s]+),", (ROOT / "book" / "references.bib").read_text()))
    pages = SOURCES + sorted((ROOT / "book").rglob("*.md"))
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


def test_paper_and_artifact_are_cited_properly() -> None:
    """The paper keeps its key; CITATION.cff prefers it and describes the artifact (this repository)."""
    bib = (ROOT / "book" / "references.bib").read_text()
    paper = bib[bib.index("@misc{flashspec_paper,"):].split("\n}\n")[0]
    for part in ("Adaptive Speculative Decoding with Online Bandit Draft Selection", "Myet, Min Htet", "2026",
                 "CC BY 4.0"):
        assert part in paper, f"the paper's entry lacks {part!r}"
    assert "@misc{flashspec_artifact," in bib
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    preferred = cff["preferred-citation"]
    assert preferred["title"].startswith("FlashSpec: Adaptive Speculative Decoding")
    assert preferred["license"] == "CC-BY-4.0" and str(preferred["date-published"]) == "2026-06-29"
    assert cff["license"] == "Apache-2.0" and cff["repository-code"].endswith("flashspec/flashspec")


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


def test_lab_pages_get_no_colab_button() -> None:
    """A lab page has no Colab copy: its Colab button goes, and a launch group left empty goes with it."""
    extension = _load_tool(ROOT / "book" / "_ext" / "colab_links.py", "colab_links_lab")
    colab = {"text": "Colab", "url": "https://colab.research.google.com/github/flashspec/flashspec/blob/main/"
                                     "book/lab/verify_kernel.ipynb"}
    binder = {"text": "Binder", "url": "https://mybinder.org/x"}
    context = {"header_buttons": [{"type": "group", "buttons": [dict(colab)]},
                                  {"type": "group", "buttons": [dict(colab), binder]},
                                  {"type": "link", "url": "https://github.com/flashspec/flashspec"}]}
    extension.rewrite_colab_links(None, "book/lab/verify_kernel", "page.html", context, None)
    assert context["header_buttons"] == [{"type": "group", "buttons": [binder]},
                                         {"type": "link", "url": "https://github.com/flashspec/flashspec"}]


# The tutorial chapters' rules ------------------------------------------------------------------------------------

HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
RESULTS_PATH = re.compile(r"results/[\w./*{}<>-]+")
HISTORY = {
    "the word 'issue'": re.compile(r"\bissues?\b", re.I),
    "'device time'": re.compile(r"\bdevice[- ]time\b", re.I),
    "'carry' as a word": re.compile(r"\bcarr(y|ied)\b", re.I),  # "a carried Triton": what ran where, not the code
    "a build counted by number": re.compile(
        r"\bbuilds? (one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\b|"
        r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(st|nd|rd|th)) "
        r"builds?\b", re.I),
}


def results_names() -> set[str]:
    return {path.relative_to(RESULTS).as_posix() for path in RESULTS.rglob("*") if path.is_file()}


def commit_hashes(text: str) -> list[str]:
    """Hex strings of 7-40 characters with a digit and a letter (a commit hash) outside results paths and outside
    the names of results files."""
    text = RESULTS_PATH.sub(" ", text)
    for name in sorted(results_names(), key=len, reverse=True):
        text = text.replace(Path(name).name, " ")
    return [word for word in HEX.findall(text) if re.search(r"\d", word) and re.search(r"[a-f]", word)]


def history_found(text: str) -> list[str]:
    """What in `text` tells the project's history instead of what the code does."""
    found = [f"commit hash {word}" for word in commit_hashes(text)]
    found += [f"{what}: {match.group(0)!r}" for what, pattern in HISTORY.items() for match in pattern.finditer(text)]
    return found


def test_the_history_check_sees_what_it_must() -> None:
    assert history_found("measured at 3f92d0e, see the issue; two builds ago (the tenth build) we carried it")
    assert history_found("device time ran out") and history_found("build twelve")
    assert not history_found("see results/verify_h200_standings_f8ef125_run3.json and sha256 "
                             + "0123456789abcdef" * 4 + "; 30_000 rows; the tissue; a0 = 0xdeadbeef1")
    assert not history_found('load_result("gpu_tests_h200_362430f.log"), the cached build')


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_chapter_fits_its_length(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_CHAPTER_LINES, (f"{path.name} has {lines} source lines (at most {MAX_CHAPTER_LINES}): move "
                                        "evidence to the lab notebook (book/lab/)")


MAX_CODE_COLUMNS = 88  # what the column holds at 1366 px in the code font of _static/code.css (89 characters)


def wide_code_lines(source: str) -> list[int]:
    """Line numbers of a jupytext chapter's code cells longer than MAX_CODE_COLUMNS (Markdown cells wrap)."""
    wide, markdown = [], False
    for number, line in enumerate(source.splitlines(), 1):
        if line.startswith("# %%"):
            markdown = "[markdown]" in line
        elif not markdown and len(line) > MAX_CODE_COLUMNS:
            wide.append(number)
    return wide


def test_the_width_check_reads_cells() -> None:
    source = "# %% [markdown]\n# " + "m" * 100 + "\n\n# %%\nx = 1\n" + "y" * 89 + "\n"
    assert wide_code_lines(source) == [6]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_chapter_code_fits_the_column(path: Path) -> None:
    wide = wide_code_lines(path.read_text())
    assert not wide, f"{path.name}: code lines {wide} are wider than {MAX_CODE_COLUMNS} columns and would be cut"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_chapter_tells_no_project_history(path: Path) -> None:
    found = history_found(path.read_text())
    assert not found, f"{path.name}: say what the code does, not its history: {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_chapter_puts_numbers_in_prose_through_glue(path: Path) -> None:
    count = path.read_text().count("display(Markdown(")
    assert count <= MAX_MARKDOWN_DISPLAYS, (f"{path.name} has {count} display(Markdown(...)) cells (at most "
                                            f"{MAX_MARKDOWN_DISPLAYS}): glue the numbers into Markdown cells")


# Every results file the book cited before the tutorial was rewritten (chapters and book pages as they stood then):
# the rewrite moves evidence to the lab notebook, it does not drop it.
CITED_BEFORE_REWRITE = (
    "adaptive_gamma_cpu.json", "adaptive_gamma_cpu_absolute_reward.log", "adaptive_gamma_cpu_db0095d.json",
    "adaptive_gamma_cpu_drawn.json", "bandits_cost.json", "bandits_nonstationary.json", "bandits_reproduce.json",
    "bandits_sensitivity.json", "bench_engine_nvidia_h200.json", "bench_engine_nvidia_h200_rerun.json",
    "bench_fast_b1_autotune_h200.json", "bench_fast_b1_b8_compile_h200.json", "bench_fast_b1_h200.json",
    "bench_fast_b32_compile_h200.json", "bench_fast_b32_fastonly_compile_h200.json", "bench_fast_nf4_h200.json",
    "bench_fast_zoo_gpu_compile_h200.log", "bench_fast_zoo_gpu_h200.json", "bench_runner_h200.json",
    "exactness_kernels_tests_h200.log", "feature_draft_probe_eagle3_100s_h200.json",
    "feature_draft_probe_eagle3_250s_h200.json", "feature_draft_probe_eagle3_ttt_h200.json",
    "feature_draft_probe_h200.json", "gpu_tests_h200_362430f.log", "gpu_tests_triton39_f93f0d7.log",
    "prefill_profile_eager_h200.json", "prefill_profile_h200.json", "public_code_0.1.4.json",
    "real_pool_adaptive_speed_h200.json", "real_pool_breakdown_h200.json", "real_pool_calibrated_h200.json",
    "real_pool_compiled_h200.json", "real_pool_compiled_h200.log", "real_pool_compiled_rebuild_h200.json",
    "real_pool_features_240s_h200.json", "real_pool_features_h200.json", "real_pool_features_smoke_h200.json",
    "real_pool_features_speed_h200.json", "real_pool_gamma_split_h200.json",
    "real_pool_gamma_split_run2_h200.json", "real_pool_gamma_ts_drawn_cut_3027b39.log",
    "real_pool_gamma_ts_drawn_h200.json", "real_pool_gamma_ts_drawn_run2_h200.json",
    "real_pool_gamma_ts_drawn_run3_h200.json", "real_pool_gamma_ts_drawn_run4_h200.json",
    "real_pool_gamma_ts_h200.json", "real_pool_gamma_ts_priced_h200.json",
    "real_pool_gamma_ts_priced_rerun_h200.json", "real_pool_gamma_ts_shared_h200.json", "real_pool_h200.json",
    "real_pool_h200.log", "real_pool_prefill_graphs_h200.json", "real_pool_prompt_lookup_h200.json",
    "real_pool_prompt_lookup_run2_h200.json", "real_pool_rebuild_h200.json", "real_pool_switching_h200.json",
    "tree_headroom_smollm2_cpu.json", "verify_cluster_first_h200_triton39.json",
    "verify_cluster_h200_triton39.json", "verify_fast_math_h200_triton39.json", "verify_h200.json",
    "verify_h200_3391351.json", "verify_h200_3391351_run1.json", "verify_h200_blocks_8bdaf87.json",
    "verify_h200_blocks_all_decba52.json", "verify_h200_blocks_b64_44a4c2b.json",
    "verify_h200_host_state_2b88980.json", "verify_h200_lanes_ced19fd.json", "verify_h200_lanes_ced19fd_run2.json",
    "verify_h200_log_probs_c303303.json", "verify_h200_one_pass_tail_7370da2.json",
    "verify_h200_standings_f8ef125.json", "verify_h200_standings_f8ef125_run2.json",
    "verify_h200_standings_f8ef125_run3.json", "verify_h200_stats_grid_ae19163.json",
    "verify_h200_straight_5a69dae.json", "verify_h200_straight_5a69dae_run2.json",
    "verify_h200_straight_5a69dae_run3.json", "verify_h200_straight_5a69dae_run4.json",
    "verify_h200_straight_all_f93f0d7.json", "verify_h200_straight_lanes_80261a5.json",
    "verify_h200_target_only_13563fb.json", "verify_interference_h200.json", "verify_ncu_h200_40ffb85.json",
    "verify_ncu_h200_ced19fd.json", "verify_sass_sm90.json", "verify_sass_sm90_7cdf841.json",
    "verify_triton39_h200.json", "zoo_cpu_acceptance.json", "zoo_cpu_build.json", "zoo_cpu_perplexity.json",
    "zoo_cpu_switching.json", "zoo_design/cpu_finetuned_steps.json", "zoo_design/cpu_from_scratch_steps.json",
    "zoo_design/cpu_no_docstrings_finetuned.json", "zoo_design/cpu_no_docstrings_from_scratch.json",
    "zoo_design/cpu_stronger_target_from_scratch.json", "zoo_design/h200_finetuned.json",
    "zoo_design/h200_from_scratch.json", "zoo_gpu_acceptance.json", "zoo_gpu_build.json",
    "zoo_gpu_perplexity.json", "zoo_gpu_switching.json", "zoo_gpu_switching_no_warmup.json",
)


def cited_results(text: str, names: set[str]) -> set[str]:
    """The results files `text` cites: by a results/ path (globs and <placeholders> expanded against `names`), or by
    a quoted file name, or a quoted record name without its .json."""
    cited = set()
    for token in re.findall(r"results/([\w./*<>{}-]+)", text):
        token = re.sub(r"<[^>]*>|\{[^}]*\}", "*", token.rstrip(".,;:)"))
        if re.search(r"[A-Za-z0-9]", token.replace("json", "")):
            cited |= {name for name in names if fnmatch.fnmatch(name, token)}
    for name in names:
        stem = name.rsplit(".", 1)[0]
        quoted = r"[\"'/`]" + re.escape(name) + r"[\"'`]"
        if re.search(quoted, text) or (name.endswith(".json") and re.search(f"[\"']{re.escape(stem)}[\"']", text)):
            cited.add(name)
    return cited


def test_cited_results_reads_paths_globs_and_names() -> None:
    names = {"a_h200.json", "a_h200_run2.json", "b.log", "zoo_cpu_x.json"}
    assert cited_results("see results/a_h200*.json", names) == {"a_h200.json", "a_h200_run2.json"}
    assert cited_results('load_result("a_h200") and Path(x) / "b.log"', names) == {"a_h200.json", "b.log"}
    assert cited_results("results/zoo_<size>_x.json", names) == {"zoo_cpu_x.json"}
    assert cited_results("results/{name} and a_h200.json in prose", names) == set()


def test_results_cited_before_the_rewrite_are_still_cited() -> None:
    names = results_names()
    assert set(CITED_BEFORE_REWRITE) <= names, f"gone from results/: {sorted(set(CITED_BEFORE_REWRITE) - names)}"
    pages = [path for folder in ("notebooks", "book") for path in sorted((ROOT / folder).rglob("*"))
             if path.suffix in (".py", ".md") and "_ext" not in path.parts]
    cited = set().union(*(cited_results(page.read_text(), names) for page in pages))
    missing = sorted(set(CITED_BEFORE_REWRITE) - cited)
    assert not missing, (f"{len(missing)} results files the book cited are cited nowhere in notebooks/ or book/ "
                         f"now (cite each by its results/ path where its evidence moved): {missing}")


# The front door ---------------------------------------------------------------------------------------------------

def test_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = len(readme.splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"
    assert 'pip install -c constraints.txt -e ".[dev]" -e lab' in readme
    assert README_TEST in readme and README_TEST in (ROOT / ".ci" / "run").read_text()
    assert "```bibtex" in readme and "flashspec_paper" in readme


def test_readme_headline_table_links_existing_records() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- headline:start")[1].split("<!-- headline:end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| What")]
    assert 6 <= len(rows) <= 8, f"the headline table has {len(rows)} rows (6-8)"
    for row in rows:
        links = re.findall(r"\]\((results/[^)]+)\)", row)
        assert links, f"a headline row links no results file: {row[:80]}"
        missing = [link for link in links if not (ROOT / link).is_file()]
        assert not missing, f"a headline row links missing files {missing}"
    tool = _load_tool(ROOT / "tools" / "readme_table.py", "readme_table")
    assert tool.main(["--check"]) == 0, "README.md's headline table is stale: run python tools/readme_table.py"


def test_results_index_is_current() -> None:
    tool = _load_tool(ROOT / "tools" / "results_index.py", "results_index")
    assert tool.stale() == [], "run python tools/results_index.py"


def test_results_index_check_catches_a_new_file(tmp_path: Path) -> None:
    tool = _load_tool(ROOT / "tools" / "results_index.py", "results_index_stale")
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "x.json").write_text(json.dumps({"provenance": {"command": "python -m experiments.x --out o.json",
                                                              "git_sha": "0123456789", "hardware": {"cpu_count": 2},
                                                              "date_utc": "2026-12-01T00:00:00+00:00"},
                                               "settings": {}, "results": {}}))
    readme = folder / "README.md"
    readme.write_text(f"# Records\n\n{tool.START}\n{tool.END}\n")
    assert any("stale" in problem for problem in tool.stale(folder, readme))
    readme.write_text(tool.render(readme.read_text(), folder))
    assert [problem for problem in tool.stale(folder, readme) if "stale" in problem] == []
    assert "| `x.json` | `experiments.x` | CPU ×2 | 2026-12-01 | 0123456 |" in readme.read_text()
    (folder / "y.log").write_text("3 passed in 1.0s\n")
    assert any("stale" in problem for problem in tool.stale(folder, readme))
