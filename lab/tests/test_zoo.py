"""Model zoo: deterministic builds, the cache (hit, corrupt, missing), loading through `flashspec.load_model`,
specialisation of the cpu zoo, and its command line and report (`experiments/zoo.py`).

The trained cpu zoo takes minutes to build, so its tests (the drafts specialise, the engine accepts more on a
draft's own domain) run where it is in the cache (`flashspec zoo build --size cpu`) and skip elsewhere, CI among
them, unless FLASHSPEC_BUILD_CPU_ZOO=1 asks them to build it. Loading, determinism and the cache use the
seconds-long "micro" config in a temporary cache, everywhere.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from experiments import zoo as zoo_experiments
from flashspec_lab import corpora, provenance, zoo


@pytest.fixture()
def micro_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def micro_corpora() -> dict[str, corpora.DomainCorpus]:
    return corpora.assemble(zoo.SIZES["micro"].train_chars_per_domain)


# The tests of the trained CPU zoo share one xdist worker (`--dist loadgroup`, in pyproject's addopts): asked to
# build it (FLASHSPEC_BUILD_CPU_ZOO=1), two workers would otherwise build it side by side.
CPU_ZOO_WORKER = pytest.mark.xdist_group("cpu_zoo")


@pytest.fixture(scope="module")
def cpu_zoo() -> zoo.Zoo:
    """The trained cpu zoo from the cache; skipped where it is not built (module docstring)."""
    if os.environ.get("FLASHSPEC_BUILD_CPU_ZOO") != "1":
        why = "no zoo in the cache"
        if any(zoo.cache_root().glob("*/manifest.json")):  # else no need to assemble the corpora for its key
            try:
                zoo.check_zoo_dir(zoo.cache_path("cpu"))
                why = ""
            except ValueError as missing:
                why = str(missing)
        if why:
            pytest.skip(f"the trained cpu zoo is not built here ({why}): `flashspec zoo build --size cpu` builds "
                        "it in minutes, or set FLASHSPEC_BUILD_CPU_ZOO=1")
    return zoo.load_zoo("cpu", device="cpu", progress=False)


def test_micro_build_is_deterministic(tmp_path: Path, micro_corpora: dict[str, corpora.DomainCorpus]) -> None:
    first = zoo.build_zoo("micro", tmp_path / "a", device="cpu", progress=False, domain_corpora=micro_corpora)
    second = zoo.build_zoo("micro", tmp_path / "b", device="cpu", progress=False, domain_corpora=micro_corpora)
    manifest_a, manifest_b = zoo.check_zoo_dir(first), zoo.check_zoo_dir(second)
    assert manifest_a["key"] == manifest_b["key"]
    hashes = {name: info["weights_sha256"] for name, info in manifest_a["models"].items()}
    assert hashes == {name: info["weights_sha256"] for name, info in manifest_b["models"].items()}
    assert len(set(hashes.values())) == len(hashes)  # every model differs (own seed, own data)
    assert manifest_a["files"] == manifest_b["files"]  # tokenizer, weights, prompts: byte-identical
    other_seed = zoo.SIZES["micro"].with_overrides(seed=1)
    third = zoo.build_zoo(other_seed, tmp_path / "c", device="cpu", progress=False, domain_corpora=micro_corpora)
    assert zoo.check_zoo_dir(third)["models"]["target"]["weights_sha256"] != hashes["target"]


def test_cache_hit_corrupt_and_missing(micro_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = zoo.zoo_dir("micro", device="cpu", progress=False)
    assert path.parent == micro_cache / "zoo" and zoo.check_zoo_dir(path)

    def no_build(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a valid cache must not be rebuilt")

    with monkeypatch.context() as patch:
        patch.setattr(zoo, "build_zoo", no_build)
        assert zoo.zoo_dir("micro", device="cpu", progress=False) == path

    weights = path / "draft-python" / "model.safetensors"
    weights.write_bytes(b"not a safetensors file")
    with pytest.warns(zoo.ZooCacheWarning, match="rebuilding"):
        rebuilt = zoo.zoo_dir("micro", device="cpu", progress=False)
    assert rebuilt == path and zoo.check_zoo_dir(path)

    (path / zoo.MANIFEST).unlink()
    with pytest.warns(zoo.ZooCacheWarning, match="no manifest.json"):
        zoo.zoo_dir("micro", device="cpu", progress=False)
    assert zoo.check_zoo_dir(path)

    zoo.load_zoo("micro", device="cpu", progress=False)  # loads from the repaired cache


def test_models_load_through_flashspec_load_model(tmp_path: Path,
                                                  micro_corpora: dict[str, corpora.DomainCorpus]) -> None:
    from flashspec import load_model
    from flashspec.models import load_tokenizer

    folder = zoo.build_zoo("micro", tmp_path / "zoo", device="cpu", progress=False, domain_corpora=micro_corpora)
    micro = zoo.load_zoo("micro", device="cpu", path=folder, progress=False)
    target = load_model(str(folder / "target"), dtype="fp32", device="cpu")
    draft = load_model(str(folder / "draft-python"), dtype="fp32", device="cpu")
    tokenizer = load_tokenizer(str(folder / "draft-python"))
    ids = tokenizer("def main(argv):\n    return 0\n", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == "def main(argv):\n    return 0\n"  # byte-level: lossless
    assert target(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))
    assert zoo.count_parameters(target) > 3 * zoo.count_parameters(draft)  # drafts several times smaller
    assert torch.equal(target.model.embed_tokens.weight, micro.target.model.embed_tokens.weight)


@CPU_ZOO_WORKER
def test_cpu_zoo_drafts_specialise(cpu_zoo: zoo.Zoo) -> None:
    """The zoo's target on the cpu size: each specialist's acceptance on its own domain beats every other
    draft's, generalist included, by >= 0.10 (exact Σ min(p, q), T = 1, held-out text), and each specialist
    has the lowest held-out perplexity of all drafts on its domain."""
    assert all(zoo.count_parameters(cpu_zoo.target) >= 4 * zoo.count_parameters(draft)
               for draft in cpu_zoo.drafts.values())
    context = cpu_zoo.manifest["config"]["context"]
    acceptance = {name: {d: zoo.expected_acceptance(cpu_zoo.target, draft, cpu_zoo.heldout[d], context, 4096)
                         for d in cpu_zoo.domains} for name, draft in cpu_zoo.drafts.items()}
    margins = zoo.specialisation_margins(acceptance, cpu_zoo.domains, required=0.10)
    assert margins["passed"], margins
    for domain in cpu_zoo.domains:
        perplexities = {name: zoo.perplexity(draft, cpu_zoo.heldout[domain], context, 1024)
                        for name, draft in cpu_zoo.drafts.items()}
        assert min(perplexities, key=perplexities.get) == domain, perplexities


@CPU_ZOO_WORKER
def test_engine_acceptance_on_cpu_zoo(cpu_zoo: zoo.Zoo) -> None:
    own = zoo.engine_acceptance(cpu_zoo, "cpp", "cpp", gamma=4, max_new_tokens=16, num_prompts=4)
    foreign = zoo.engine_acceptance(cpu_zoo, "prose", "cpp", gamma=4, max_new_tokens=16, num_prompts=4)
    assert 0.0 <= foreign["mean_acceptance"] < own["mean_acceptance"] <= 1.0
    assert own["generated_tokens"] == 4 * 16


def test_cli_info_and_bad_size(micro_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert zoo_experiments.main(["info", "--size", "micro"]) == 0
    assert "not built" in capsys.readouterr().out
    with pytest.raises(ValueError, match="size"):
        zoo.get_config("huge")
    with pytest.raises(SystemExit):
        zoo_experiments.main(["build", "--size", "huge"])


def test_report_writes_files(micro_cache: Path, tmp_path: Path) -> None:
    budget = zoo_experiments.MeasurementBudget(matrix_prompts=1, matrix_new_tokens=3, switching_requests=3,
                                               switching_block=1, switching_new_tokens=3, bandits=("thompson",))
    files = zoo_experiments.report("micro", tmp_path / "out", budget=budget, progress=False)
    assert len(files) == 6 and all(f.stat().st_size > 0 for f in files)
    record = json.loads((tmp_path / "out" / "zoo_micro_switching.json").read_text())
    assert list(record) == list(provenance.RESULT_KEYS)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    assert record["provenance"]["git_sha"] == head
    acceptance = json.loads((tmp_path / "out" / "zoo_micro_acceptance.json").read_text())["results"]
    exact = acceptance["teacher_forced_expected_acceptance"]
    assert record["settings"]["oracle_arms"] == {d: max(exact, key=lambda name: exact[name][d])
                                                 for d in acceptance["domains"]}
    runs = record["results"]["blocks"]["runs"]
    assert {"oracle", "thompson", "thompson+reset", "fixed:general"} <= set(runs)


def test_specialisation_margins() -> None:
    table = {"a": {"a": 0.7, "b": 0.2}, "b": {"a": 0.65, "b": 0.5}, "general": {"a": 0.5, "b": 0.45}}
    result = zoo.specialisation_margins(table, ["a", "b"])
    assert result["margins"] == pytest.approx({"a": 0.05, "b": 0.05}) and not result["passed"]


def test_design_sweeps_train_through_the_zoo_plan() -> None:
    """experiments/zoo_design.py trains its recipes with the zoo's own plan: an empty recipe is the zoo's drafts."""
    from experiments import zoo_design

    config = zoo.SIZES["micro"]
    same, plan = zoo_design.recipe_plan(config, {"name": "zoo"}, "fine-tuned")
    assert same == config and plan == zoo.training_plan(config)[1:]
    recipe = {"name": "s", "steps": 9, "lr": 0.1, "batch": 3, "draft": {"hidden_size": 24}}
    _, scratch = zoo_design.recipe_plan(config, recipe, "from-scratch")
    assert [step.name for step in scratch] == ["draft-general", "draft-python", "draft-prose", "draft-cpp"]
    assert all((step.start_from, step.steps, step.lr, step.batch_size, step.spec.hidden_size) == (None, 9, 0.1, 3, 24)
               for step in scratch)
    _, tuned = zoo_design.recipe_plan(config, {"name": "t", "ft_steps": 7, "ft_lr": 0.2, "ft_batch": 5}, "fine-tuned")
    assert [(step.start_from, step.steps, step.lr, step.batch_size) for step in tuned[1:]] == \
        [("draft-general", 7, 0.2, 5)] * 3
    assert tuned[0].batch_size == config.draft_batch_size
