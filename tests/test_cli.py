"""The `flashspec` command: generate (default tiny models and saved folders), dispatch, engine bench smoke."""
from __future__ import annotations

import json
import sys
import types

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
    assert "unknown or invalid policy" in capsys.readouterr().err
    assert cli.main(["generate", "--draft", "x", "--no-progress"]) == 2
    assert "--draft needs --target" in capsys.readouterr().err


def test_dispatch_calls_main_with_the_remaining_argv(monkeypatch):
    seen = {}
    fake = types.ModuleType("flashspec.bench_engine")
    fake.main = lambda argv: seen.setdefault("argv", argv) and 0
    monkeypatch.setitem(sys.modules, "flashspec.bench_engine", fake)
    assert cli.main(["bench", "engine", "--tiny", "--x"]) == 0
    assert seen["argv"] == ["--tiny", "--x"]


def test_dispatch_to_a_missing_module_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.DISPATCH, ("zoo",), "flashspec.module_that_does_not_exist")
    assert cli.main(["zoo", "build"]) == 2
    assert "not available" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2
    assert cli.main(["bench"]) == 2


def test_bench_engine_tiny_smoke(tmp_path, capsys):
    from flashspec import bench_engine

    out = tmp_path / "bench.json"
    code = bench_engine.main(["--tiny", "--device", "cpu", "--batch-sizes", "1", "2", "--max-new-tokens", "4",
                              "--prompt-length", "6", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    for key in ("date_utc", "git_sha", "command", "hardware", "versions", "settings"):
        assert key in record
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
    fake = types.ModuleType("flashspec.zoo")
    fake.load_zoo = lambda size, device=None: loaded
    monkeypatch.setitem(sys.modules, "flashspec.zoo", fake)
    monkeypatch.setattr("flashspec.zoo", fake, raising=False)
    code = cli.main(["generate", "--zoo", "cpu", "--prompt", "ab", "--max-new-tokens", "5", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("ab") and "draft0" in captured.err
    assert cli.main(["generate", "--zoo", "cpu", "--target", "x", "--no-progress"]) == 2
