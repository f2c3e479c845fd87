"""Tensor parallelism (`flashspec.tp`) on CPU: 2 processes, gloo, the target's layers sharded by DTensor.

Greedy with the sharded target equals the unsharded model's greedy `generate`; sampled output passes the
same χ² exactness test as the single-process fast path; both ranks emit identical tokens without any
broadcast; ranks fed different requests, or emitting different tokens, raise a clear RuntimeError; a
world size that does not divide the heads is a clear ValueError.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashspec as fs
from flashspec import cli, models
from flashspec.drafters import PromptLookupDrafter
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder, make_decoder
from flashspec.tp import TensorParallel, check_shardable, shard_target

from test_fast import chi2_calls
from test_engine_exact import ROWS_PER_CALL, SETTINGS, VOCAB, exact_continuations, fit_p_values, passes

WORLD = 2
TIMEOUT_S = 120
CHI2_SETTINGS = [SETTINGS[0], SETTINGS[3]]  # T=0.7; T=1.0 with top-p 0.8
PROMPTS = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9], [1, 4, 4, 4, 4]])
MASK = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])


def gqa_target() -> torch.nn.Module:
    """Like test_fast's `variant("gqa")`: 4 query heads, 2 KV heads, 2 layers (fp32)."""
    config = models.llama_config(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                 max_positions=64, initializer_range=0.3)
    return models.model_from_config(config, seed=3)


def chi2_pool() -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """test_fast's pool: target, a near copy, an unrelated small draft (2 heads: shardable over 2)."""
    target = models.tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, initializer_range=0.3, seed=1)
    near = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in near.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.003 * 0.3)
    far = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    return target, near, far


# ------------------------------------------------------------------------------------ rank scenarios


def scenario_small(tp: TensorParallel) -> dict[str, Any]:
    """Greedy (speculative and plain) and sampled runs, the size check, and both guards."""
    out: dict[str, Any] = {}
    target = shard_target(gqa_target(), tp)
    local = target.model.layers[0].self_attn.k_proj.weight.to_local().shape[0]
    out["local_kv_rows"] = local
    draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    decoder = FastSpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3, tp=tp)
    greedy = fs.SamplingParams(0.0)
    out["greedy"] = decoder.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, sampling=greedy).sequences
    out["plain"] = FastPlainDecoder(target, tp=tp).generate(PROMPTS, attention_mask=MASK, max_new_tokens=9,
                                                            sampling=greedy).sequences
    sampled = decoder.generate(PROMPTS, attention_mask=MASK, max_new_tokens=40, seed=11, ignore_eos=True,
                               sampling=fs.SamplingParams(1.0))
    out["sampled"], out["sampled_steps"] = sampled.sequences, len(sampled.stats.steps)
    three_heads = models.llama_config(vocab_size=VOCAB, hidden_size=24, num_layers=1, num_heads=3, num_kv_heads=3)
    try:
        shard_target(models.model_from_config(three_heads), tp)
    except ValueError as error:
        out["size_error"] = str(error)
    tp.guard_request(PROMPTS, MASK, ("same",))  # the token guard: rank 1 emits a different token at step 1
    tp.guard_step(0, 0, [[1, 2]])
    try:
        tp.guard_step(1, 0, [[3 + tp.rank]])
        tp.guard_check(1)
    except RuntimeError as error:
        out["token_error"] = str(error)
    try:  # the request guard: rank 1 gets another prompt; both ranks raise before any forward
        decoder.generate(PROMPTS + tp.rank, attention_mask=MASK, max_new_tokens=4, sampling=greedy)
    except RuntimeError as error:
        out["prompt_error"] = str(error)
    return out


def scenario_chi2(tp: TensorParallel) -> dict[str, Any]:
    """test_fast's χ² run (two model drafts + prompt lookup under EXP3) with the target sharded."""
    target, near, far = chi2_pool()
    shard_target(target, tp)
    out: dict[str, Any] = {}
    for index, params in enumerate(CHI2_SETTINGS):
        decoder = FastSpeculativeDecoder(target, [near, far, PromptLookupDrafter()], policy="exp3", gamma=3,
                                         policy_kwargs={"seed": 0, "exploration_rate": 0.5}, tp=tp)
        # as many samples as test_fast's run in a quarter of the steps (each step all-reduces over gloo);
        # EXP3 explores more so that every arm still plays in fewer steps
        continuations, arms, kept = chi2_calls(decoder, params, calls=16, rows=4 * ROWS_PER_CALL)
        out[index] = {"continuations": continuations, "arms": arms, "max_kept": max(kept)}
    return out


def scenario_all(tp: TensorParallel) -> dict[str, Any]:
    """Both scenarios in one launch of the ranks (each launch imports torch and transformers on every rank)."""
    return {"small": scenario_small(tp), "chi2": scenario_chi2(tp)}


SCENARIOS = {"small": scenario_small, "chi2": scenario_chi2, "all": scenario_all}


def _worker(rank: int, port: int, scenario: str, folder: str) -> None:
    """One rank: join the gloo group, run `scenario`, save its result (or the traceback) for the parent."""
    torch.set_num_threads(1)
    path = Path(folder) / f"rank{rank}.pt"
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        result = SCENARIOS[scenario](TensorParallel.create("cpu", check_every=4))
        torch.save({"ok": result}, path)
    except BaseException:  # noqa: BLE001 - reported by the parent
        torch.save({"error": traceback.format_exc()}, path)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(scenario: str, folder: Path, timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Spawn WORLD ranks running `scenario`; their results, rank by rank. Fails (and kills them) past the timeout."""
    context = mp.start_processes(_worker, args=(_free_port(), scenario, str(folder)), nprocs=WORLD, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"tensor-parallel scenario {scenario!r} did not finish within {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, 9)
    results = [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank} failed:\n{result.get('error')}"
    return [result["ok"] for result in results]


# ------------------------------------------------------------------------------------------- tests


# the tests of the ranks' scenarios share one xdist worker (`--dist loadgroup`): each worker would start its ranks
SMALL_WORKER = pytest.mark.xdist_group("tp_small")


@pytest.fixture(scope="session")  # once per worker, even when other modules' tests run between its tests
def ranks(tmp_path_factory) -> list[dict[str, Any]]:
    return run_ranks("all", tmp_path_factory.mktemp("tp_ranks"), timeout_s=3 * TIMEOUT_S)


@pytest.fixture(scope="session")
def small(ranks) -> list[dict[str, Any]]:
    return [result["small"] for result in ranks]


@SMALL_WORKER
def test_sharded_greedy_equals_unsharded_generate_on_every_rank(small):
    target = gqa_target()
    expected = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    plain = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=9, do_sample=False, eos_token_id=2,
                            pad_token_id=2)
    for rank, result in enumerate(small):
        assert result["local_kv_rows"] == 8, "k_proj must hold 1 of 2 KV heads (head_dim 8) per rank"
        assert torch.equal(result["greedy"], expected), rank
        assert torch.equal(result["plain"], plain), rank
    first, second = small
    assert torch.equal(first["sampled"], second["sampled"]) and first["sampled_steps"] == second["sampled_steps"]


@SMALL_WORKER
def test_ranks_with_different_requests_or_tokens_raise(small):
    for result in small:
        assert "different prompt" in result["prompt_error"] and "[[0], [1]]" in result["prompt_error"], result
        assert "diverged by step 1" in result["token_error"] and "[1]" in result["token_error"], result


@SMALL_WORKER
def test_world_size_must_divide_the_heads(small):
    for result in small:
        message = result["size_error"]
        assert "num_attention_heads (3)" in message and "num_key_value_heads (3)" in message, message
        assert "[1, 3]" in message, message
    config = models.llama_config(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2)
    check_shardable(config, 2)
    check_shardable(models.llama_7b_config(), 2)  # the benchmark's target
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) and num_key_value_heads \(2\).*\[1, 2\]"):
        check_shardable(config, 4)


def test_a_sharded_target_needs_its_group():
    target = gqa_target()
    target.flashspec_tp_size = 2  # as shard_target leaves it
    with pytest.raises(ValueError, match="sharded over 2 rank"):
        FastPlainDecoder(target)
    with pytest.raises(ValueError, match="tp .tensor parallelism. needs the fast path"):
        make_decoder(target, [object()], tp=SimpleNamespace(size=2))


@pytest.mark.slow
@SMALL_WORKER
def test_sharded_target_output_matches_exact_target_distribution(ranks):
    target = chi2_pool()[0]
    for index, params in enumerate(CHI2_SETTINGS):
        first, second = (result["chi2"][index] for result in ranks)
        assert torch.equal(first["continuations"], second["continuations"]) and first["arms"] == second["arms"]
        p_values = fit_p_values(first["continuations"], exact_continuations(target, params))
        assert passes(p_values), (params, p_values)
        assert len(set(first["arms"])) == 3, f"every arm must be played, trace {first['arms']}"
        assert first["max_kept"] >= 2, "multi-token steps must occur for the test to cover them"


@pytest.mark.slow
def test_bench_tp_smoke_runs_under_torchrun(tmp_path):
    """experiments/bench_tp.py --smoke: 2 ranks on CPU with gloo, rank 0 writes the JSON."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bench_tp.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port",
               str(_free_port()), str(root / "experiments" / "bench_tp.py"), "--smoke", "--out", str(out)]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = json.loads(out.read_text())["results"]["cells"]
    assert [cell["batch"] for cell in cells] == [1, 2]
    assert all(cell["methods"]["fast_speculative"]["tok_s_median"] > 0 for cell in cells)
    assert all(isinstance(cell["anatomy_ms"]["allreduce_hidden_1"], float) for cell in cells)


def torchrun(arguments: list[str], world: int = WORLD) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node world <arguments>` from the repository root (CPU, gloo)."""
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-port",
               str(_free_port()), *arguments]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S)


GREEDY_CLI = ["--max-new-tokens", "12", "--temperature", "0", "--no-progress"]


def test_cli_generate_tp_prints_the_unsharded_greedy_text_once():
    """`torchrun -m flashspec generate --tp`: rank 0 alone prints, and the text is the one-process fast
    path's greedy text (the default tiny models)."""
    sharded = torchrun(["-m", "flashspec", "generate", "--tp", *GREEDY_CLI])
    assert sharded.returncode == 0, sharded.stdout[-2000:] + sharded.stderr[-3000:]
    single = subprocess.run([sys.executable, "-m", "flashspec", "generate", "--engine", "fast", "--device", "cpu",
                             *GREEDY_CLI], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert single.returncode == 0, single.stderr[-3000:]
    assert sharded.stdout == single.stdout
    assert sharded.stdout.count("def fibonacci(n):") == 1
    assert sharded.stderr.count("generated tokens") == 1  # one summary table, from rank 0


def test_cli_generate_tp_errors_name_the_fix(capsys):
    """Outside torchrun, and with a world size that does not divide the heads, --tp exits 2 with one line."""
    assert cli.main(["generate", "--tp", "--no-progress"]) == 2
    assert "torchrun --nproc-per-node N -m flashspec generate --tp" in capsys.readouterr().err
    three = torchrun(["-m", "flashspec", "generate", "--tp", *GREEDY_CLI], world=3)
    assert three.returncode != 0
    assert "flashspec generate: error: --tp: tensor parallelism over 3 ranks" in three.stderr
    assert "launch with a world size in" in three.stderr


@pytest.mark.parametrize("tp_size", [1, 2])
def test_shard_forward_bytes_counts_each_ranks_parameters(tp_size):
    """The analytic per-rank bytes equal the parameters a rank holds (sharded ones split by the plan, the
    embedding table left out as an untied forward reads only a few rows) plus its heads' K/V."""
    from flashspec.tp import LAYER_PLAN_COLWISE, LAYER_PLAN_ROWWISE, shard_forward_bytes

    model = gqa_target()
    sharded = tuple(f"{name}.weight" for name in LAYER_PLAN_COLWISE + LAYER_PLAN_ROWWISE)
    counted = 0
    for name, parameter in model.named_parameters():
        if name == "model.embed_tokens.weight":
            continue
        counted += parameter.numel() // (tp_size if name.endswith(sharded) else 1)
    config = model.config
    kv = 2 * config.num_hidden_layers * 3 * 7 * config.num_key_value_heads * (config.hidden_size // 4)
    assert shard_forward_bytes(config, tp_size, batch=3, filled=7, element_size=4) == 4 * (counted + kv // tp_size)
