"""The verification-step benchmark: one speculative verification timed four ways on bf16 logits.

The Triton backend, the verify a user would write in PyTorch (`flashspec.baseline.verify_pytorch`: the
honest speed baseline), the bit-exact vectorised reference (`backend="torch"`: the kernels' correctness
oracle, not a speed baseline), and the per-token `.item()` host loop that the FlashSpec paper calls the
CPU bottleneck, side by side, with the floors measured in the same
run (one empty Triton launch; the bytes the step must read divided by the measured device-to-device copy
bandwidth), and a check on the GPU that Triton and torch emit the same tokens.  Kernel times are device
times (`triton.testing.do_bench`, CUDA events, L2 flushed) or CUDA-graph replays; `_wall_us` is the host
clock a Python loop sustains.  ``flashspec bench verify`` (`experiments/bench_verify.py`) writes
results/verify_h200.json from these functions.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

import flashspec as fs
from flashspec import rng
from flashspec.baseline import verify_pytorch
from flashspec.sampling import SamplingParams, warp_logits


# ----------------------------------------------------------------------------- the naive baseline
def verify_host_loop(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative verification as a per-token host loop: every accept decision is a `.item()`
    (a device sync), the residual is a `torch.multinomial` per rejected row. Exact, and slow
    for the reason the paper names: the CPU waits on the GPU once per candidate."""
    p = torch.softmax(target_logits.float() / temperature, dim=-1)
    q = torch.softmax(draft_logits.float() / temperature, dim=-1)
    batch, gamma = draft_tokens.shape
    tokens = [[-1] * (gamma + 1) for _ in range(batch)]
    num_accepted = []
    for row in range(batch):
        n = gamma
        for i in range(gamma):
            x = int(draft_tokens[row, i].item())
            ratio = (p[row, i, x] / q[row, i, x]).item()
            u = torch.rand((), device=p.device, generator=generator).item()
            if u < min(1.0, ratio):
                tokens[row][i] = x
            else:
                n = i
                break
        if n < gamma:
            residual = (p[row, n] - q[row, n]).clamp_min(0.0)
            emitted = torch.multinomial(residual / residual.sum(), 1, generator=generator).item()
        else:
            emitted = torch.multinomial(p[row, gamma], 1, generator=generator).item()
        tokens[row][n] = int(emitted)
        num_accepted.append(n)
    device = target_logits.device
    return torch.tensor(tokens, device=device), torch.tensor(num_accepted, device=device)


# ----------------------------------------------------------------------------- timing helpers
def _do_bench_us(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """Median device time of fn in µs (triton.testing.do_bench: CUDA events, L2 flushed between runs)."""
    import triton.testing

    return 1e3 * float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def _wall_us(fn: Callable[[], object], calls: int) -> float:
    """Host wall-clock per call over `calls` back-to-back calls (no L2 flush), synchronised at the end:
    the rate a Python loop sustains, CPU launch overhead included."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _capture_graph(fn: Callable[[], object], calls: int = 1) -> "torch.cuda.CUDAGraph":
    """`calls` back-to-back calls of fn captured in one CUDA graph (after a side-stream warm-up), replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _graph_us(fn: Callable[[], object]) -> float:
    """Median device time of one CUDA-graph replay of fn (launch gaps removed)."""
    return _do_bench_us(_capture_graph(fn).replay)


def _graph_warm_us(fn: Callable[[], object], steps: int = 20) -> float:
    """Device time per call when `steps` calls replay back to back from one CUDA graph, with no
    L2 flush: the steady state of a decode loop, whose logits were just written (and for
    small B still sit in the 60 MB L2)."""
    graph = _capture_graph(fn, steps)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / steps)
    return statistics.median(times)


def measure_floors() -> dict:
    """One empty Triton launch (eager and graph-replayed) and device copy bandwidth."""
    import triton

    @triton.jit
    def empty_kernel(ptr):
        pass

    scratch = torch.empty(1, device="cuda")
    empty_kernel[(1,)](scratch)
    launch_us = _do_bench_us(lambda: empty_kernel[(1,)](scratch))
    launch_graph_us = _graph_us(lambda: empty_kernel[(1,)](scratch))
    launch_graph_warm_us = _graph_warm_us(lambda: empty_kernel[(1,)](scratch))
    launch_wall_us = _wall_us(lambda: empty_kernel[(1,)](scratch), calls=500)
    numel = 1 << 30  # 2 GiB of bf16 each way
    src = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_us = _do_bench_us(lambda: dst.copy_(src))
    bytes_moved = 2 * src.numel() * src.element_size()  # read + write
    del src, dst
    torch.cuda.empty_cache()
    return {
        "empty_launch_us": launch_us,
        "empty_launch_graph_replay_us": launch_graph_us,
        "empty_launch_graph_warm_us": launch_graph_warm_us,
        "empty_launch_wall_us_per_call": launch_wall_us,
        "copy_bytes_read_plus_written": bytes_moved,
        "copy_us": copy_us,
        "bandwidth_bytes_per_s": bytes_moved / (copy_us * 1e-6),
    }


# ----------------------------------------------------------------------------- inputs
def make_inputs(batch: int, gamma: int, vocab: int, dtype: torch.dtype, params: SamplingParams,
                seed: int, with_draft: bool = True, device: str = "cuda"):
    """Target logits, a draft near the target (acceptance around one half), drafted tokens
    sampled from the draft's warped distribution."""
    generator = torch.Generator(device=device).manual_seed(seed)
    target = 3.0 * torch.randn(batch, gamma + 1, vocab, device=device, generator=generator)
    draft = target[:, :gamma] + 1.5 * torch.randn(batch, gamma, vocab, device=device, generator=generator)
    target, draft = target.to(dtype), draft.to(dtype)
    source = draft if with_draft else target[:, :gamma]
    probs = warp_logits(source, params).exp().reshape(-1, vocab)
    tokens = torch.multinomial(probs, 1, generator=generator).view(batch, gamma)
    return target, (draft if with_draft else None), tokens


# ----------------------------------------------------------------------------- correctness on the GPU
def correctness_checks() -> list[dict]:
    """Triton vs torch token by token on a few configurations, and draft = target ⇒ all accepted."""
    configs = [
        dict(batch=64, vocab=128256, dtype=torch.bfloat16, params=SamplingParams(1.0), with_draft=True),
        dict(batch=64, vocab=128256, dtype=torch.bfloat16, params=SamplingParams(0.7), with_draft=True),
        dict(batch=8, vocab=32000, dtype=torch.bfloat16, params=SamplingParams(0.0), with_draft=True),
        dict(batch=8, vocab=32000, dtype=torch.float32, params=SamplingParams(1.3), with_draft=False),
        dict(batch=8, vocab=32000, dtype=torch.float16, params=SamplingParams(0.8, top_k=50, top_p=0.9),
             with_draft=True),
        dict(batch=1, vocab=128256, dtype=torch.bfloat16, params=SamplingParams(1.0), with_draft=True),
    ]
    results = []
    gamma = 4
    for index, config in enumerate(configs):
        params = config["params"]
        target, draft, tokens = make_inputs(config["batch"], gamma, config["vocab"], config["dtype"], params,
                                            seed=100 + index, with_draft=config["with_draft"])
        rows_equal = 0
        rows = 0
        accepted = 0.0
        for seed in range(5):
            ref = fs.verify(target, draft, tokens, params, generator=seed, backend="torch")
            got = fs.verify(target, draft, tokens, params, generator=seed, backend="triton")
            same = (ref.tokens == got.tokens).all(dim=1) & (ref.num_accepted == got.num_accepted)
            rows_equal += int(same.sum().item())
            rows += config["batch"]
            accepted += float(ref.num_accepted.float().mean().item())
        results.append({
            "check": "triton_equals_torch",
            "batch": config["batch"], "gamma": gamma, "vocab": config["vocab"],
            "dtype": str(config["dtype"]).replace("torch.", ""),
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "draft_logits": config["with_draft"],
            "rows_equal": rows_equal, "rows": rows, "mean_num_accepted": accepted / 5,
        })
    for vocab in (32000, 128256):
        params = SamplingParams(1.0)
        target, _, tokens = make_inputs(64, gamma, vocab, torch.bfloat16, params, seed=7, with_draft=False)
        out = fs.verify(target, target[:, :gamma].contiguous(), tokens, params, generator=3, backend="triton")
        results.append({
            "check": "draft_equals_target_acceptance_rate",
            "batch": 64, "gamma": gamma, "vocab": vocab, "dtype": "bfloat16",
            "acceptance_rate": float(out.num_accepted.float().mean().item()) / gamma,
        })
    return results


# ----------------------------------------------------------------------------- the benchmark
def bench_point(batch: int, gamma: int, vocab: int, floors: dict, host_loop: bool) -> dict:
    from flashspec.kernels import prepare_verify
    from flashspec.kernels import verify as kernels

    params = SamplingParams(1.0)
    target, draft, tokens = make_inputs(batch, gamma, vocab, torch.bfloat16, params, seed=batch * 7 + vocab)
    key = rng.Key.from_seed(12345)
    element = target.element_size()
    logit_bytes = (target.numel() + draft.numel()) * element
    two_pass_bytes = logit_bytes + 2 * batch * vocab * element  # + the sampled row of target and draft
    floor_us = max(floors["empty_launch_us"], logit_bytes / floors["bandwidth_bytes_per_s"] * 1e6)

    def triton_step():
        return prepare_verify(target, draft, tokens, params, key).run()

    def triton_api():
        return fs.verify(target, draft, tokens, params, generator=5, backend="triton")

    def torch_step():
        return fs.verify(target, draft, tokens, params, generator=5, backend="torch")

    honest_generator = torch.Generator(device=target.device).manual_seed(5)

    def honest_step():  # what a user would write: softmax, gather, rand, multinomial (flashspec.baseline)
        return verify_pytorch(target, draft, tokens, params, honest_generator)

    prepared = prepare_verify(target, draft, tokens, params, key)
    prepared.run()
    torch.cuda.synchronize()
    point = {
        "batch": batch, "gamma": gamma, "vocab": vocab, "dtype": "bfloat16", "temperature": 1.0,
        "launches_per_step": prepared.plan.launches,
        "plan": {
            "block_b": prepared.plan.block_b,
            "stats_grid": list(prepared.stats_grid), "stats_block_v": prepared.plan.stats_block_v,
            "stats_warps": prepared.plan.stats_warps,
            "sample_grid": list(prepared.sample_grid), "sample_block_v": prepared.plan.sample_block_v,
            "sample_warps": prepared.plan.sample_warps,
        },
        "logit_bytes": logit_bytes,
        "two_pass_bytes": two_pass_bytes,
        "floor_us": floor_us,
        "triton_us": _do_bench_us(triton_step),
        "triton_api_us": _do_bench_us(triton_api),
        "triton_stats_kernel_us": _do_bench_us(prepared.launch_stats),
        "triton_sample_kernel_us": _do_bench_us(prepared.launch_sample),
        "triton_stats_kernel_warm_us": _graph_warm_us(prepared.launch_stats),
        "triton_sample_kernel_warm_us": _graph_warm_us(prepared.launch_sample),
        "triton_graph_replay_us": _graph_us(triton_step),
        "triton_graph_warm_us": _graph_warm_us(triton_step),
        "triton_wall_us_per_call": _wall_us(triton_step, calls=200),
        "triton_api_wall_us_per_call": _wall_us(triton_api, calls=200),
        "torch_us": _do_bench_us(torch_step),
        "torch_wall_us_per_call": _wall_us(torch_step, calls=20),
        "honest_torch_us": _do_bench_us(honest_step),
        "honest_torch_wall_us_per_call": _wall_us(honest_step, calls=50),
    }
    kernels.FAST_LAUNCH = False  # Triton's own launch path, for the host-overhead comparison
    try:
        point["triton_jit_launch_us"] = _do_bench_us(triton_step)
        point["triton_jit_launch_wall_us_per_call"] = _wall_us(triton_step, calls=200)
    finally:
        kernels.FAST_LAUNCH = True
    if host_loop:
        generator = torch.Generator(device="cuda").manual_seed(0)
        loop = lambda: verify_host_loop(target, draft, tokens, 1.0, generator)  # noqa: E731
        point["host_loop_us"] = _do_bench_us(loop, warmup_ms=10, rep_ms=100)
    point["triton_over_floor"] = point["triton_us"] / floor_us
    point["graph_over_floor"] = point["triton_graph_replay_us"] / floor_us
    point["graph_warm_over_floor"] = point["triton_graph_warm_us"] / floor_us
    point["torch_over_triton"] = point["torch_us"] / point["triton_us"]
    point["honest_over_triton"] = point["honest_torch_us"] / point["triton_us"]
    if host_loop:
        point["host_loop_over_triton"] = point["host_loop_us"] / point["triton_us"]
    point["achieved_bandwidth_fraction"] = (logit_bytes / (point["triton_us"] * 1e-6)) / floors["bandwidth_bytes_per_s"]
    return point


def plan_sweep(batch: int, gamma: int, vocab: int) -> list[dict]:
    """Per-kernel device time (L2 flushed, do_bench) for a few launch plans around the default."""
    from flashspec.kernels import make_plan, prepare_verify
    from flashspec.kernels import verify as kernels

    params = SamplingParams(1.0)
    target, draft, tokens = make_inputs(batch, gamma, vocab, torch.bfloat16, params, seed=1)
    key = rng.Key.from_seed(1)
    default = dict(kernels.GPU_PLAN)
    variants = [{"stats_block_v": v, "stats_max_tiles": t} for v in (2048, 4096) for t in (2, 4, 8)]
    variants += [{"sample_block_v": v, "sample_max_tiles": t} for v in (512, 1024) for t in (1, 2, 4)]
    rows = []
    try:
        for variant in variants:
            kernels.GPU_PLAN.update(default)
            kernels.GPU_PLAN.update(variant)
            make_plan.cache_clear()
            prepared = prepare_verify(target, draft, tokens, params, key)
            prepared.run()
            torch.cuda.synchronize()
            rows.append({
                "batch": batch, "vocab": vocab, **variant,
                "stats_grid": list(prepared.stats_grid), "sample_grid": list(prepared.sample_grid),
                "stats_kernel_us": _do_bench_us(prepared.launch_stats, rep_ms=100),
                "sample_kernel_us": _do_bench_us(prepared.launch_sample, rep_ms=100),
                "stats_kernel_warm_us": _graph_warm_us(prepared.launch_stats),
                "sample_kernel_warm_us": _graph_warm_us(prepared.launch_sample),
            })
            print(rows[-1], flush=True)
    finally:
        kernels.GPU_PLAN.update(default)
        make_plan.cache_clear()
    return rows


def format_table(points: list[dict], floors: dict) -> str:
    lines = [
        f"empty Triton launch {floors['empty_launch_us']:.2f} us (graph replay {floors['empty_launch_graph_replay_us']:.2f} us); "
        f"copy bandwidth {floors['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s",
        f"{'B':>3} {'V':>7} {'floor':>7} {'triton':>7} {'graph':>7} {'warm':>7} {'stats':>7} {'sample':>7} "
        f"{'wall':>7} {'jitwall':>7} {'torch':>8} {'hostloop':>9} {'tri/floor':>9} {'graph/fl':>8} {'warm/fl':>7} "
        f"{'torch/tri':>9} {'loop/tri':>8}",
    ]
    for p in points:
        loop = p.get("host_loop_us", float("nan"))
        lines.append(
            f"{p['batch']:>3} {p['vocab']:>7} {p['floor_us']:>7.2f} {p['triton_us']:>7.2f} "
            f"{p['triton_graph_replay_us']:>7.2f} {p['triton_graph_warm_us']:>7.2f} {p['triton_stats_kernel_us']:>7.2f} "
            f"{p['triton_sample_kernel_us']:>7.2f} {p['triton_wall_us_per_call']:>7.2f} "
            f"{p['triton_jit_launch_wall_us_per_call']:>7.2f} {p['torch_us']:>8.1f} {loop:>9.1f} "
            f"{p['triton_over_floor']:>9.2f} {p['graph_over_floor']:>8.2f} {p['graph_warm_over_floor']:>7.2f} "
            f"{p['torch_over_triton']:>9.1f} {p.get('host_loop_over_triton', float('nan')):>8.1f}"
        )
    lines.append("times in us. triton/graph/stats/sample/torch/hostloop: medians of triton.testing.do_bench (CUDA "
                 "events, L2 flushed before each call); warm: per step of 20 steps replayed from one CUDA graph, no "
                 "flush; wall/jitwall: host clock per call in a back-to-back loop with our cached launch / Triton's "
                 "own launch path")
    return "\n".join(lines)
