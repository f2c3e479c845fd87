"""The verification-step benchmark: one speculative verification timed several ways on bf16 logits.

The Triton backend (its default launch plan, and every launch-plan variant in `PLAN_VARIANTS`: the two
launches with a few tile sizes, the fused single launch), the verify a user would write in PyTorch
(`flashspec_lab.baseline.verify_pytorch`: the honest speed baseline, eagerly and, where it can be captured, in a
CUDA graph), the bit-exact vectorised reference (`backend="torch"`: the kernels' correctness oracle, not a
speed baseline), and the per-token `.item()` host loop that the FlashSpec paper calls the CPU bottleneck, side
by side, with the floor measured in the same run: max(one empty Triton launch, the bytes the step must read
divided by the measured device-to-device copy bandwidth) -- a launch-latency term, which sets the floor at
small B. Also a check on the GPU that both plans and torch emit the same tokens. Kernel times are device
times (`triton.testing.do_bench`, CUDA events, L2 flushed) or CUDA-graph replays; `_wall_us` is the host
clock a Python loop sustains. ``flashspec bench verify`` (`experiments/bench_verify.py`) writes
results/verify_h200.json from these functions; without a GPU (``--smoke``, Triton's interpreter) the same
code runs on tiny shapes with host-clock times and no graphs, to test the driver.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

import flashspec as fs
from flashspec import models, rng
from flashspec_lab.baseline import verify_pytorch
from flashspec.sampling import SamplingParams, warp_logits
from flashspec.verify import verify_reference


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
def _on_gpu() -> bool:
    """True when device times can be measured (CUDA present, Triton compiled, not interpreted)."""
    from flashspec.kernels.shims import interpreting

    return torch.cuda.is_available() and not interpreting()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _do_bench_us(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """Median device time of fn in µs (triton.testing.do_bench: CUDA events, L2 flushed between runs).
    Without a GPU (the CPU smoke run): `_do_bench_spread_us`'s host-timed calls."""
    return _do_bench_spread_us(fn, warmup_ms, rep_ms)[0]


SPREAD_QUANTILES = (0.2, 0.8)
SMOKE_CALLS = 2  # timed calls per measurement without a GPU: interpreted kernels take ~0.1 s a call


def _do_bench_spread_us(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 200) -> tuple[float, list[float]]:
    """(median, [20th, 80th percentile]) of fn's device time in µs (triton.testing.do_bench: CUDA events, L2
    flushed between runs); the spread is what a ratio of two such times may be claimed within. Without a GPU
    (the CPU smoke run): `SMOKE_CALLS` host-timed calls (their median and their range: the smoke run checks the
    driver, not the numbers)."""
    if not _on_gpu():
        samples = []
        for _ in range(SMOKE_CALLS):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        return statistics.median(samples), [min(samples), max(samples)]
    import triton.testing

    low, median, high = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                                quantiles=[SPREAD_QUANTILES[0], 0.5, SPREAD_QUANTILES[1]])
    return 1e3 * float(median), [1e3 * float(low), 1e3 * float(high)]


def _latency_spread_us(fn: Callable[[], object], reps: int = 50) -> tuple[float, list[float]]:
    """(median, [20th, 80th percentile]) µs of one call from an idle GPU to the end of its last kernel, the host's
    launch included: the L2 flushed and the device synchronised before each call, CUDA events around it. The eager
    time of one call as a caller that waits for it sees it. `do_bench` instead records its start event while the
    GPU still runs the flush it just queued (a 256 MB write), so a call that the host launches before the flush
    ends is timed as device time alone, and a slower one with the host time past the flush: a host-bound step lands
    on either side from run to run. Without a GPU (the CPU smoke run): `_do_bench_spread_us`'s host-timed calls."""
    if not _on_gpu():
        return _do_bench_spread_us(fn)
    timer = _idle_call_timer()
    fn()
    return _median_spread([timer(fn) for _ in range(reps)])


def _median_spread(samples: list[float]) -> tuple[float, list[float]]:
    """(median, [20th, 80th percentile]) of some samples."""
    quantiles = statistics.quantiles(samples, n=5)  # 20th, 40th, 60th, 80th percentiles
    return statistics.median(samples), [quantiles[0], quantiles[-1]]


def _idle_call_clock() -> Callable[[Callable[[], object]], tuple[float, float]]:
    """A function timing one call from an idle GPU with its launch included, as (µs to its last kernel's end, µs
    of host time in the call itself): the L2 flushed with the buffer `do_bench` writes, the device synchronised,
    CUDA events around the call, the host's clock around the call alone. Without a GPU: host-timed, both alike."""
    if not _on_gpu():
        def host_timed(fn: Callable[[], object]) -> tuple[float, float]:
            start = time.perf_counter()
            fn()
            host = (time.perf_counter() - start) * 1e6
            return host, host
        return host_timed
    from triton.runtime import driver

    device = driver.active
    cache = device.get_empty_cache_for_benchmark()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(fn: Callable[[], object]) -> tuple[float, float]:
        device.clear_cache(cache)
        torch.cuda.synchronize()
        start.record()
        host = time.perf_counter()
        fn()
        host = time.perf_counter() - host
        end.record()
        end.synchronize()
        return 1e3 * start.elapsed_time(end), 1e6 * host
    return timed


def _idle_call_timer() -> Callable[[Callable[[], object]], float]:
    """A function timing one call (µs) from an idle GPU with its launch included (`_idle_call_clock`'s first
    time). Without a GPU: host-timed."""
    clock = _idle_call_clock()
    return lambda fn: clock(fn)[0]


_HOST_SWEEP: list = []  # a buffer larger than the host's caches, made on first use


def _sweep_host_caches() -> None:
    """Read 64 MB on the host: whatever a call left in the CPU caches is gone (no torch, no GPU involved)."""
    import numpy as np

    if not _HOST_SWEEP:
        _HOST_SWEEP.append(np.ones(8 << 20))
    float(_HOST_SWEEP[0].sum())


HOST_STATES = ("warm", "cold")  # before each timed call: an untimed call of itself / a sweep of the host's caches


def _paired_ratio(numerator: Callable[[], object], denominator: Callable[[], object],
                  reps: int = 50, host: str | None = None) -> tuple[float, list[float], dict]:
    """(median, [20th, 80th percentile]) of numerator's time over denominator's, each call timed as
    `_latency_spread_us` times it, the two alternating call by call (which goes first alternating too), and
    each side's own (median, [20th, 80th percentile]) µs over the pairs, keyed "numerator" / "denominator" (what
    each call took while paired, beside its medians timed alone), and under "by_order" the ratio's median over the
    pairs where the numerator ran first and over those where the denominator did.
    Host-bound calls move with the host's speed, which drifts over a run: two medians taken minutes apart can
    differ by more than the plans they compare (one plan timed twice in one H200 run took 70 and 120 µs), while
    a pair's two calls meet the same host, so the ratio of each pair carries the comparison.

    `host` sets what each timed call finds in the host's CPU caches. None: whatever the call before it left, so
    each call follows the other one half the time. A large call evicts a small one's host state, which then
    launches slower, and not the other way round (`experiments/verify_interference.py`), so None is not
    symmetric. "warm": each timed call right after an untimed call of itself; "cold": right after a sweep of
    the host's caches. Both give the two calls the same condition."""
    if host is not None and host not in HOST_STATES:
        raise ValueError(f"host must be None or one of {HOST_STATES}, got {host!r}")
    timer = _idle_call_timer()
    if _on_gpu():
        numerator(), denominator()
    else:
        reps = SMOKE_CALLS  # one pair in each order: the CPU smoke run checks the driver

    def timed(fn: Callable[[], object]) -> float:
        if host == "warm":
            fn()
        elif host == "cold":
            _sweep_host_caches()
        return timer(fn)

    ratios, tops, bottoms = [], [], []
    for rep in range(reps):
        first, second = (numerator, denominator) if rep % 2 == 0 else (denominator, numerator)
        a, b = timed(first), timed(second)
        top, bottom = (a, b) if rep % 2 == 0 else (b, a)
        ratios.append(top / bottom)
        tops.append(top)
        bottoms.append(bottom)
    median, spread = _median_spread(ratios)
    by_order = {"numerator_first": statistics.median(ratios[0::2]),
                "denominator_first": statistics.median(ratios[1::2]) if len(ratios) > 1 else None}
    return median, spread, {"numerator": _median_spread(tops), "denominator": _median_spread(bottoms),
                            "by_order": by_order}


def _wall_us(fn: Callable[[], object], calls: int) -> float:
    """Host wall-clock per call over `calls` back-to-back calls (no L2 flush), synchronised at the end:
    the rate a Python loop sustains, CPU launch overhead included. Without a GPU (the CPU smoke run): one call,
    timed once."""
    rounds = 3
    if _on_gpu():
        fn()
        _sync()
    else:
        calls = rounds = 1
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _capture_graph(fn: Callable[[], object], calls: int = 1) -> "torch.cuda.CUDAGraph":
    """`calls` back-to-back calls of fn captured in one CUDA graph (after a side-stream warm-up), replayed once."""
    if not _on_gpu():
        raise RuntimeError("CUDA graphs need a CUDA GPU")
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


def _attempt(fn: Callable[[], float]) -> tuple[float | None, str | None]:
    """(fn(), None), or (None, the error's text) when it raises: a measurement that may fail on some
    setup (a capture that syncs, a plan that does not compile) is recorded, never fatal."""
    try:
        return fn(), None
    except Exception as error:  # noqa: BLE001 -- the text goes into the results file
        _sync_quietly()
        return None, _error_text(error)


def _error_text(error: BaseException) -> str:
    """'Type: first line' of an error and of the error it was raised while handling, if any."""
    def line(e: BaseException) -> str:
        text = str(e).strip()
        return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"

    context = error.__cause__ or error.__context__
    return line(error) + (f" (while handling {line(context)})" if context is not None else "")


def _sync_quietly() -> None:
    try:
        _sync()
    except Exception:  # noqa: BLE001 -- a broken capture may leave an error to clear
        pass


def measure_floors(copy_numel: int = 1 << 30) -> dict:
    """One empty Triton launch (eager and graph-replayed) and device copy bandwidth (`copy_numel` bf16
    elements each way; 2 GiB by default)."""
    import triton

    @triton.jit
    def empty_kernel(ptr):
        pass

    device = "cuda" if torch.cuda.is_available() else "cpu"
    scratch = torch.empty(1, device=device)
    empty_kernel[(1,)](scratch)
    launch_us = _do_bench_us(lambda: empty_kernel[(1,)](scratch))
    launch_graph_us, graph_error = _attempt(lambda: _graph_us(lambda: empty_kernel[(1,)](scratch)))
    launch_graph_warm_us, _ = _attempt(lambda: _graph_warm_us(lambda: empty_kernel[(1,)](scratch)))
    launch_wall_us = _wall_us(lambda: empty_kernel[(1,)](scratch), calls=500)
    launched = _launch_floor_latencies(empty_kernel, scratch)
    src = torch.randn(copy_numel, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_us = _do_bench_us(lambda: dst.copy_(src))
    bytes_moved = 2 * src.numel() * src.element_size()  # read + write
    del src, dst
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    floors = {
        "empty_launch_us": launch_us,
        "empty_launch_graph_replay_us": launch_graph_us,
        "empty_launch_graph_warm_us": launch_graph_warm_us,
        "empty_launch_wall_us_per_call": launch_wall_us,
        **launched,
        "copy_bytes_read_plus_written": bytes_moved,
        "copy_us": copy_us,
        "bandwidth_bytes_per_s": bytes_moved / (copy_us * 1e-6),
    }
    if graph_error:
        floors["graph_error"] = graph_error
    return floors


def _launch_floor_latencies(kernel, scratch: torch.Tensor) -> dict:
    """One and two empty launches timed as the eager step is (`_latency_spread_us`: from an idle GPU, launch
    included), through the warm verify step's launch path (its cached binary called with a raw address): what
    any step of that many launches costs from Python before its kernels do any work, so the honest baseline's
    time over it bounds the eager ratio a plan of that many launches can reach."""
    from flashspec.kernels.launcher import _Launcher

    launcher = _Launcher(kernel)
    launcher((1,), (scratch,), {}, 0)  # compiled and cached under key 0
    args = (scratch.data_ptr(),) if _on_gpu() else (scratch,)  # the interpreter needs the tensor

    def one() -> None:
        launcher((1,), args, {}, 0)

    def two() -> None:
        launcher((1,), args, {}, 0)
        launcher((1,), args, {}, 0)

    floors = {}
    for name, fn in (("one_empty_launch_latency_us", one), ("two_empty_launches_latency_us", two)):
        floors[name], floors[name + "_spread"] = _latency_spread_us(fn)
    return floors


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
def correctness_checks(smoke: bool = False) -> list[dict]:
    """Triton (the default plan and the fused launch) vs torch token by token on a few configurations,
    and draft = target ⇒ all accepted. `smoke`: tiny float32 shapes on whatever device there is."""
    import flashspec_lab.kernels  # noqa: F401  (registers the fused launch)
    from flashspec.kernels import verify_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if smoke:
        configs = [dict(batch=2, vocab=40, dtype=torch.float32, params=SamplingParams(1.0), with_draft=True),
                   dict(batch=2, vocab=40, dtype=torch.float32, params=SamplingParams(0.0), with_draft=True)]
    else:
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
    gamma = 2 if smoke else 4
    seeds = range(2 if smoke else 5)
    for index, config in enumerate(configs):
        params = config["params"]
        target, draft, tokens = make_inputs(config["batch"], gamma, config["vocab"], config["dtype"], params,
                                            seed=100 + index, with_draft=config["with_draft"], device=device)
        rows_equal = rows_equal_fused = rows = 0
        accepted = 0.0
        fused_error = None
        for seed in seeds:
            ref = fs.verify(target, draft, tokens, params, generator=seed, backend="torch")
            got = fs.verify(target, draft, tokens, params, generator=seed, backend="triton")
            same = (ref.tokens == got.tokens).all(dim=1) & (ref.num_accepted == got.num_accepted)
            rows_equal += int(same.sum().item())
            try:
                fused_tokens, fused_accepted = verify_triton(target, draft, tokens, params,
                                                             rng.key_from_generator(seed), fused=True)
                same = (ref.tokens == fused_tokens).all(dim=1) & (ref.num_accepted == fused_accepted)
                rows_equal_fused += int(same.sum().item())
            except Exception as error:  # noqa: BLE001 -- recorded; the default plan's check still counts
                fused_error = f"{type(error).__name__}: {error}"
            rows += config["batch"]
            accepted += float(ref.num_accepted.float().mean().item())
        check = {
            "check": "triton_equals_torch",
            "batch": config["batch"], "gamma": gamma, "vocab": config["vocab"],
            "dtype": str(config["dtype"]).replace("torch.", ""),
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "draft_logits": config["with_draft"],
            "rows_equal": rows_equal, "rows_equal_fused": rows_equal_fused, "rows": rows,
            "mean_num_accepted": accepted / len(seeds),
        }
        if fused_error:
            check["fused_error"] = fused_error
        results.append(check)
    for vocab in ((40,) if smoke else (32000, 128256)):
        params = SamplingParams(1.0)
        batch = 4 if smoke else 64
        dtype = torch.float32 if smoke else models.half_dtype(device)
        target, _, tokens = make_inputs(batch, gamma, vocab, dtype, params, seed=7, with_draft=False, device=device)
        out = fs.verify(target, target[:, :gamma].contiguous(), tokens, params, generator=3, backend="triton")
        results.append({
            "check": "draft_equals_target_acceptance_rate",
            "batch": batch, "gamma": gamma, "vocab": vocab, "dtype": str(dtype).replace("torch.", ""),
            "acceptance_rate": float(out.num_accepted.float().mean().item()) / gamma,
        })
    return results


def checks_failed(checks: list[dict]) -> list[dict]:
    """The correctness checks that failed: a row where a Triton plan and torch differ, a failed fused
    launch, or draft = target not accepting everything."""
    return [c for c in checks
            if (c["check"] == "triton_equals_torch"
                and (c["rows_equal"] != c["rows"] or c["rows_equal_fused"] != c["rows"] or "fused_error" in c))
            or (c["check"] == "draft_equals_target_acceptance_rate" and c["acceptance_rate"] != 1.0)]


# ----------------------------------------------------------------------------- the benchmark
# Launch-plan variants timed at every point: overrides of `flashspec.kernels.plan.GPU_PLAN`. The fastest by
# warm CUDA-graph replay becomes that shape's `SHAPE_PLANS` entry (`plan_choice`).
PLAN_VARIANTS: dict[str, dict[str, int]] = {
    "two_launch": {},
    "two_launch_sample_bv256": {"sample_block_v": 256, "sample_max_tiles": 4},
    # 128-token tiles: the records before the two-level race timed them; now raised to one block of 256
    "two_launch_sample_bv128": {"sample_block_v": 128, "sample_max_tiles": 8},
    "fused": {"fused": 1, "sample_block_v": 2048},  # one program streams the sampled row: a wider tile
    # per-lane race winners in the token race of rows of one sampling block (V <= sampling.SAMPLE_BLOCK; longer
    # rows race blocks, which lanes leave as they are): one cross-warp reduction per chunk, not per tile
    "lanes": {"lanes": 1},
    "lanes_tiles8": {"lanes": 1, "sample_max_tiles": 8},
    # the accept test once per row block, in the stats launch: the sampling programs read its outcome
    "accept_once": {"accept_once": 1, "lanes": 1},
    "accept_once_tiles8": {"accept_once": 1, "lanes": 1, "sample_max_tiles": 8},
    "accept_once_bv256": {"accept_once": 1, "lanes": 1, "sample_block_v": 256, "sample_max_tiles": 4},
    # the stats pass at one tile per program (the most programs, no serial loop to hide latency in) or in
    # narrower tiles of 4 warps, with the sampling plan of accept_once_bv256
    "stats_tiles1": {"accept_once": 1, "lanes": 1, "sample_block_v": 256, "sample_max_tiles": 4,
                     "stats_max_tiles": 1},
    "stats_bv2048": {"accept_once": 1, "lanes": 1, "sample_block_v": 256, "sample_max_tiles": 4,
                     "stats_block_v": 2048, "stats_max_tiles": 2},
    # one cooperative launch: every program loads its chunk of all 2γ+1 rows at once, meets its row's other
    # programs at a barrier and samples from its own chunk (one program per SM, or two; tiles of 512 or 256)
    "coop": {"coop": 1},
    "coop_bv256": {"coop": 1, "coop_block_v": 256},
    "coop_2_per_sm": {"coop": 1, "coop_programs_per_sm": 2},
    "coop_2_per_sm_lanes": {"coop": 1, "coop_programs_per_sm": 2, "lanes": 1},
    # the best two-launch plans of the last runs, their sampling launch a programmatic dependent launch
    "two_launch_sample_bv128_pdl": {"sample_block_v": 128, "sample_max_tiles": 8, "pdl": 1},
    "two_launch_sample_bv256_pdl": {"sample_block_v": 256, "sample_max_tiles": 4, "pdl": 1},
    "accept_once_pdl": {"accept_once": 1, "lanes": 1, "pdl": 1},
    "accept_once_tiles8_pdl": {"accept_once": 1, "lanes": 1, "sample_max_tiles": 8, "pdl": 1},
    "stats_bv2048_pdl": {"accept_once": 1, "lanes": 1, "sample_block_v": 256, "sample_max_tiles": 4,
                         "stats_block_v": 2048, "stats_max_tiles": 2, "pdl": 1},
    # one launch, one program per row over a thread-block cluster of 8 blocks (SM90+, Triton >= 3.9): the
    # blocks meet in distributed shared memory, not global memory; 512 logits of the tile per block at 4 warps,
    # or 1024 at 8; the log-sum-exp loop prefetching 3 tiles ahead, or none. The H200 runs of 2, 4 and 8 blocks
    # (results/verify_cluster*_h200_triton39.json) found it several times slower than two launches at every point.
    "cluster_c8": {"cluster": 1, "cluster_ctas": 8},
    "cluster_c8_w8": {"cluster": 1, "cluster_ctas": 8, "cluster_block_v": 1024, "cluster_warps": 8},
    "cluster_c8_w8_s1": {"cluster": 1, "cluster_ctas": 8, "cluster_block_v": 1024, "cluster_warps": 8,
                         "cluster_stages": 1},
    # the stats pass as it was before its per-lane partials (GPU_PLAN's stats_lane_elems, on in every other
    # variant): each tile reduced across the program's threads
    "stats_lanes_off": {"stats_lane_elems": 0},
    "stats_bv2048_pdl_lanes_off": {"accept_once": 1, "lanes": 1, "sample_block_v": 256, "sample_max_tiles": 4,
                                   "stats_block_v": 2048, "stats_max_tiles": 2, "pdl": 1, "stats_lane_elems": 0},
    # the stats grid around the default's, with lanes_tiles8's sampling plan: at most two tiles or one per program
    # (more programs, shorter loops, more tickets per row), wider tiles of 8192 logits (more bytes in flight per
    # load), or twice the programs per SM (the target grid of both passes)
    "stats_tiles2": {"lanes": 1, "sample_max_tiles": 8, "stats_max_tiles": 2},
    "stats_tiles1_lanes": {"lanes": 1, "sample_max_tiles": 8, "stats_max_tiles": 1},
    "stats_bv8192": {"lanes": 1, "sample_max_tiles": 8, "stats_block_v": 8192},
    "programs_8_per_sm": {"lanes": 1, "sample_max_tiles": 8, "programs_per_sm": 8},
    # one launch, the residual drawn by rejection from p (residual="rejection", kernels/one_pass.py): another
    # sampler with its own reference, so never a `SHAPE_PLANS` entry (`is_rejection`); the default stats grid, at
    # most two tiles or one per program, or tiles of 2048 logits
    "one_pass": {"residual_rejection": 1},
    "one_pass_tiles2": {"residual_rejection": 1, "stats_max_tiles": 2},
    "one_pass_tiles1": {"residual_rejection": 1, "stats_max_tiles": 1},
    "one_pass_bv2048": {"residual_rejection": 1, "stats_block_v": 2048, "stats_max_tiles": 2},
    # diagnostics of the one-pass kernel (wrong tokens, never chosen): its streaming part alone, and up to the
    # accept test; what is left of its replay is the ticket's wait and the proposals
    "diagnostic_one_pass_stream": {"residual_rejection": 1, "one_pass_stop": 1},
    "diagnostic_one_pass_accept": {"residual_rejection": 1, "one_pass_stop": 2},
    # diagnostics, never chosen: what approximate log/exp would save (their tokens may differ at near-ties), in
    # the default plan and in stats_bv2048's, whose sampling kernel takes ~50 µs at B = 64, V = 128k: how much of
    # that is the per-element math
    "diagnostic_fast_math": {"precise": 0},
    "diagnostic_fast_math_bv2048": {"accept_once": 1, "lanes": 1, "sample_block_v": 256, "sample_max_tiles": 4,
                                    "stats_block_v": 2048, "stats_max_tiles": 2, "precise": 0},
}


def is_rejection(overrides: dict[str, int]) -> bool:
    """A variant of the one-pass plan, which draws the residual by rejection (residual="rejection")."""
    return bool(overrides.get("residual_rejection", 0))


def is_diagnostic(overrides: dict[str, int]) -> bool:
    """A variant that is timed but never becomes a default (it does not round as the reference does, or, the
    one-pass plan stopped early, does not sample at all)."""
    return overrides.get("precise", 1) == 0 or overrides.get("one_pass_stop", 0) != 0


def _plan_record(prepared) -> dict:
    """The grid and block sizes of a prepared step, for the results file."""
    plan, structure, own = prepared.plan, prepared.plan.structure, prepared.plan.params
    grid = list(prepared.launches[0].grid)
    if structure == "one_pass":
        return {"one_pass": True, "fused": False, "grid": grid, "block_v": plan.stats_block_v,
                "warps": plan.stats_warps}
    if structure == "cluster":
        return {"cluster": True, "fused": False, "grid": grid, "ctas": own.ctas, "block_v": own.block_v,
                "warps": own.warps}
    if structure == "coop":
        return {"coop": True, "fused": False, "lanes": plan.lanes, "grid": grid, "chunk": own.chunk,
                "block_v": own.block_v, "warps": own.warps}
    if structure == "fused":
        return {"fused": True, "block_b": plan.block_b, "lanes": plan.lanes, "grid": grid,
                "stats_block_v": plan.stats_block_v, "sample_block_v": plan.sample_block_v,
                "warps": plan.stats_warps}
    return {"fused": False, "block_b": plan.block_b, "lanes": plan.lanes, "accept_once": plan.accept_once,
            "pdl": plan.pdl,
            "stats_grid": list(prepared.named("stats").grid), "stats_block_v": plan.stats_block_v,
            "stats_warps": plan.stats_warps,
            "sample_grid": list(prepared.named("sample").grid), "sample_block_v": plan.sample_block_v,
            "sample_warps": plan.sample_warps}


def _variant_options(overrides: dict[str, int]) -> dict:
    """The `fused`, `tuning` and `residual` arguments of a launch-plan variant (fused None: the tuning decides; False
    would forbid the cooperative plan). Registers the lab's launch structures, which the variants name."""
    import flashspec_lab.kernels  # noqa: F401  (registers fused, coop and cluster)

    tuning = {name: value for name, value in overrides.items() if name != "residual_rejection"}
    return {"fused": True if overrides.get("fused", 0) else None, "tuning": tuple(sorted(tuning.items())),
            "residual": "rejection" if is_rejection(overrides) else "race"}


def variant_prepare(inputs: tuple, params: SamplingParams, key: rng.Key, overrides: dict[str, int]) -> Callable:
    """`prepare_verify` of the inputs under a launch-plan variant's overrides, as a function of no arguments."""
    from flashspec.kernels import prepare_verify

    options = _variant_options(overrides)
    return lambda: prepare_verify(*inputs, params, key, **options)


def variant_step(inputs: tuple, params: SamplingParams, key: rng.Key, overrides: dict[str, int]) -> Callable:
    """One eager step under a launch-plan variant's overrides as a caller makes it (`verify_triton`: a warm step
    launched straight from its binding), as a function of no arguments."""
    from flashspec.kernels import verify_triton

    options = _variant_options(overrides)
    return lambda: verify_triton(*inputs, params, key, **options)


def bench_variant(inputs: tuple, params: SamplingParams, key: rng.Key, overrides: dict[str, int],
                  expected: dict[str, tuple[torch.Tensor, torch.Tensor]] | None) -> dict:
    """One launch-plan variant at one point: its grid, eager step time (do_bench) and warm graph replay,
    and whether it returns the reference's tokens for `key` (`expected`, by residual sampler). A failure is
    recorded."""
    prepare = variant_prepare(inputs, params, key, overrides)
    step = variant_step(inputs, params, key, overrides)
    row: dict = {"overrides": dict(overrides)}
    try:
        prepared = prepare()
        # the cluster plan falls back to another where the GPU lacks clusters: it would time that under its name
        if overrides.get("cluster", 0) and prepared.plan.structure != "cluster":
            import triton

            row["error"] = (f"unavailable: the cluster plan needs an SM90+ GPU and Triton >= 3.9 "
                            f"(Triton {triton.__version__} here)")
            return row
        prepared.run()  # compiles and caches the binaries
        step()  # binds the warm step
        tokens, accepted = step()  # launched straight from that binding, as the timings below launch it
        _sync()
        row.update(launches=prepared.plan.launches, plan=_plan_record(prepared), registers=prepared.registers())
        if expected is not None:
            wanted = expected[_variant_options(overrides)["residual"]]
            row["tokens_equal_reference"] = bool(torch.equal(tokens, wanted[0]) and torch.equal(accepted, wanted[1]))
        row["eager_us"], row["eager_us_spread"] = _do_bench_spread_us(step, rep_ms=100)
        row["latency_us"], row["latency_us_spread"] = _latency_spread_us(step)
    except Exception as error:  # noqa: BLE001 -- recorded; the other variants still run
        _sync_quietly()
        row["error"] = f"{type(error).__name__}: {error}"
        return row
    row["graph_warm_us"], graph_error = _attempt(lambda: _graph_warm_us(step))
    if graph_error:
        row["graph_error"] = graph_error
    plan = prepared.plan
    if plan.structure == "two_launch":  # two launches: each alone
        for launch in ("stats", "sample"):
            row[f"{launch}_kernel_warm_us"], error = _attempt(lambda: _graph_warm_us(_launching(prepared, launch)))
            if error:
                row[f"{launch}_kernel_warm_error"] = error
    if plan.structure == "one_pass":  # its structure: one launch whose last program per row samples
        from flashspec_lab.kernels.chain_probe import chain_step

        row["chain_floor_us"], error = _attempt(lambda: _graph_warm_us(chain_step(inputs[0], plan, one_launch=True).run))
        if error:
            row["chain_floor_error"] = error
    elif plan.structure not in ("fused", "cluster"):  # the cluster plan has no chain through global memory
        row.update(_chain_floor(inputs[0], plan))
    return row


def _launching(prepared, name: str) -> Callable[[], None]:
    """A function of no arguments firing the launch `name` of a prepared step alone (the two launches' "stats" and
    "sample" are timed apart)."""
    return lambda: prepared.launch(name)


def _chain_floor(target: torch.Tensor, plan) -> dict:
    """The dependency chain of `plan`'s design (two launches, or one cooperative launch) at its grids with almost
    no arithmetic (`flashspec_lab.kernels.chain_probe`), as a warm graph replay: the latency floor of that
    plan's structure; and, for a two-launch plan, the chain of a step that samples in its stats launch at the same
    stats grid (`one_launch_chain_floor_us`): the floor of folding the sampling pass into the first launch."""
    from flashspec_lab.kernels.chain_probe import chain_step

    value, error = _attempt(lambda: _graph_warm_us(chain_step(target, plan).run))
    row = {"chain_floor_us": value, **({"chain_floor_error": error} if error else {})}
    if plan.structure != "coop":
        value, error = _attempt(lambda: _graph_warm_us(chain_step(target, plan, one_launch=True).run))
        row.update({"one_launch_chain_floor_us": value, **({"one_launch_chain_floor_error": error} if error else {})})
    return row


def _best(variants: dict[str, dict], key: str, rejection: bool = False) -> str | None:
    """The variant with the smallest `key` among those that measured it and returned the reference's tokens
    (diagnostic variants excluded), of the residual race (the launch-plan table's) or, `rejection`, of the
    one-pass plan."""
    timed = {name: row[key] for name, row in variants.items()
             if row.get(key) is not None and row.get("tokens_equal_reference", True)
             and not is_diagnostic(row["overrides"]) and is_rejection(row["overrides"]) == rejection}
    return min(timed, key=timed.get) if timed else None


def bench_point(batch: int, gamma: int, vocab: int, floors: dict, host_loop: bool,
                variants: dict[str, dict[str, int]] | None = None, device: str | None = None) -> dict:
    """Every timing of one (B, V) point: the floor, the honest PyTorch baseline, the Triton step with the
    default plan (eager, graph replay, warm graph, each kernel), each launch-plan variant, the bit-exact
    reference, the host loop. `device`: "cuda" (default when present) or "cpu" for the smoke run."""
    from flashspec.kernels import prepare_verify, verify_triton
    from flashspec.kernels import verify as kernels

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    variants = PLAN_VARIANTS if variants is None else variants
    params = SamplingParams(1.0)
    dtype = torch.bfloat16 if _on_gpu() else torch.float32  # the interpreter computes bf16 wrong
    target, draft, tokens = make_inputs(batch, gamma, vocab, dtype, params, seed=batch * 7 + vocab, device=device)
    key = rng.Key.from_seed(12345)
    element = target.element_size()
    logit_bytes = (target.numel() + draft.numel()) * element
    two_pass_bytes = logit_bytes + 2 * batch * vocab * element  # + the sampled row of target and draft
    bytes_us = logit_bytes / floors["bandwidth_bytes_per_s"] * 1e6
    floor_us = max(floors["empty_launch_us"], bytes_us)
    graph_launch_us = floors.get("empty_launch_graph_warm_us")

    def triton_step():  # what `flashspec.verify` and the engines call
        return verify_triton(target, draft, tokens, params, key)

    def triton_api():
        return fs.verify(target, draft, tokens, params, generator=5, backend="triton")

    def torch_step():
        return fs.verify(target, draft, tokens, params, generator=5, backend="torch")

    honest_generator = torch.Generator(device=target.device).manual_seed(5)

    def honest_step():  # what a user would write: softmax, gather, rand, multinomial (flashspec_lab.baseline)
        return verify_pytorch(target, draft, tokens, params, honest_generator)

    def honest_race_step():  # the same with an exponential race instead of multinomial (no host sync)
        return verify_pytorch(target, draft, tokens, params, honest_generator, sampler="race")

    prepared = prepare_verify(target, draft, tokens, params, key)
    prepared.run()
    two = prepared if prepared.plan.launches == 2 else prepare_verify(target, draft, tokens, params, key, fused=False)
    two.run()
    _sync()
    reference = verify_reference(target, draft, tokens, params, key)
    by_rejection = verify_reference(target, draft, tokens, params, key, residual="rejection")
    expected = {"race": (reference.tokens, reference.num_accepted),
                "rejection": (by_rejection.tokens, by_rejection.num_accepted)}
    point = {
        "batch": batch, "gamma": gamma, "vocab": vocab, "dtype": str(dtype).replace("torch.", ""),
        "temperature": 1.0,
        "launches_per_step": prepared.plan.launches,
        "plan": _plan_record(prepared),
        "logit_bytes": logit_bytes,
        "target_logit_bytes": target.numel() * element,
        "two_pass_bytes": two_pass_bytes,
        "floor_us": floor_us,
        "floor_launch_us": floors["empty_launch_us"],
        "floor_bytes_us": bytes_us,
        "floor_set_by": "bytes" if bytes_us > floors["empty_launch_us"] else "one launch",
        "graph_floor_us": max(graph_launch_us, bytes_us) if graph_launch_us is not None else None,
        "latency_floor_by_launches_us": {str(n): floors[key] for n, key in
                                         ((1, "one_empty_launch_latency_us"), (2, "two_empty_launches_latency_us"))
                                         if floors.get(key) is not None},
        **dict(zip(("honest_torch_us", "honest_torch_us_spread"), _do_bench_spread_us(honest_step))),
        "honest_torch_wall_us_per_call": _wall_us(honest_step, calls=50),
        "honest_race_torch_us": _do_bench_us(honest_race_step),
        **dict(zip(("triton_us", "triton_us_spread"), _do_bench_spread_us(triton_step))),
        **dict(zip(("honest_torch_latency_us", "honest_torch_latency_us_spread"), _latency_spread_us(honest_step))),
        **dict(zip(("triton_latency_us", "triton_latency_us_spread"), _latency_spread_us(triton_step))),
        "triton_api_us": _do_bench_us(triton_api),
        "triton_stats_kernel_us": _do_bench_us(_launching(two, "stats")),
        "triton_sample_kernel_us": _do_bench_us(_launching(two, "sample")),
    }
    # the same step without draft logits (q one-hot at the drafted token): its stats pass streams the target's
    # logits only, what a step given the draft's log-normalisers by its drafter would read
    target_only = prepare_verify(target, None, tokens, params, key, fused=False)
    target_only.run()
    # the step given the draft's log-probs (fp32, as it sampled from them): its stats pass streams the target only
    log_q = warp_logits(draft.float(), params)

    def log_probs_step():
        return verify_triton(target, log_q, tokens, params, key, draft_is_log_probs=True)

    with_log_probs = prepare_verify(target, log_q, tokens, params, key, draft_is_log_probs=True)
    log_probs_tokens = with_log_probs.run()
    log_probs_step()
    log_probs_expected = verify_reference(target, log_q, tokens, params, key, draft_is_log_probs=True)
    graph_timings = {
        "triton_stats_kernel_warm_us": lambda: _graph_warm_us(_launching(two, "stats")),
        "triton_sample_kernel_warm_us": lambda: _graph_warm_us(_launching(two, "sample")),
        "triton_graph_replay_us": lambda: _graph_us(triton_step),
        "triton_graph_warm_us": lambda: _graph_warm_us(triton_step),
        "target_only_stats_kernel_warm_us": lambda: _graph_warm_us(_launching(target_only, "stats")),
        "target_only_graph_warm_us": lambda: _graph_warm_us(target_only.run),
        "log_probs_stats_kernel_warm_us": lambda: _graph_warm_us(_launching(with_log_probs, "stats")),
        "log_probs_graph_warm_us": lambda: _graph_warm_us(log_probs_step),
    }
    for name, measure in graph_timings.items():
        point[name], error = _attempt(measure)
        if error:
            point[name.replace("_us", "_error")] = error
    point["log_probs_tokens_equal_reference"] = bool(
        torch.equal(log_probs_tokens[0], log_probs_expected.tokens)
        and torch.equal(log_probs_tokens[1], log_probs_expected.num_accepted))
    point.update(_rejection_timings(target, draft, log_q, tokens, params, key, honest_step))
    point.update({
        "triton_wall_us_per_call": _wall_us(triton_step, calls=200),
        "triton_api_wall_us_per_call": _wall_us(triton_api, calls=200),
        "torch_us": _do_bench_us(torch_step, rep_ms=100),
        "torch_wall_us_per_call": _wall_us(torch_step, calls=10),
    })
    point.update(_chain_floor(target, two.plan if prepared.plan.structure == "fused" else prepared.plan))
    point["variants"] = {name: bench_variant((target, draft, tokens), params, key, overrides, expected)
                         for name, overrides in variants.items()}
    # the eager bars' ratios, each from calls of the honest baseline and of the step timed alternately
    best = _best_variant(point["variants"])
    paired = {"honest_over_triton_paired": triton_step}
    if best is not None:
        point["paired_best_variant"] = best
        paired["honest_over_best_paired"] = variant_step((target, draft, tokens), params, key,
                                                         point["variants"][best]["overrides"])
    # the same pairs with both calls finding the host alike (see `_paired_ratio`)
    pairs = [(name, step, None) for name, step in paired.items()]
    pairs += [(f"honest_over_triton_paired_{host}", triton_step, host) for host in HOST_STATES]
    for name, step, host in pairs:
        measured, error = _attempt(lambda: _paired_ratio(honest_step, step, host=host))
        if error:
            point[name + "_error"] = error
            continue
        # the ratio, its spread, and what the honest baseline and the step each took while paired
        point[name], point[name + "_range"], sides = measured
        point[name + "_sides_us"] = {"honest": sides["numerator"], "step": sides["denominator"]}
        if host is None:  # as found, the ratio by which call ran first shows the pairs' asymmetry
            point[name + "_by_order"] = {"honest_first": sides["by_order"]["numerator_first"],
                                         "step_first": sides["by_order"]["denominator_first"]}
    kernels.FAST_LAUNCH = False  # Triton's own launch path, for the host-overhead comparison
    try:
        point["triton_jit_launch_us"] = _do_bench_us(triton_step)
        point["triton_jit_launch_wall_us_per_call"] = _wall_us(triton_step, calls=200)
    finally:
        kernels.FAST_LAUNCH = True
    if host_loop:
        generator = torch.Generator(device=device).manual_seed(0)
        loop = lambda: verify_host_loop(target, draft, tokens, 1.0, generator)  # noqa: E731
        point["host_loop_us"] = _do_bench_us(loop, warmup_ms=10, rep_ms=100)
    point.update(point_ratios(point))
    return point


def _rejection_timings(target: torch.Tensor, draft: torch.Tensor, log_q: torch.Tensor, tokens: torch.Tensor,
                       params: SamplingParams, key: rng.Key, honest_step: Callable) -> dict:
    """The step with residual="rejection" (the one-pass plan) at one point, given the draft's logits and given its
    log-probs: tokens against its reference, eager (do_bench, idle-GPU latency, paired with the honest baseline),
    warm graph replay, and how the inputs' rows ended (`flashspec.verify.rejection_fallbacks`)."""
    from flashspec.kernels import verify_triton
    from flashspec.verify import rejection_fallbacks

    def step():
        return verify_triton(target, draft, tokens, params, key, residual="rejection")

    def log_probs_step():
        return verify_triton(target, log_q, tokens, params, key, draft_is_log_probs=True, residual="rejection")

    row: dict = {}
    for name, call, given in (("rejection", step, False), ("rejection_log_probs", log_probs_step, True)):
        try:
            call()
            got_tokens, got_accepted = call()  # the warm step, launched straight from its binding
            want = verify_reference(target, log_q if given else draft, tokens, params, key, given, "rejection")
            row[f"{name}_tokens_equal_reference"] = bool(torch.equal(got_tokens, want.tokens)
                                                         and torch.equal(got_accepted, want.num_accepted))
        except Exception as error:  # noqa: BLE001 -- recorded; the benchmark goes on
            _sync_quietly()
            row[f"{name}_error"] = f"{type(error).__name__}: {error}"
            continue
        row[f"{name}_graph_warm_us"], error = _attempt(lambda: _graph_warm_us(call))
        if error:
            row[f"{name}_graph_error"] = error
    if "rejection_error" in row:
        return row
    row["rejection_eager_us"], row["rejection_eager_us_spread"] = _do_bench_spread_us(step)
    row["rejection_latency_us"], row["rejection_latency_us_spread"] = _latency_spread_us(step)
    measured, error = _attempt(lambda: _paired_ratio(honest_step, step, host=None))
    if error:
        row["honest_over_rejection_paired_error"] = error
    else:
        row["honest_over_rejection_paired"], row["honest_over_rejection_paired_range"], sides = measured
        row["honest_over_rejection_paired_sides_us"] = {"honest": sides["numerator"], "step": sides["denominator"]}
    row["rejection_rows"] = rejection_fallbacks(target, draft, tokens, params, key)
    return row


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _ratio_range(numerator: list[float] | None, denominator: list[float] | None) -> list[float] | None:
    """[least, most] a ratio of two timings can be within their spreads ([low, high] each)."""
    if not numerator or not denominator or min(denominator) <= 0:
        return None
    return [numerator[0] / denominator[1], numerator[1] / denominator[0]]


def shortest_chain_floor(point: dict, keep: Callable[[dict], bool] = lambda row: True,
                         key: str = "chain_floor_us") -> float | None:
    """The shortest dependency-chain probe (µs; `key`: "one_launch_chain_floor_us" for the one-launch chain at
    each plan's stats grid) among a point's variants whose row `keep` accepts, or None."""
    chains = [row[key] for row in point.get("variants", {}).values() if keep(row) and row.get(key) is not None]
    return min(chains) if chains else None


def newest_points(records: list[dict]) -> dict[tuple[int, int], tuple[dict, dict]]:
    """(batch, vocab) -> (point, its record) over benchmark records, each point from the newest record that timed
    it (by the record's provenance date; a record without one counts as oldest): where a later run timed a point
    again, the book reads the later run."""
    ordered = sorted(records, key=lambda record: str(record["provenance"].get("date_utc") or ""))
    return {(point["batch"], point["vocab"]): (point, record)
            for record in ordered for point in record["results"]["points"]}


def issue_bound_step_us(ncu_record: dict, batch: int, vocab: int, bytes_floor_us: float,
                         variant: str = "default") -> float | None:
    """The least a two-launch step can take at (batch, vocab) by its kernels' instruction counts: the stats pass at
    the larger of its issue floor and the bytes floor (it can overlap reading and arithmetic), then the sampling
    pass at its issue floor (it starts when the stats pass ends). Issue floors from an `experiments/verify_ncu.py`
    record (each kernel's warp instructions at full issue); None where the record lacks them."""
    for entry in ncu_record["results"]:
        if (entry["batch"], entry["vocab"], entry["variant"]) == (batch, vocab, variant):
            floors = {("stats" if "_stats" in kernel["name"] else "sample"): kernel.get("issue_floor_us")
                      for kernel in entry["launched"]}
            if floors.get("stats") and floors.get("sample"):
                return max(bytes_floor_us, floors["stats"]) + floors["sample"]
    return None


def best_replay(point: dict, keep: Callable[[dict], bool]) -> tuple[str, float] | None:
    """(name, warm replay µs) of the fastest variant at a point among those whose overrides `keep` accepts (as
    `_best` picks: correct tokens, no diagnostics), or None if none was timed."""
    variants = point.get("variants", {})
    name = _best({n: row for n, row in variants.items() if keep(row["overrides"])}, "graph_warm_us")
    return None if name is None else (name, variants[name]["graph_warm_us"])


TARGETS_GRAPH_OVER_FLOOR = 2.0  # the replay bar: warm CUDA-graph replay within this many floors

# The structures a verify step can take, each with the test of a variant's overrides that says it has it: two
# launches (the stats pass, then the sampling pass), the same with the second a programmatic dependent launch, one
# launch whose last program per row samples the whole row (fused), one cooperative launch with a barrier per row,
# one launch per row over a thread-block cluster, and one launch with the residual drawn by rejection (one pass).
STRUCTURES: dict[str, Callable[[dict], bool]] = {
    "two launches": lambda o: not any(o.get(key) for key in ("pdl", "fused", "coop", "cluster", "residual_rejection")),
    "two launches, dependent launch": lambda o: bool(o.get("pdl")) and not is_rejection(o),
    "one launch, fused": lambda o: bool(o.get("fused")) and not is_rejection(o),
    "one launch, cooperative": lambda o: bool(o.get("coop")) and not is_rejection(o),
    "one launch, cluster": lambda o: bool(o.get("cluster")) and not is_rejection(o),
    "one launch, rejection": is_rejection,
}


# The default steps given the draft's log-probs instead of its logits, as `standings` names them: (name, the point's
# replay key, the point's key saying its tokens equalled the reference's)
GIVEN_LOG_PROBS = (("two launches given log-probs", "log_probs_graph_warm_us", "log_probs_tokens_equal_reference"),
                   ("one launch, rejection, given log-probs", "rejection_log_probs_graph_warm_us",
                    "rejection_log_probs_tokens_equal_reference"))


def standings(point: dict) -> dict[str, dict]:
    """The fastest exact warm replay of each structure a point's variants timed (`STRUCTURES`; diagnostics and
    variants whose tokens differ from the reference left out): {structure: {"variant", "us", "over_floor"}}, and
    the default plans given the draft's log-probs instead of its logits ("... given log-probs": the race's two
    launches and the one pass, where recorded). Structures with no timed variant are absent."""
    variants = point.get("variants", {})
    rows: dict[str, dict] = {}
    for name, keep in STRUCTURES.items():
        chosen = {n: row for n, row in variants.items() if keep(row["overrides"])}
        best = _best(chosen, "graph_warm_us", rejection=name == "one launch, rejection")
        if best is not None:
            rows[name] = {"variant": best, "us": chosen[best]["graph_warm_us"]}
    for name, key, correct in GIVEN_LOG_PROBS:
        if point.get(key) is not None and point.get(correct, True):
            rows[name] = {"variant": "default", "us": point[key]}
    for row in rows.values():
        row["over_floor"] = row["us"] / point["floor_us"]
    return rows


def bar_reached(points: list[dict], bar: float = TARGETS_GRAPH_OVER_FLOOR, given_log_probs: bool = False) -> dict:
    """The replay bar across every structure, over the points of one or more runs of the same (B, V) set: per
    (batch, vocab), the best structure's replay over the floor in each run, and whether every run had one within
    `bar` ("met"), only some ("within spread": the runs disagree), or none ("missed"). The step is the one the
    floor is counted for, the draft's logits read; `given_log_probs` also counts the steps given its log-probs
    (which read fewer bytes than that floor counts where the bytes set it)."""
    by_point: dict[tuple[int, int], list[tuple[str, float]]] = {}
    for point in points:
        rows = {name: row for name, row in standings(point).items()
                if given_log_probs or name not in {given[0] for given in GIVEN_LOG_PROBS}}
        if rows:
            name = min(rows, key=lambda n: rows[n]["over_floor"])
            by_point.setdefault((point["batch"], point["vocab"]), []).append((name, rows[name]["over_floor"]))
    summary = {}
    for key, runs in sorted(by_point.items()):
        within = [ratio <= bar for _, ratio in runs]
        summary[key] = {"best": runs, "verdict": "met" if all(within) else "within spread" if any(within)
                        else "missed"}
    return summary


def cluster_over_others(point: dict) -> float | None:
    """The fastest cluster plan's warm replay over the fastest other plan's, at one point of one run."""
    cluster = best_replay(point, lambda overrides: bool(overrides.get("cluster")))
    other = best_replay(point, lambda overrides: not overrides.get("cluster"))
    return None if cluster is None or other is None else cluster[1] / other[1]


def _best_variant(variants: dict[str, dict]) -> str | None:
    """The plan choice at a point: the fastest warm replay, else (no graph timed) the fastest eager step."""
    return _best(variants, "graph_warm_us") or _best(variants, "eager_us")


def point_ratios(point: dict) -> dict:
    """The ratios of one point: against the floor, the honest baseline over the Triton step, and the same for
    the best recorded variant (what the step costs once `SHAPE_PLANS` holds this point's choice)."""
    floor = point["floor_us"]
    variants = point.get("variants", {})
    best = _best_variant(variants)
    best_row = variants[best] if best else {}
    ratios = {
        "triton_over_floor": _ratio(point["triton_us"], floor),
        "graph_over_floor": _ratio(point.get("triton_graph_replay_us"), floor),
        "graph_warm_over_floor": _ratio(point.get("triton_graph_warm_us"), floor),
        "graph_warm_over_graph_floor": _ratio(point.get("triton_graph_warm_us"), point.get("graph_floor_us")),
        "torch_over_triton": _ratio(point["torch_us"], point["triton_us"]),
        "honest_over_triton": _ratio(point["honest_torch_us"], point["triton_us"]),
        "honest_over_graph_warm": _ratio(point["honest_torch_us"], point.get("triton_graph_warm_us")),
        "achieved_bandwidth_fraction": _ratio(point["floor_bytes_us"], point["triton_us"]),  # copy bandwidth = 1
        "best_variant": best,
        "best_variant_by": "graph_warm_us" if best_row.get("graph_warm_us") is not None else "eager_us",
        "best_variant_eager": _best(variants, "eager_us"),
        "best_graph_warm_us": best_row.get("graph_warm_us"),
        "best_eager_us": best_row.get("eager_us"),
        "best_graph_warm_over_floor": _ratio(best_row.get("graph_warm_us"), floor),
        "graph_warm_over_chain_floor": _ratio(point.get("triton_graph_warm_us"), point.get("chain_floor_us")),
        "best_chain_floor_us": best_row.get("chain_floor_us"),
        "best_graph_warm_over_chain_floor": _ratio(best_row.get("graph_warm_us"), best_row.get("chain_floor_us")),
        "honest_over_best_eager": _ratio(point["honest_torch_us"], best_row.get("eager_us")),
        # within the timings' spreads (20th-80th percentile), where the record has them
        "honest_over_triton_range": _ratio_range(point.get("honest_torch_us_spread"), point.get("triton_us_spread")),
        "honest_over_best_eager_range": _ratio_range(point.get("honest_torch_us_spread"),
                                                     best_row.get("eager_us_spread")),
        # the same from an idle GPU with the host's launch included (`_latency_spread_us`), where recorded
        "honest_over_triton_latency": _ratio(point.get("honest_torch_latency_us"), point.get("triton_latency_us")),
        "honest_over_best_latency": _ratio(point.get("honest_torch_latency_us"), best_row.get("latency_us")),
        "honest_over_triton_latency_range": _ratio_range(point.get("honest_torch_latency_us_spread"),
                                                         point.get("triton_latency_us_spread")),
        "honest_over_best_latency_range": _ratio_range(point.get("honest_torch_latency_us_spread"),
                                                       best_row.get("latency_us_spread")),
    }
    # the most the eager ratio can reach with this plan's number of launches: the honest baseline over that many
    # empty launches timed the same way (None where the record lacks either)
    floor_by_launches = point.get("latency_floor_by_launches_us", {})
    ratios["honest_over_launch_floor_latency"] = _ratio(
        point.get("honest_torch_latency_us"), floor_by_launches.get(str(point.get("launches_per_step"))))
    if "host_loop_us" in point:
        ratios["host_loop_over_triton"] = _ratio(point["host_loop_us"], point["triton_us"])
    # the one-pass plan (residual="rejection"): as run by default, and its fastest variant
    best_rejection = _best(variants, "graph_warm_us", rejection=True) or _best(variants, "eager_us", rejection=True)
    best_rejection_row = variants[best_rejection] if best_rejection else {}
    ratios.update({
        "rejection_graph_warm_over_floor": _ratio(point.get("rejection_graph_warm_us"), floor),
        "rejection_log_probs_graph_warm_over_floor": _ratio(point.get("rejection_log_probs_graph_warm_us"), floor),
        "best_rejection_variant": best_rejection,
        "best_rejection_graph_warm_us": best_rejection_row.get("graph_warm_us"),
        "best_rejection_graph_warm_over_floor": _ratio(best_rejection_row.get("graph_warm_us"), floor),
        "honest_over_rejection_eager": _ratio(point["honest_torch_us"], point.get("rejection_eager_us")),
    })
    return ratios


HONEST_GRAPH_KEYS = {"race": "honest_race_graph", "multinomial": "honest_torch_graph"}


def honest_graph_timings(points: list[dict], sampler: str, device: str | None = None) -> None:
    """Capture the honest baseline (`sampler` "race" or "multinomial") in a CUDA graph at every point, in
    place: its warm replay time, or the error's text. torch.multinomial checks its input by reading a value
    back to the host, which a capture forbids; after one failed capture the remaining points are not tried
    (a failed capture can leave the stream in capture mode's aftermath, so the benchmark runs it last)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    prefix = HONEST_GRAPH_KEYS[sampler]
    failed = None
    for point in points:
        if failed:
            point[f"{prefix}_error"] = f"not tried: the capture failed at B={failed[0]}, V={failed[1]}"
            continue
        params = SamplingParams(1.0)
        dtype = models.half_dtype(device) if _on_gpu() else torch.float32
        target, draft, tokens = make_inputs(point["batch"], point["gamma"], point["vocab"], dtype, params,
                                            seed=point["batch"] * 7 + point["vocab"], device=device)
        step = lambda: verify_pytorch(target, draft, tokens, params, None, sampler=sampler)  # noqa: E731
        point[f"{prefix}_warm_us"], error = _attempt(lambda: _graph_warm_us(step))
        if error:
            point[f"{prefix}_error"] = error
            failed = (point["batch"], point["vocab"])
        point[f"{prefix}_over_triton_graph_warm"] = _ratio(point[f"{prefix}_warm_us"],
                                                            point.get("triton_graph_warm_us"))


def plan_choice(points: list[dict]) -> dict:
    """The fastest variant per measured point (warm graph replay) as `SHAPE_PLANS` entries, and the
    dict to paste into flashspec/kernels/plan.py as the running Triton version's table."""
    from flashspec.kernels.plan import shape_bucket

    table: dict[tuple[int, int], dict[str, int]] = {}
    chosen = {}
    for point in points:
        best = point.get("best_variant")
        if best is None:
            continue
        bucket = shape_bucket(point["batch"], point["vocab"])
        table.setdefault(bucket, point["variants"][best]["overrides"])
        chosen[f"B={point['batch']} V={point['vocab']}"] = {"variant": best, "by": point.get("best_variant_by"),
                                                            "bucket": list(bucket)}
    import triton

    from flashspec.kernels.plan import triton_version

    paste = f"SHAPE_PLANS_BY_TRITON[{triton_version(triton.__version__)}] = {{\n" + "".join(
        f"    {bucket}: {overrides},\n" for bucket, overrides in sorted(table.items())) + "}"
    return {"by": "warm CUDA-graph replay, else eager where no graph was timed (ties: the first variant listed)",
            "chosen": chosen, "paste": paste}


# Targets of the verify step: the warm graph replay within 2x the floor everywhere; the eager
# step (one call, launch included) 10x faster than the honest PyTorch verify at B <= 8 and 3x at B = 64.
TARGETS = {"graph_over_floor_max": TARGETS_GRAPH_OVER_FLOOR, "honest_over_eager_min_for_batch_le_8": 10.0,
           "honest_over_eager_at_batch_64": 3.0}


def verdicts(points: list[dict], targets: dict[str, float] = TARGETS) -> dict:
    """PASS / MISS per target from the measurements: 'as_run' with the plan each point ran by default,
    'with_plan_choice' with the fastest recorded variant (what the default gives once SHAPE_PLANS is
    filled from this run). A target whose points were not measured is 'NOT MEASURED'. Where every point
    records its timings' spread (20th-80th percentile), the bar is judged at both ends too: 'WITHIN SPREAD'
    when the ends disagree, so no verdict rests on a difference smaller than the noise."""
    def bar(name: str, chosen: list[dict], as_run: str, with_choice: str, worst, passes) -> dict:
        row = {"target": targets[name], "points": [f"B={p['batch']} V={p['vocab']}" for p in chosen]}
        for label, key in (("as_run", as_run), ("with_plan_choice", with_choice)):
            values = [p.get(key) for p in chosen]
            if not chosen or any(v is None for v in values):
                row[label] = {"measured": None, "verdict": "NOT MEASURED"}
                continue
            measured = worst(values)
            row[label] = {"measured": measured, "verdict": "PASS" if passes(measured, targets[name]) else "MISS"}
            ranges = [p.get(key + "_range") for p in chosen]
            if all(ranges):  # the bar judged at both ends of the spreads: a verdict the noise could flip is none
                ends = [worst([r[0] for r in ranges]), worst([r[1] for r in ranges])]
                row[label]["range"] = sorted(ends)
                outcomes = {passes(end, targets[name]) for end in ends}
                if len(outcomes) == 2:
                    row[label]["verdict"] = "WITHIN SPREAD"
        return row

    def eager_bar(name: str, chosen: list[dict]) -> dict:
        """An eager bar on paired launch-included calls where every point recorded them, else on the
        launch-included latencies' medians, else on do_bench's times."""
        def recorded(key: str) -> bool:
            return bool(chosen) and all(p.get(key) is not None for p in chosen)

        if recorded("honest_over_triton_paired"):
            keys, timing = (("honest_over_triton_paired", "honest_over_best_paired"),
                            "one call from an idle GPU, launch included, the honest baseline's and the step's "
                            "calls alternating: the median of the pairs' ratios (range: their 20th-80th percentiles)")
        elif recorded("honest_over_triton_latency"):
            keys, timing = (("honest_over_triton_latency", "honest_over_best_latency"),
                            "one call from an idle GPU, launch included")
        else:
            keys, timing = (("honest_over_triton", "honest_over_best_eager"),
                            "do_bench: device time, plus any host launch time past its L2 flush")
        row = bar(name, chosen, *keys, min, lambda m, t: m >= t)
        row["timing"] = timing
        for host in HOST_STATES:  # the bar with both calls finding the host's caches alike
            key = f"honest_over_triton_paired_{host}"
            if recorded(key):
                row.setdefault("by_host_state", {})[host] = bar(name, chosen, key, key, min,
                                                                lambda m, t: m >= t)["as_run"]
        return row

    def rejection_eager_bar(name: str, chosen: list[dict]) -> dict:
        """The one-pass step's eager bar: paired launch-included calls (its fastest variant is not paired)."""
        row = bar(name, chosen, "honest_over_rejection_paired", "honest_over_rejection_paired", min,
                  lambda m, t: m >= t)
        row["timing"] = "one call from an idle GPU, launch included, paired with the honest baseline's"
        return row

    return {
        # the step with residual="rejection" (one launch, kernels/one_pass.py): as run by default and at its
        # fastest variant
        "residual_rejection": {
            "graph_over_floor_max": bar("graph_over_floor_max", points, "rejection_graph_warm_over_floor",
                                        "best_rejection_graph_warm_over_floor", max, lambda m, t: m <= t),
            "graph_over_floor_max_given_log_probs": bar(
                "graph_over_floor_max", points, "rejection_log_probs_graph_warm_over_floor",
                "rejection_log_probs_graph_warm_over_floor", max, lambda m, t: m <= t),
            "honest_over_eager_min_for_batch_le_8": rejection_eager_bar(
                "honest_over_eager_min_for_batch_le_8", [p for p in points if p["batch"] <= 8]),
            "honest_over_eager_at_batch_64": rejection_eager_bar(
                "honest_over_eager_at_batch_64", [p for p in points if p["batch"] == 64]),
        },
        "graph_over_floor_max": bar("graph_over_floor_max", points, "graph_warm_over_floor",
                                    "best_graph_warm_over_floor", max, lambda m, t: m <= t),
        "honest_over_eager_min_for_batch_le_8": eager_bar("honest_over_eager_min_for_batch_le_8",
                                                          [p for p in points if p["batch"] <= 8]),
        "honest_over_eager_at_batch_64": eager_bar("honest_over_eager_at_batch_64",
                                                   [p for p in points if p["batch"] == 64]),
    }


def plan_sweep(batch: int, gamma: int, vocab: int) -> list[dict]:
    """Per-kernel device time (L2 flushed, do_bench) for a few two-launch plans around the default."""
    from flashspec.kernels import prepare_verify

    params = SamplingParams(1.0)
    target, draft, tokens = make_inputs(batch, gamma, vocab, torch.bfloat16, params, seed=1)
    key = rng.Key.from_seed(1)
    variants = [{"stats_block_v": v, "stats_max_tiles": t} for v in (2048, 4096) for t in (2, 4, 8)]
    variants += [{"sample_block_v": v, "sample_max_tiles": t} for v in (512, 1024) for t in (1, 2, 4)]
    rows = []
    for variant in variants:
        prepared = prepare_verify(target, draft, tokens, params, key, fused=False,
                                  tuning=tuple(sorted(variant.items())))
        prepared.run()
        torch.cuda.synchronize()
        rows.append({
            "batch": batch, "vocab": vocab, **variant,
            "stats_grid": list(prepared.named("stats").grid), "sample_grid": list(prepared.named("sample").grid),
            "stats_kernel_us": _do_bench_us(_launching(prepared, "stats"), rep_ms=100),
            "sample_kernel_us": _do_bench_us(_launching(prepared, "sample"), rep_ms=100),
            "stats_kernel_warm_us": _graph_warm_us(_launching(prepared, "stats")),
            "sample_kernel_warm_us": _graph_warm_us(_launching(prepared, "sample")),
        })
        print(rows[-1], flush=True)
    return rows


def _cell(value: float | None, width: int, digits: int = 1) -> str:
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def format_table(points: list[dict], floors: dict) -> str:
    """The benchmark's table: floor, honest baseline, the Triton step eager and replayed, the best variant."""
    graph = floors.get("empty_launch_graph_replay_us")
    lines = [
        f"empty Triton launch {floors['empty_launch_us']:.2f} us (graph replay "
        f"{'n/a' if graph is None else f'{graph:.2f}'} us); "
        f"copy bandwidth {floors['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s",
        f"{'B':>3} {'V':>7} {'floor':>7} {'honest':>8} {'triton':>7} {'graph':>7} {'warm':>7} {'stats':>7} "
        f"{'sample':>7} {'wall':>7} {'torch':>8} {'hostloop':>9} {'warm/fl':>7} {'hon/tri':>7} {'best':>24} "
        f"{'bestwarm':>8} {'bestw/fl':>8}",
    ]
    for p in points:
        lines.append(
            f"{p['batch']:>3} {p['vocab']:>7} {p['floor_us']:>7.2f} {p['honest_torch_us']:>8.1f} "
            f"{p['triton_us']:>7.2f} {_cell(p.get('triton_graph_replay_us'), 7, 2)} "
            f"{_cell(p.get('triton_graph_warm_us'), 7, 2)} {p['triton_stats_kernel_us']:>7.2f} "
            f"{p['triton_sample_kernel_us']:>7.2f} {p['triton_wall_us_per_call']:>7.2f} {p['torch_us']:>8.1f} "
            f"{_cell(p.get('host_loop_us'), 9)} {_cell(p.get('graph_warm_over_floor'), 7, 2)} "
            f"{_cell(p.get('honest_over_triton'), 7)} {str(p.get('best_variant')):>24} "
            f"{_cell(p.get('best_graph_warm_us'), 8, 2)} {_cell(p.get('best_graph_warm_over_floor'), 8, 2)}"
        )
    lines.append("times in us. floor: max(one empty launch, logit bytes / copy bandwidth). honest: the PyTorch "
                 "verify a user would write (flashspec_lab.baseline, multinomial). triton/graph/stats/sample/torch/"
                 "hostloop: medians of triton.testing.do_bench (CUDA events, L2 flushed before each call); warm: per "
                 "step of 20 steps replayed from one CUDA graph, no flush; wall: host clock per call in a "
                 "back-to-back loop; torch: the bit-exact reference (the correctness oracle); best: the fastest "
                 "launch-plan variant by warm replay")
    return "\n".join(lines)
