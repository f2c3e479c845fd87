"""The peers benchmark's pieces that need no gpt-fast checkout: the weight conversion's RoPE layout, the
model arguments, the in-process system runs at smoke shapes, the floor, and the driver's refusals."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flashspec import models
from flashspec_lab import peers


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's RoPE on [..., head_dim]: pairs (j, j + head_dim / 2)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """gpt-fast's RoPE on [..., head_dim]: adjacent pairs (2j, 2j + 1) as complex numbers."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_interleaved_rows_give_gpt_fasts_rope_the_same_attention_scores():
    """q·k after RoPE is the same whether HF rotates halves of the HF rows or gpt-fast rotates pairs of the
    converted rows: the permutation is what makes the two layouts agree."""
    heads, head_dim, width = 3, 8, 12
    generator = torch.Generator().manual_seed(0)
    wq, wk = (torch.randn(heads * head_dim, width, generator=generator) for _ in range(2))
    x = torch.randn(5, width, generator=generator)                           # 5 positions
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.arange(5).float()[:, None] * inv_freq                       # [5, head_dim / 2]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]

    def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:              # [heads, 5, 5]
        return torch.einsum("qhd,khd->hqk", q, k)

    hf = scores(rotate_half((x @ wq.T).view(5, heads, head_dim), cos, sin),
                rotate_half((x @ wk.T).view(5, heads, head_dim), cos, sin))
    ours = scores(rotate_pairs((x @ peers.interleave_rows(wq, heads).T).view(5, heads, head_dim), angles[:, None]),
                  rotate_pairs((x @ peers.interleave_rows(wk, heads).T).view(5, heads, head_dim), angles[:, None]))
    assert torch.allclose(hf, ours, atol=1e-4)
    assert not torch.allclose(wq, peers.interleave_rows(wq, heads))


def test_state_dict_names_shapes_and_model_arguments():
    model = models.model_from_config(peers.smoke_config(models.smollm2_135m_config), seed=1)
    state = peers.gpt_fast_state_dict(model)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    rows = (config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    assert state["layers.1.attention.wqkv.weight"].shape == (rows, config.hidden_size)
    assert state["layers.0.feed_forward.w1.weight"] is model.model.layers[0].mlp.gate_proj.weight
    assert state["output.weight"] is model.model.embed_tokens.weight                 # tied, as SmolLM2
    assert len(state) == 3 + 7 * config.num_hidden_layers
    args = peers.gpt_fast_args(config, block_size=64)
    assert args["n_local_heads"] == config.num_key_value_heads and args["norm_eps"] == config.rms_norm_eps
    assert args["block_size"] == 64 and args["dim"] == config.hidden_size


@pytest.mark.parametrize("system", ["flashspec", "hf"])
def test_systems_run_in_process_at_smoke_shapes(system):
    settings = dict(device="cpu", smoke=True, compile=None, compile_scope="forward", new_tokens=6, prompt_tokens=4,
                    gamma=2, repeats=1, hf_repeats=1)
    record = peers.run_system(system, "tinyllama-1.1b", settings)
    assert "error" not in record, record
    second = "speculative" if system == "flashspec" else "assisted"
    assert set(record) == {"plain", second}
    assert all(value["tok_s_median"] > 0 and len(value["tok_s"]) == 1 for value in record.values())
    if system == "flashspec":
        assert record["plain"]["tokens_per_step"] == 1.0 and record["speculative"]["tokens_per_step"] >= 1.0
    assert all(value["first_request"]["compile_s"] == 0.0 for value in record.values())  # nothing compiled
    assert peers.run_system(system, "no-such-shape", settings)["error"].startswith("ValueError: shape must be")


def test_a_failing_method_keeps_the_ones_before_it(monkeypatch):
    """A system whose second method raises keeps the first method's record beside the error, and `save`
    sees the record after each finished method (what a child cut by its time limit leaves its parent)."""
    def runner(shape, device, settings, keep):
        keep("plain", {"tok_s_median": 5.0})
        raise RuntimeError("graph output overwritten")

    monkeypatch.setitem(peers.RUNNERS, "fake", runner)
    saved = []
    record = peers.run_system("fake", "tinyllama-1.1b", {"device": "cpu"}, save=lambda r: saved.append(dict(r)))
    assert record == {"plain": {"tok_s_median": 5.0}, "error": "RuntimeError: graph output overwritten"}
    assert saved == [{"plain": {"tok_s_median": 5.0}}]


def test_hbm_floor_of_the_7b_shape():
    """Llama-2-7B: 6.5e9 weights read per token (the embedding table is not), 13.0 GB at 4.28 TB/s is ~3.0 ms."""
    floor = peers.hbm_floor_ms("llama-2-7b", 4.28e12, filled=160)
    assert 3.0 < floor < 3.2
    assert peers.hbm_floor_ms("llama-2-7b", None, filled=160) is None


def test_driver_refuses_a_folder_that_is_not_gpt_fast(tmp_path, capsys):
    from experiments import bench_peers

    with pytest.raises(SystemExit):
        bench_peers.parse_args(["--gpt-fast", str(tmp_path)])
    assert "not a gpt-fast checkout" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_peers.parse_args(["--repeats", "0"])
    args = bench_peers.parse_args(["--smoke"])
    assert "gpt-fast" not in args.systems and args.new_tokens == 8


def test_a_checkout_copy_without_git_names_its_own_commit_not_the_repository_around_it(tmp_path):
    """A gpt-fast copy inside this repository (no .git of its own): git asked there answers for FlashSpec's
    checkout, so the commit comes from the copy's COMMIT file, or is unknown."""
    copy = tmp_path / "gpt-fast"
    copy.mkdir()
    assert peers.checkout_commit(copy) is None
    (copy / "COMMIT").write_text("32971d3129541c5bfb4f715abc33d1c5f408d204\n")
    assert peers.checkout_commit(copy) == "32971d3129541c5bfb4f715abc33d1c5f408d204"
    inside = Path(__file__).resolve().parent / "_no_git_here"
    inside.mkdir(exist_ok=True)
    try:
        assert peers.checkout_commit(inside) is None        # not the FlashSpec commit around it
    finally:
        inside.rmdir()


def test_first_request_breakdown_sums_frames_per_function():
    frames = [{"function": "_layers", "where": "runner.py:399", "compile_s": 30.0},
              {"function": "sample_from_logits", "where": "sampling.py:190", "compile_s": 2.0},
              {"function": "_layers", "where": "runner.py:399", "compile_s": 10.0},
              {"function": "commit", "where": "fast_session.py:40", "compile_s": None}]
    breakdown = peers.first_request_breakdown(50.0, frames)
    assert breakdown["compile_s"] == 42.0 and breakdown["other_s"] == 8.0
    top = breakdown["by_function"][0]
    assert (top["function"], top["frames"], top["compile_s"]) == ("_layers", 2, 40.0)
    assert [entry["function"] for entry in breakdown["by_function"]] == ["_layers", "sample_from_logits", "commit"]


def test_the_first_request_of_a_compiled_function_names_its_frame():
    """`timed` sees torch.compile's frames in its first request only (the timed ones reuse them)."""
    @torch.compile(fullgraph=True)
    def double_plus_one(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    record = peers.timed(lambda: int(double_plus_one(torch.ones(3)).sum()), torch.device("cpu"), repeats=1)
    by_function = record["first_request"]["by_function"]
    assert [entry["function"] for entry in by_function] == ["double_plus_one"]
    assert by_function[0]["frames"] == 1 and 0 < by_function[0]["compile_s"] <= record["first_request_s"]


@pytest.mark.parametrize("system, second", [("flashspec", "speculative"), ("hf", "assisted")])
def test_speculative_only_leaves_the_plain_runs_out(system, second):
    settings = dict(device="cpu", smoke=True, compile=None, compile_scope="forward", new_tokens=4, prompt_tokens=4,
                    gamma=2, repeats=1, hf_repeats=1, speculative_only=True)
    assert set(peers.run_system(system, "tinyllama-1.1b", settings)) == {second}
