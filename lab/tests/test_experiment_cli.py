"""Experiment command lines refuse what they cannot do before doing any work: an output path that cannot be
written (a folder where a file goes, a file where a folder goes, a file in the way, no write permission) and a
multi-process command started outside torchrun. Each ends in one ``error:`` line naming the option and the fix,
exit status 2, no traceback."""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashspec_lab import cli_checks

CHECKOUT = Path(__file__).resolve().parents[2]
OUT = "{out}"  # replaced by the path under test

# Every experiment that writes files: its command line with OUT where the file path goes.
FILE_COMMANDS = {
    "adaptive_gamma": ["--out", OUT],
    "bench_engine": ["--out", OUT],
    "bench_fast": ["--out", OUT],
    "bench_runner": ["--out", OUT],
    "bench_tp": ["--smoke", "--out", OUT],
    "bench_verify": ["--out", OUT],
    "cluster_reduce_probe": ["--out", OUT],
    "exactness": ["--out", OUT],
    "feature_draft_probe": ["--out", OUT],
    "prefill_profile": ["--out", OUT],
    "public_code": ["--out", OUT],
    "real_cpu": ["--out", OUT],
    "real_pool": ["--out", OUT],
    "tree_headroom": ["--out", OUT],
    "verify_host_profile": ["--out", OUT],
    "verify_interference": ["--out", OUT],
    "verify_ncu parse": ["parse", "--csv", "ncu.csv", "--manifest", "manifest.json", "--out", OUT],
    "verify_ncu run": ["run", "--manifest", OUT],
    "verify_sass": ["--out", OUT],
    "zoo_design": ["fine-tuned", "--variants", "[]", "--out", OUT],
}
# Those whose option names a folder the outputs go into.
FOLDER_COMMANDS = {
    "bandits": ["--quick", "--out", OUT],
    "zoo perplexity": ["perplexity", "--out", OUT],
    "zoo report": ["report", "--out", OUT],
    "zoo_design --work-dir": ["fine-tuned", "--variants", "[]", "--out", "x.json", "--work-dir", OUT],
}
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "LOCAL_RANK": "0"}


def run_main(name: str, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run experiment `name`'s main(argv) and return its one stderr line; it must exit with status 2."""
    module = importlib.import_module(f"experiments.{name.split()[0]}")
    with pytest.raises(SystemExit) as caught:
        module.main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line, = err.strip().splitlines()
    return line


def option_of(argv: list[str]) -> str:
    return argv[argv.index(OUT) - 1]


@pytest.fixture(autouse=True)
def keep_triton_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """experiments.cluster_reduce_probe sets TRITON_INTERPRET=0 when imported: put it back after each test."""
    if "TRITON_INTERPRET" in os.environ:
        monkeypatch.setenv("TRITON_INTERPRET", os.environ["TRITON_INTERPRET"])
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's variables set (bench_tp checks them after its options); nothing else reads them here."""
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("name", sorted(FILE_COMMANDS))
def test_a_folder_given_for_an_output_file_is_refused(name, tmp_path, capsys, torchrun_env):
    argv = [str(tmp_path) if arg == OUT else arg for arg in FILE_COMMANDS[name]]
    line = run_main(name, argv, capsys)
    option = option_of(FILE_COMMANDS[name])
    assert f"error: {option} {tmp_path}: is a folder" in line and f"{option} {tmp_path / 'result.json'}" in line


@pytest.mark.parametrize("name", sorted(FILE_COMMANDS))
def test_an_output_file_under_a_file_is_refused(name, tmp_path, capsys, torchrun_env):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    target = blocker / "sub" / "out.json"
    argv = [str(target) if arg == OUT else arg for arg in FILE_COMMANDS[name]]
    line = run_main(name, argv, capsys)
    assert f"{option_of(FILE_COMMANDS[name])} {target}: cannot be written ({blocker} is a file, not a folder)" in line
    assert "pass a path in a writable folder" in line


@pytest.mark.parametrize("name", sorted(FOLDER_COMMANDS))
def test_a_file_given_for_an_output_folder_is_refused(name, tmp_path, capsys):
    existing = tmp_path / "existing.json"
    existing.write_text("{}")
    argv = [str(existing) if arg == OUT else arg for arg in FOLDER_COMMANDS[name]]
    line = run_main(name, argv, capsys)
    option = option_of(FOLDER_COMMANDS[name])
    assert f"error: {option} {existing}: is a file, but {option} names the folder the outputs go into" in line
    assert "pass a folder (created if missing)" in line


def test_bandits_with_an_existing_file_fails_at_once_through_the_cli(tmp_path):
    """The reported case, end to end: `flashspec bandits --quick --out FILE` with FILE present."""
    existing = tmp_path / "taken"
    existing.write_text("keep me")
    done = subprocess.run([sys.executable, "-m", "flashspec", "bandits", "--quick", "--out", str(existing)],
                          capture_output=True, text=True, cwd=CHECKOUT, timeout=300)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert line.startswith(f"flashspec bandits: error: --out {existing}: is a file") and existing.read_text() == "keep me"


def test_bench_tp_outside_torchrun_names_the_launch_command(tmp_path):
    """The reported case, end to end: `flashspec bench tp --smoke` started without torchrun."""
    env = {key: value for key, value in os.environ.items() if key not in TORCHRUN}
    done = subprocess.run([sys.executable, "-m", "flashspec", "bench", "tp", "--smoke"], capture_output=True,
                          text=True, cwd=CHECKOUT, env=env, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert line.startswith("flashspec bench tp: error: not started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, "
                           "MASTER_PORT are not set): this command runs one process per rank")
    assert line.endswith("launch it as `torchrun --nproc-per-node 2 -m flashspec bench tp --smoke`")


# ----------------------------------------------------------------------------------------------- the helper itself


@pytest.fixture
def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="flashspec probe")


def error_of(call, capsys) -> str:
    with pytest.raises(SystemExit) as caught:
        call()
    assert caught.value.code == 2
    line, = capsys.readouterr().err.strip().splitlines()
    return line


def test_writable_outputs_pass_and_are_left_alone(parser, tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    for path in (existing, tmp_path / "new.json", tmp_path / "a" / "b" / "new.json", None):
        cli_checks.output_file(parser, "--out", path)  # an existing file is rewritten by the run
    for path in (tmp_path, tmp_path / "new", tmp_path / "a" / "b", None):
        cli_checks.output_folder(parser, "--out", path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"] and existing.read_text() == "{}"


def test_an_unwritable_folder_is_named(parser, tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and access(path, mode))
    line = error_of(lambda: cli_checks.output_file(parser, "--out", locked / "new" / "x.json"), capsys)
    assert line == (f"flashspec probe: error: --out {locked / 'new' / 'x.json'}: cannot be written (the folder "
                    f"{locked} is not writable); pass a path in a writable folder")
    line = error_of(lambda: cli_checks.output_folder(parser, "--figures", locked), capsys)
    assert f"--figures {locked}: cannot be written (the folder {locked} is not writable)" in line


def test_an_existing_read_only_file_is_named(parser, tmp_path, monkeypatch, capsys):
    frozen = tmp_path / "frozen.json"
    frozen.write_text("{}")
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != frozen and access(path, mode))
    line = error_of(lambda: cli_checks.output_file(parser, "--out", frozen), capsys)
    assert f"--out {frozen}: cannot be written (the file exists and is not writable)" in line


def test_under_torchrun_names_what_is_missing(parser, monkeypatch, capsys):
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    cli_checks.under_torchrun(parser, "flashspec bench tp", ["--out", "a b.json"], ranks=2)
    monkeypatch.delenv("MASTER_PORT")
    line = error_of(lambda: cli_checks.under_torchrun(parser, "flashspec bench tp", ["--out", "a b.json"], 4), capsys)
    assert line == ("flashspec probe: error: not started by torchrun (MASTER_PORT is not set): this command runs "
                    "one process per rank; launch it as `torchrun --nproc-per-node 4 -m flashspec bench tp --out "
                    "'a b.json'`")


def test_compile_nested_probe_compares_each_variant_with_eager(tmp_path):
    """The probe times each variant in its own process and records its logits' distance from the eager forward's:
    the whole-forward compile agrees (it is what the fast path ships)."""
    import json

    from experiments import compile_nested_probe

    out = tmp_path / "probe.json"
    assert compile_nested_probe.main(["--layers", "1", "--variants", "whole", "--out", str(out)]) == 0
    variants = json.loads(out.read_text())["results"]["variants"]
    assert set(variants) == {"eager", "whole"}
    assert variants["whole"]["logits_finite"] and variants["whole"]["max_abs_logit_difference_vs_eager"] < 1e-4
    assert variants["whole"]["first_compiled_call_s"] > 0
