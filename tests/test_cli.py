"""The `flashspec` command: generate (default tiny models and saved folders), dispatch, engine bench smoke."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from flashspec import cli, models


def test_generate_default_needs_no_download(capsys, tmp_path):
    path = tmp_path / "stats.json"
    code = cli.main(["generate", "--prompt", "abcabc", "--max-new-tokens", "12", "--prompt-lookup",
                     "--no-progress", "--json", str(path), "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.startswith("abcabc")
    assert len(captured.out.strip()) > len("abcabc")
    assert "tiny random models" in captured.err
    assert "tokens/s" in captured.err and "prompt-lookup" in captured.err
    record = json.loads(path.read_text())
    assert record["summary"]["generated_tokens"] <= 12
    assert len(record["arm_names"]) == 3


def test_generate_with_gammas_makes_an_arm_per_draft_and_gamma(capsys, tmp_path):
    path = tmp_path / "stats.json"
    code = cli.main([*BASE, "--gammas", "1,3", "--json", str(path)])
    assert code == 0, capsys.readouterr().err
    assert json.loads(path.read_text())["arm_names"] == ["draft0@γ=1", "draft0@γ=3", "draft1@γ=1", "draft1@γ=3"]


@pytest.mark.parametrize("options, policy", [([], "thompson"), (["--gammas", "1,3"], "gamma-ts"),
                                             (["--gammas", "1,3", "--policy", "ucb1"], "ucb1")])
def test_default_policy_is_gamma_ts_with_gammas(monkeypatch, capsys, options, policy):
    """With --gammas and no --policy the arms share each draft's acceptance (gamma-ts); else Thompson sampling."""
    seen = {}
    original = cli.build_decoder

    def spy(args, *rest, **kwargs):
        decoder = original(args, *rest, **kwargs)
        seen["policy"] = decoder.policy.name
        return decoder

    monkeypatch.setattr(cli, "build_decoder", spy)
    assert cli.main([*BASE, *options]) == 0, capsys.readouterr().err
    assert seen == {"policy": policy}


@pytest.mark.parametrize("budget, expected", [([], 0.01), (["--budget", "0.05"], 0.05), (["--budget", "none"], None)])
def test_budget_reaches_the_adaptive_policy(monkeypatch, capsys, budget, expected):
    """--budget sets gamma-ts's budget against the plain arm (default: the policy's own, with --gammas holding 0)."""
    seen = {}
    original = cli.build_decoder

    def spy(args, *rest, **kwargs):
        decoder = original(args, *rest, **kwargs)
        seen["decoder"] = decoder
        return decoder

    monkeypatch.setattr(cli, "build_decoder", spy)
    assert cli.main([*BASE, "--gammas", "0,2", *budget]) == 0, capsys.readouterr().err
    assert seen["decoder"].policy.budget == expected


def test_budget_is_refused_where_it_cannot_apply(capsys):
    for options, message in ((["--budget", "0.02"], "--budget applies to --policy gamma-ts"),
                             (["--gammas", "2,4", "--budget", "0.02"], "give --gammas holding 0"),
                             (["--gammas", "0,2", "--budget", "1.5"], "--budget must be a fraction in (0, 1)")):
        assert cli.main([*BASE, *options]) == 2
        assert message in capsys.readouterr().err, options
    with pytest.raises(SystemExit):  # argparse refuses a word it does not know
        cli.main([*BASE, "--gammas", "0,2", "--budget", "lots"])
    assert "--budget: must be a fraction such as 0.02, 'none' or 'auto'" in capsys.readouterr().err


def test_generate_with_saved_target_and_draft(capsys, tmp_path):
    tokenizer = models.char_tokenizer()
    common = dict(vocab_size=len(tokenizer), max_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    for name, hidden, seed in (("target", 32, 0), ("draft", 16, 1)):
        models.tiny_llama(hidden_size=hidden, num_heads=2, seed=seed, **common).save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    code = cli.main(["generate", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                     "--policy", "ucb1", "--gamma", "3", "--temperature", "0", "--max-new-tokens", "8",
                     "--prompt", "hello", "--no-progress", "--dtype", "fp32", "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("hello")
    assert "draft0" in captured.err


def test_generate_reports_bad_input(capsys):
    assert cli.main(["generate", "--gamma", "0", "--no-progress", "--device", "cpu"]) == 2
    assert "gamma" in capsys.readouterr().err
    assert cli.main(["generate", "--policy", "nope", "--no-progress", "--device", "cpu"]) == 2
    assert "--policy nope: unknown policy 'nope'" in capsys.readouterr().err
    assert cli.main(["generate", "--draft", "x", "--no-progress"]) == 2
    assert "--draft needs --target" in capsys.readouterr().err


def test_dispatch_calls_main_with_the_remaining_argv(monkeypatch):
    seen = {}
    fake = types.ModuleType("experiments.bench_engine")
    fake.main = lambda argv: seen.setdefault("argv", argv) and 0
    monkeypatch.setitem(sys.modules, "experiments.bench_engine", fake)
    assert cli.main(["bench", "engine", "--tiny", "--x"]) == 0
    assert seen["argv"] == ["--tiny", "--x"]


def test_dispatch_to_a_missing_module_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.DISPATCH, ("zoo",), "flashspec.module_that_does_not_exist")
    assert cli.main(["zoo", "build"]) == 2
    assert "not available" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2
    assert cli.main(["bench"]) == 2


def test_experiments_run_from_the_checkout_whatever_the_working_directory(tmp_path):
    """`experiments/` is not in the wheel: the command finds it next to the flashspec package it runs."""
    run = subprocess.run([sys.executable, "-m", "flashspec.cli", "bandits", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr
    assert "--experiments" in run.stdout


def test_bench_engine_tiny_smoke(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = cli.main(["bench", "engine", "--tiny", "--device", "cpu", "--batch-sizes", "1", "2",
                     "--max-new-tokens", "4", "--prompt-length", "6", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert list(record) == ["provenance", "settings", "results"]
    assert record["provenance"]["command"].startswith("flashspec bench engine --tiny")
    assert record["provenance"]["versions"]["torch"] and record["settings"]["device"] == "cpu"
    one, two = record["results"]["B=1"], record["results"]["B=2"]
    for method in ("plain", "hf_assisted", "flashspec", "flashspec_pool"):
        assert method in one["cells"]
    assert one["cells"]["flashspec"]["tokens_per_s"] > 0
    assert "flashspec/plain" in one["ratios"] and "flashspec/hf_assisted" in one["ratios"]
    assert "batch_size = 1" in two["cells"]["hf_assisted"]["unsupported"]
    assert two["cells"]["hf_assisted"]["hf_assisted_sequential"]["tokens_per_s"] > 0


def test_generate_with_the_model_zoo(monkeypatch, capsys):
    """--zoo takes the zoo's target, drafts and tokenizer (a stand-in zoo here: no training in tests)."""
    tokenizer = models.char_tokenizer()
    common = dict(vocab_size=len(tokenizer), max_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    loaded = types.SimpleNamespace(
        tokenizer=tokenizer, target=models.tiny_llama(hidden_size=32, num_heads=2, seed=0, **common),
        drafts={"code": models.tiny_llama(hidden_size=16, num_heads=2, seed=1, **common)},
    )
    fake = types.ModuleType("flashspec_lab.zoo")
    fake.load_zoo = lambda size, device=None: loaded
    monkeypatch.setitem(sys.modules, "flashspec_lab.zoo", fake)
    monkeypatch.setattr("flashspec_lab.zoo", fake, raising=False)
    code = cli.main(["generate", "--zoo", "cpu", "--prompt", "ab", "--max-new-tokens", "5", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("ab") and "draft0" in captured.err
    assert cli.main(["generate", "--zoo", "cpu", "--target", "x", "--no-progress"]) == 2


# --- Bad input ends in one `flashspec generate: error: ...` line and exit 2, before any output. ---

BASE = ["generate", "--no-progress", "--device", "cpu", "--max-new-tokens", "4"]


def save_tiny_checkpoint(folder) -> None:
    """A tiny random Llama and the char tokenizer saved as a Hugging Face folder."""
    tokenizer = models.char_tokenizer()
    common = dict(vocab_size=len(tokenizer), max_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    models.tiny_llama(hidden_size=16, num_heads=2, **common).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run_failing(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit 2 with nothing on stdout and one error line; return stderr."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == ""
    assert "Traceback" not in captured.err
    assert "flashspec generate: error: " in captured.err
    return captured.err


def test_device_without_cuda_or_unknown_is_an_error(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = run_failing(capsys, [*BASE, "--device", "cuda"])
    assert "--device cuda" in err and "no CUDA" in err and "device='cpu'" in err
    err = run_failing(capsys, [*BASE, "--device", "nosuch"])
    assert "--device nosuch" in err


@pytest.mark.parametrize("role", ["--target", "--draft"])
def test_corrupt_checkpoint_is_an_error_naming_the_option(tmp_path, capsys, role):
    for name in ("target", "draft"):
        save_tiny_checkpoint(tmp_path / name)
    corrupt = tmp_path / role.lstrip("-") / "model.safetensors"
    corrupt.write_bytes(b"\x12\x34 not a safetensors file" + corrupt.read_bytes()[:40])
    err = run_failing(capsys, [*BASE, "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft")])
    assert role in err and str(corrupt.parent) in err


def test_model_option_given_a_file_is_an_error(tmp_path, capsys):
    save_tiny_checkpoint(tmp_path / "target")
    err = run_failing(capsys, [*BASE, "--target", str(tmp_path / "target" / "config.json")])
    assert "--target" in err and "folder" in err and "not a file" in err
    err = run_failing(capsys, [*BASE, "--target", str(tmp_path / "missing")])
    assert "--target" in err and "no such folder" in err


def test_unwritable_json_path_fails_before_generating(tmp_path, capsys):
    err = run_failing(capsys, [*BASE, "--json", str(tmp_path / "nodir" / "stats.json")])
    assert "--json" in err and "nodir" in err
    err = run_failing(capsys, [*BASE, "--json", str(tmp_path)])
    assert "--json" in err
    probed = tmp_path / "stats.json"  # the writability probe leaves nothing behind when the run stops early
    run_failing(capsys, [*BASE, "--json", str(probed), "--policy", "nope"])
    assert not probed.exists()


def test_negative_seed_is_a_seed_error(capsys):
    err = run_failing(capsys, [*BASE, "--seed", "-1"])
    assert "--seed: seed must be an int in [0, 2**64)" in err and "policy" not in err


@pytest.mark.parametrize("option, value", [
    ("--max-new-tokens", "-5"), ("--gamma", "0"), ("--gamma", "100000"), ("--temperature", "-1"),
    ("--temperature", "nan"), ("--temperature", "inf"), ("--top-k", "-1"), ("--top-p", "0"),
    ("--top-p", "1.5"), ("--top-p", "nan"), ("--dtype", "bogus"), ("--gammas", "2,2"), ("--gammas", "0"),
    ("--gammas", "2,-1"),
])
def test_bad_numeric_options_fail_before_any_output(capsys, option, value):
    err = run_failing(capsys, [*BASE, option, value])
    assert option in err


def test_library_value_errors_are_one_line_errors(monkeypatch, capsys):
    """A ValueError from the library (here the zoo's cache check) is printed, not raised."""

    class ZooCacheError(ValueError):
        pass

    def broken_zoo(size, device=None):
        raise ZooCacheError("zoo cache at /x is corrupt; delete it")

    fake = types.ModuleType("flashspec_lab.zoo")
    fake.load_zoo = broken_zoo
    monkeypatch.setitem(sys.modules, "flashspec_lab.zoo", fake)
    monkeypatch.setattr("flashspec_lab.zoo", fake, raising=False)
    err = run_failing(capsys, [*BASE, "--zoo", "cpu"])
    assert "flashspec generate: error: zoo cache at /x is corrupt; delete it" in err


def test_seed_reaches_the_policy_and_the_draws(monkeypatch, capsys):
    """--seed goes to `generate` alone, which seeds the draws and restarts the policy's generator from it (a
    seed given to the policy at construction would be overwritten by the request's)."""
    from flashspec import engine

    seen = {}
    real_init, real_generate = engine.SpeculativeDecoder.__init__, engine.SpeculativeDecoder.generate

    def spy_init(self, *args, **kwargs):
        seen["policy_kwargs"] = kwargs.get("policy_kwargs")
        real_init(self, *args, **kwargs)

    def spy_generate(self, *args, **kwargs):
        seen["seed"] = kwargs.get("seed")
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(engine.SpeculativeDecoder, "__init__", spy_init)
    monkeypatch.setattr(engine.SpeculativeDecoder, "generate", spy_generate)
    outputs = []
    for _ in range(2):
        assert cli.main([*BASE, "--seed", "7", "--temperature", "1", "--max-new-tokens", "10"]) == 0
        outputs.append(capsys.readouterr().out)
    assert seen == {"policy_kwargs": None, "seed": 7}
    assert outputs[0] == outputs[1]


def test_interrupt_ends_quietly(monkeypatch, capsys):
    from flashspec import engine

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.SpeculativeDecoder, "generate", interrupted)
    assert cli.main(BASE) == 130
    assert "interrupted" in capsys.readouterr().err


def test_compile_on_the_eager_engine_is_an_error(capsys):
    err = run_failing(capsys, [*BASE, "--engine", "eager", "--compile"])
    assert "--compile applies to the fast path only" in err


def test_bench_fast_smoke_runs_through_the_cli(tmp_path, capsys):
    out = tmp_path / "fast.json"
    assert cli.main(["bench", "fast", "--smoke", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    methods = record["results"]["cells"][0]["methods"]
    assert {"fast_plain", "fast_speculative", "fast_speculative_sync_all"} <= set(methods)


# --- One seed, one text: the engine is a speed choice, not a different sampler. ---


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize("temperature", ["0", "1"])
def test_eager_and_fast_engines_print_the_same_text_for_one_seed(capsys, temperature, verify):
    """With one draft, `--engine eager` and `--engine fast` (no graphs on a CPU) print the same tokens, with token
    and with block verification (`--verify`)."""
    texts = []
    for engine in ("eager", "fast"):
        code = cli.main([*BASE[:-1], "24", "--prompt", "abcabcab", "--engine", engine, "--seed", "5",
                         "--temperature", temperature, "--gamma", "3", "--prompt-lookup", "--policy", "fixed",
                         "--verify", verify])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        texts.append(captured.out)
    assert texts[0] == texts[1] and len(texts[0]) > len("abcabcab")


@pytest.mark.parametrize("arm", ["first", "plain"])
def test_gammas_with_zero_add_a_plain_arm_that_prints_one_text_in_either_engine(monkeypatch, capsys, tmp_path, arm):
    """`--gammas 0,2` adds the arm "plain" (last) beside each draft at γ = 2; with `--policy fixed` both engines print
    the same text for one seed, whether the fixed arm is the first draft's or (a fixed policy on the last arm) the
    plain one, whose steps then each append one token."""
    from flashspec import bandits

    class LastArm(bandits.FixedArm):
        def __init__(self, n_arms, **kwargs):
            super().__init__(n_arms, arm=n_arms - 1, **kwargs)

    if arm == "plain":
        monkeypatch.setitem(bandits.POLICIES, "fixed", LastArm)
    texts = []
    for engine in ("eager", "fast"):
        path = tmp_path / f"{engine}.json"
        code = cli.main([*BASE[:-1], "16", "--prompt", "abcabcab", "--engine", engine, "--seed", "5",
                         "--temperature", "1", "--gammas", "0,2", "--policy", "fixed", "--json", str(path)])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        texts.append(captured.out)
        record = json.loads(path.read_text())
        assert record["arm_names"] == ["draft0@γ=2", "draft1@γ=2", "plain"] and record["arm_gammas"] == [2, 2, 0]
        plain = record["summary"]["per_arm"]["plain"]
        assert plain["selections"] == (16 if arm == "plain" else 0)
    assert texts[0] == texts[1] and len(texts[0]) > len("abcabcab")


# --- What the fast path and the models can go wrong with, each one error line. ---


@pytest.mark.parametrize("engine", ["eager", "fast"])
def test_non_finite_weights_end_in_one_error_line_and_nothing_printed(tmp_path, capsys, engine):
    import torch

    save_tiny_checkpoint(tmp_path / "target")
    broken = models.load_model(str(tmp_path / "target"), dtype="fp32")
    broken.model.norm.weight.data.fill_(float("nan"))
    broken.save_pretrained(tmp_path / "target")
    assert torch.isnan(models.load_model(str(tmp_path / "target"), dtype="fp32").model.norm.weight).all()
    err = run_failing(capsys, [*BASE, "--target", str(tmp_path / "target"), "--prompt-lookup", "--engine", engine])
    assert "non-finite logits" in err and "FloatingPointError" not in err


def test_max_new_tokens_is_fitted_to_the_shortest_model(tmp_path, capsys):
    """A draft with fewer positions than the target bounds --max-new-tokens too: lowered with a note, no error."""
    tokenizer = models.char_tokenizer()
    common = dict(vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, pad_token_id=2)
    for name, positions in (("target", 128), ("draft", 24)):
        models.tiny_llama(hidden_size=16, num_heads=2, max_positions=positions, **common).save_pretrained(
            tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    code = cli.main([*BASE[:-1], "100", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                     "--prompt", "hello", "--temperature", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "max-new-tokens lowered to 19 (the drafts[0] holds 24 positions)" in captured.err
    assert captured.out.startswith("hello")


@pytest.mark.parametrize("options", [["--dtype", "fp16"], ["--quantization", "nf4"]])
def test_dtype_options_the_default_models_cannot_honour_are_errors(capsys, options):
    err = run_failing(capsys, [*BASE, *options])
    assert "apply to --target/--draft checkpoints" in err


def test_only_rank_zero_reports_an_error(monkeypatch, capsys):
    """Under torchrun every rank fails the same way; the message is printed once."""
    monkeypatch.setenv("RANK", "1")
    assert cli.report_error("bad --tp") == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert cli.report_error("bad --tp") == 2
    assert capsys.readouterr().err == "flashspec generate: error: bad --tp\n"
