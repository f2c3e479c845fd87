"""Provenance records, the one shape of every results file, and the tool that moved the old files into it."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from flashspec_lab import provenance

ROOT = Path(__file__).resolve().parents[2]
RESULT_FILES = sorted((ROOT / "results").glob("*.json")) + sorted((ROOT / "results").glob("*/*.json"))


def load_tool():
    spec = importlib.util.spec_from_file_location("migrate_results", ROOT / "tools" / "migrate_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_names_command_commit_date_machine_and_versions() -> None:
    record = provenance.record(["flashspec", "bandits", "--quick"], git_sha="abc1234")
    assert record["command"] == "flashspec bandits --quick" and record["git_sha"] == "abc1234"
    assert record["date_utc"].endswith("+00:00") and len(record["date_utc"]) == 25
    assert record["hardware"]["cpu"] and record["hardware"]["cpu_count"] >= 1
    import torch

    assert record["versions"]["torch"] == torch.__version__
    assert set(provenance.VERSIONED) <= set(record["versions"]) and record["versions"]["python"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert provenance.record()["git_sha"] == head
    at_head = provenance.record(git_sha=head[:7])  # a short SHA of the checkout's own commit
    assert isinstance(at_head["uncommitted_files"], list) and "checkout_git_sha" not in at_head


def test_a_sha_given_for_a_tree_at_another_commit_records_no_uncommitted_files(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A working tree copied to another machine can carry git metadata of an older commit: the files that differ
    from that commit say nothing about the SHA the run was given, so the record leaves them out and names the
    checkout's commit instead of listing committed files as uncommitted."""
    monkeypatch.setattr(provenance, "checkout_head", lambda: "f93f0d7abd8de016457c248ad5b1337092c092ff")
    monkeypatch.setattr(provenance, "uncommitted_files", lambda: ["flashspec/bench.py"])
    record = provenance.record(["x"], git_sha="2b8898062761ca3a2319ebb934b6ad77cc73628e")
    assert record["git_sha"].startswith("2b88980") and record["uncommitted_files"] is None
    assert record["checkout_git_sha"].startswith("f93f0d7")
    same = provenance.record(["x"], git_sha="f93f0d7")
    assert same["uncommitted_files"] == ["flashspec/bench.py"] and "checkout_git_sha" not in same


def test_one_nvidia_smi_helper_fills_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(command, **kwargs):
        assert command[0] == "nvidia-smi"
        return subprocess.CompletedProcess(command, 0, stdout="NVIDIA H200, 580.159.04, 143771 MiB\n" * 2)

    monkeypatch.setattr(provenance.subprocess, "run", fake_run)
    assert provenance.nvidia_smi()[0] == {"name": "NVIDIA H200", "driver_version": "580.159.04",
                                          "memory.total": "143771 MiB"}
    machine = provenance.hardware()
    assert (machine["gpu"], machine["gpu_count"], machine["driver"]) == ("NVIDIA H200", 2, "580.159.04")

    def no_gpu(command, **kwargs):
        raise FileNotFoundError(command[0])

    monkeypatch.setattr(provenance.subprocess, "run", no_gpu)
    assert provenance.nvidia_smi() == [] and provenance.hardware()["gpu"] is None


def test_write_load_and_caption(tmp_path: Path) -> None:
    record = {"command": "x", "git_sha": "0123456789abcdef", "date_utc": "2026-12-01T03:00:00+00:00",
              "hardware": {"gpu": "NVIDIA H200", "driver": "580.1", "cuda": "13.0"},
              "versions": {"python": "3.12", "torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0"}}
    path = provenance.write_result(tmp_path / "sub" / "run.json", record, {"n": 1}, {"value": 0.5})
    loaded = provenance.load_result("sub/run", folder=tmp_path)
    assert loaded == {"provenance": record, "settings": {"n": 1}, "results": {"value": 0.5}}
    assert json.loads(path.read_text()) == loaded
    assert provenance.caption(loaded) == ("NVIDIA H200 (driver 580.1, CUDA 13.0); torch 2.11.0, triton 3.6.0, "
                                          "transformers 5.17.0; git 01234567; 2026-12-01")
    cpu = {"hardware": {"cpu": "Xeon", "cpu_count": 2}, "versions": {"python": "3.11.7", "numpy": "2.4"}}
    assert provenance.caption(cpu) == "CPU Xeon ×2; python 3.11.7, numpy 2.4; git unknown; date not recorded"
    assert provenance.results_dir() == ROOT / "results"


def shape_problems(path: Path) -> list[str]:
    """What is wrong with one results file's shape ([] when nothing is)."""
    try:
        record = json.loads(path.read_text())
    except ValueError as error:
        return [f"not JSON ({error})"]
    if not isinstance(record, dict) or list(record) != list(provenance.RESULT_KEYS):
        keys = list(record) if isinstance(record, dict) else type(record).__name__
        return [f"top-level keys {keys}, not {list(provenance.RESULT_KEYS)}: run python tools/migrate_results.py"]
    found = record["provenance"]
    problems = [f"provenance lacks {sorted(missing)}"
                for missing in [{"command", "git_sha", "date_utc", "hardware", "versions"} - set(found)] if missing]
    if not isinstance(found.get("hardware"), dict):
        problems.append("provenance.hardware is not a mapping")
    if not isinstance(record["settings"], dict):
        problems.append("settings is not a mapping")
    if not problems and "; git " not in provenance.caption(record):
        problems.append("its caption names no git SHA")
    return problems


def test_every_results_file_has_the_one_shape() -> None:
    """One walk over results/: every bad file is named in one message, with what is wrong with it."""
    assert len(RESULT_FILES) > 100, f"only {len(RESULT_FILES)} results files found: is ROOT right?"
    bad = {path.relative_to(ROOT / "results").as_posix(): problems
           for path in RESULT_FILES if (problems := shape_problems(path))}
    assert not bad, f"{len(bad)} of {len(RESULT_FILES)} results files are malformed:\n" + "\n".join(
        f"  {name}: {'; '.join(problems)}" for name, problems in sorted(bad.items()))


def test_the_shape_check_names_what_is_wrong(tmp_path: Path) -> None:
    good = provenance.result({"command": "x", "git_sha": "abc1234", "date_utc": "2026-12-01T00:00:00+00:00",
                              "hardware": {"cpu": "Xeon"}, "versions": {}}, {}, {"value": 1})
    cases = {"good.json": json.dumps(good), "broken.json": "{", "flat.json": json.dumps({"command": "x"}),
             "no_sha.json": json.dumps({**good, "provenance": {k: v for k, v in good["provenance"].items()
                                                               if k != "git_sha"}})}
    found = {}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        found[name] = shape_problems(tmp_path / name)
    assert found["good.json"] == []
    assert "not JSON" in found["broken.json"][0] and "top-level keys" in found["flat.json"][0]
    assert found["no_sha.json"] == ["provenance lacks ['git_sha']"]


def test_migration_moves_fields_without_changing_numbers() -> None:
    tool = load_tool()
    old = {"command": "python -m flashspec_lab.simulate", "settings": {"experiment": "cost", "wall_seconds": 14.71},
           "versions": {"numpy": "2.4.6"}, "git_sha": "188217a", "uncommitted_library_files": [],
           "date": "2026-11-30T05:22:29+00:00", "hardware": "cpu: Intel(R) Xeon(R) Processor",
           "results": {"gamma": 4, "draft_costs": [0.3, 0.05, 0.02]}}
    new = tool.migrate("bandits_cost.json", old)
    assert new == {"provenance": {"command": "python -m flashspec_lab.simulate", "git_sha": "188217a",
                                  "uncommitted_files": [], "date_utc": "2026-11-30T05:22:29+00:00",
                                  "hardware": {"cpu": "Intel(R) Xeon(R) Processor"}, "versions": {"numpy": "2.4.6"},
                                  "wall_seconds": 14.71},
                   "settings": {"experiment": "cost"}, "results": {"gamma": 4, "draft_costs": [0.3, 0.05, 0.02]}}
    tool.check_same("bandits_cost.json", old, new)
    new["results"]["draft_costs"][0] = 0.31
    with pytest.raises(ValueError, match="numbers differ"):
        tool.check_same("bandits_cost.json", old, new)
    zoo_old = {"settings": {"size": "cpu"}, "results": {"a": 1.5}, "git_sha": "4591e69", "git_sha_note": "why",
               "hardware": "CPU Linux x2, torch 2.13.0+cpu", "date_utc": "2026-11-30T08:17:59+00:00",
               "command": "flashspec zoo report", "environment": {"python": "3.11.7", "torch": "2.13.0+cpu",
                                                                   "platform": "Linux", "processor": "", "cpu_count": 2}}
    zoo_new = tool.migrate("zoo_cpu_build.json", zoo_old)
    assert zoo_new["provenance"]["git_sha_note"] == "why"
    assert zoo_new["provenance"]["hardware"] == {"platform": "Linux", "processor": "", "cpu_count": 2}
    tool.check_same("zoo_cpu_build.json", zoo_old, zoo_new)
    with pytest.raises(ValueError, match="not what its environment gives"):
        tool.migrate("zoo_cpu_build.json", {**zoo_old, "hardware": "CPU something else x2, torch 2.13.0+cpu"})
