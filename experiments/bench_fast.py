"""Engine benchmark, side by side in one run: HF plain `generate`, HF assisted generation, FlashSpec's
eager engine, FlashSpec fast plain decoding (same runner and graphs, no drafts) and FlashSpec fast
speculative decoding (the model drafts + prompt lookup under Thompson sampling), with lazy draft
catch-up and with every draft kept in sync, and with one draft only. `--compile` compiles the fast
methods' dense regions (`flashspec.runner.compile_regions`) before their graphs are captured.

Random-weight bf16 models shaped like TinyLlama-1.1B (target) and llama-68m (draft), γ = 4, T = 1.
Every method is warmed up with one full request, then timed `--repeats` times; tok/s reports the
median and the min/max of the repeats. Also: the fast step's anatomy (each captured forward and the
verify timed alone from their own graphs), the cost of a draft switch (a policy that alternates two
model drafts against one that never switches, in both sync modes), and the HBM roofline.

`--quantization nf4` loads the random target in bitsandbytes NF4 (the drafts stay bf16), as
`models.load_model(path, quantization="nf4")` loads a checkpoint, and runs one timed repeat by
default. Every method records its step latency p50 and p99 and a trace of its cold (first) and warm
(last) request: the slowest steps (index, arm, ms), the steps above 3x the median, and what the
CUDA caching allocator and Python's garbage collector did during the request, so a p99 can be told
apart as warm-up (compiles, autotuning, graph capture: outliers in the cold request only) or
recurring (allocator growth, GC). A method that raises is recorded with its error text instead of
stopping the run; a fast method that fails retries without compile, then without CUDA graphs, and
says so in its entry. The JSON is rewritten after every method.

    python experiments/bench_fast.py --out results/bench_fast_h200.json        # on a GPU
    python experiments/bench_fast.py --smoke                                    # tiny, CPU: checks it runs
    python experiments/bench_fast.py --quantization nf4 --compile --batches 1 --new-tokens 128   # NF4 target
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_runner import copy_bandwidth, floor_bytes, time_calls  # noqa: E402

import flashspec as fs  # noqa: E402
from flashspec import models  # noqa: E402
from flashspec_lab import cli_checks, provenance
from flashspec.drafters import PromptLookupDrafter  # noqa: E402
from flashspec.engine import SpeculativeDecoder  # noqa: E402
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder  # noqa: E402
from flashspec.runner import COMPILE_MODES, capture  # noqa: E402
from flashspec.stats import percentile  # noqa: E402


class Alternate:
    """A policy that changes arm every step (the worst case for switching)."""

    def __init__(self, n_arms: int) -> None:
        self.n_arms, self.t = n_arms, 0

    def select(self) -> int:
        self.t += 1
        return self.t % self.n_arms

    def update(self, arm: int, reward: float) -> None:
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed requests per method after one warm-up (default 3; 1 with --quantization)")
    parser.add_argument("--skip", nargs="*", default=[], help="methods to leave out")
    parser.add_argument("--pair", choices=["random", "zoo-gpu"], default="random",
                        help="random: TinyLlama-1.1B / llama-68m shapes with random weights; zoo-gpu: the trained GPU zoo "
                             "(target + four drafts, built on first use), prompts from its held-out Python text")
    parser.add_argument("--compile", nargs="?", const="default", default=False, choices=COMPILE_MODES,
                        help="compile the fast methods' dense regions (torch.compile mode, default 'default')")
    parser.add_argument("--hf-assisted-max-batch", type=int, default=8,
                        help="HF assisted generation runs rows one after another: skip it above this batch")
    parser.add_argument("--quantization", choices=["nf4"], default=None,
                        help="nf4: the target's decoder layers in bitsandbytes 4-bit NF4 (drafts stay unquantized); "
                             "needs bitsandbytes and a CUDA GPU (or its CPU backend with --smoke)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if args.repeats is None:
        args.repeats = 1 if args.quantization else 3
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.quantization and args.pair != "random":
        parser.error("--quantization applies to --pair random (the random-weight TinyLlama target)")
    if args.smoke:
        args.batches, args.new_tokens, args.prompt_tokens, args.repeats = [1], 12, 8, 1
    return args


def build(args: argparse.Namespace, device: torch.device) -> tuple[torch.nn.Module, list[torch.nn.Module], Any]:
    """(target, model drafts, zoo or None): the first draft is the one HF assisted generation uses."""
    dtype = models.half_dtype(device) if device.type == "cuda" else torch.float32
    if args.pair == "zoo-gpu":
        from flashspec_lab import zoo as zoo_module

        zoo = zoo_module.load_zoo("cpu" if args.smoke else "gpu", device=str(device), dtype=dtype, progress=False)
        names = sorted(zoo.drafts, key=lambda name: name != "draft-general")  # generalist first
        return zoo.target.eval(), [zoo.drafts[name].eval() for name in names], zoo
    if args.smoke:
        # NF4 packs weights in blocks of 64 inputs: the quantized smoke target is 64 wide
        width = 64 if args.quantization else 32
        target = models.tiny_llama(vocab_size=64, hidden_size=width, num_layers=2, seed=1).to(device, dtype)
        drafts = [models.tiny_llama(vocab_size=64, hidden_size=16, num_layers=1, seed=seed).to(device, dtype)
                  for seed in (2, 3)]
    else:
        target = models.model_from_config(models.tinyllama_1b_config(), seed=1).to(device, dtype).eval()
        drafts = [models.model_from_config(models.llama_68m_config(), seed=seed).to(device, dtype).eval()
                  for seed in (2, 3)]
    if args.quantization == "nf4":
        target = quantized_target(target, device, args.smoke)
    return target, drafts, None


def quantized_target(dense: torch.nn.Module, device: torch.device, smoke: bool) -> torch.nn.Module:
    """`dense` reloaded with NF4 decoder weights (`models.quantize_nf4`: saved, then loaded through
    transformers' bitsandbytes path, as `load_model(..., quantization="nf4")` loads a checkpoint).
    Raises ValueError where NF4 cannot run: without bitsandbytes, and on the CPU outside --smoke."""
    if device.type != "cuda" and not smoke:
        raise ValueError("--quantization nf4 needs CUDA for the TinyLlama-shaped target (bitsandbytes 4-bit "
                         "kernels); on a CPU only --smoke runs, through bitsandbytes' CPU backend")
    quantized = models.quantize_nf4(dense, device=device)
    del dense
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return quantized


FAST_METHODS = ("fast_plain", "fast_speculative", "fast_speculative_sync_all", "fast_speculative_one_draft")


class StepTimes:
    """One request's step latencies, with each step's arm where there are arms."""

    def __init__(self, latencies_s: list[float], arms: list[int] | None = None, arm_names: list[str] | None = None,
                 prefill_and_first_step_s: float | None = None) -> None:
        self.latencies_s, self.arms, self.arm_names = latencies_s, arms, arm_names
        self.prefill_and_first_step_s = prefill_and_first_step_s

    @classmethod
    def of(cls, stats: Any) -> StepTimes:
        """From a FlashSpec `GenerationStats`."""
        return cls([step.latency_s for step in stats.steps], [step.arm for step in stats.steps],
                   list(stats.arm_names))


class StepClock:
    """A `generate(streamer=...)` that timestamps each `put`: HF puts the prompt, then each step's new
    tokens (after its own per-step host sync), so the gaps are step latencies; the first gap also
    holds the prefill. The tokens are ignored."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: Any) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        return None

    def steps(self) -> StepTimes:
        gaps = [later - earlier for earlier, later in zip(self.stamps, self.stamps[1:])]
        return StepTimes(gaps[1:], prefill_and_first_step_s=gaps[0] if gaps else None)


def latency_trace(steps: StepTimes, slowest: int = 5, outlier_factor: float = 3.0) -> dict[str, Any]:
    """p50/p99/max step latency in ms, the `slowest` steps as [index, arm, ms] in step order, and the
    indices of steps slower than `outlier_factor` x the median: outliers early in a cold request point
    at warm-up (compiles, autotuning, capture), spread ones in a warm request at something recurring."""
    ms = [1e3 * latency for latency in steps.latencies_s]
    if not ms:
        return {"steps": 0}
    ordered = sorted(ms)
    median = percentile(ordered, 50)
    top = sorted(sorted(range(len(ms)), key=lambda index: -ms[index])[:slowest])
    names = steps.arm_names or []

    def arm(index: int) -> str | None:
        if steps.arms is None:
            return None
        number = steps.arms[index]
        return names[number] if number < len(names) else str(number)

    outliers = [index for index, value in enumerate(ms) if value > outlier_factor * median]
    trace: dict[str, Any] = {
        "steps": len(ms), "p50_ms": median, "p99_ms": percentile(ordered, 99), "max_ms": ordered[-1],
        "slowest": [[index, arm(index), ms[index]] for index in top],
        "outlier_steps": outliers, "outlier_ms_total": sum(ms[index] for index in outliers)}
    if steps.prefill_and_first_step_s is not None:
        trace["prefill_and_first_step_ms"] = 1e3 * steps.prefill_and_first_step_s
    return trace


class Observed:
    """What happened beside the work during one request: the CUDA caching allocator's cudaMalloc /
    cudaFree calls and allocation retries (its memory stats), and Python's GC collections (count and
    seconds per generation). Slow steps in a warm request with neither are not the allocator's or GC's."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.collections: dict[int, list[float]] = {}
        self.started = 0.0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.collections.setdefault(int(info.get("generation", -1)), []).append(time.perf_counter() - self.started)

    def _allocator(self) -> dict[str, int]:
        if self.device.type != "cuda":
            return {}
        stats = torch.cuda.memory_stats(self.device)
        return {key: int(stats.get(key, 0)) for key in ("num_device_alloc", "num_device_free", "num_alloc_retries")}

    def __call__(self, run: Any) -> tuple[Any, dict[str, Any]]:
        """`run()`'s result and what was observed while it ran."""
        self.collections = {}
        before = self._allocator()
        gc.callbacks.append(self._on_gc)
        try:
            result = run()
        finally:
            gc.callbacks.remove(self._on_gc)
        after = self._allocator()
        seen: dict[str, Any] = {key: after[key] - before[key] for key in after}
        seen["gc"] = {str(generation): {"collections": len(times), "seconds": sum(times)}
                      for generation, times in sorted(self.collections.items())}
        return result, seen


def timed(run: Any, repeats: int, device: torch.device) -> list[float]:
    """Wall seconds of `run()` per repeat, after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def method_runs(target: torch.nn.Module, drafts: list[torch.nn.Module], prompt: torch.Tensor,
                args: argparse.Namespace, params: fs.SamplingParams) -> dict[str, Any]:
    """name -> make(graphs, compile) -> a function that generates `args.new_tokens` per row and returns
    (StepTimes or None, stats summary or None). `graphs` and `compile` set the fast methods' decoders
    (so a failing setting can be retried without them); the other methods ignore them. HF methods
    time their steps through a `StepClock` at B = 1 only (HF streamers take one row). The speculative
    pools are every model draft + prompt lookup under Thompson sampling; HF assisted generation and
    the one-draft method take the first draft."""
    new = args.new_tokens
    draft = drafts[0]
    config = draft.generation_config
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = args.gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    hf_kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0,
                     pad_token_id=0)
    pool = [*drafts, PromptLookupDrafter()]
    common = dict(max_new_tokens=new, sampling=params, ignore_eos=True)

    def hf(assistant: torch.nn.Module | None) -> Any:
        def run() -> tuple[StepTimes | None, None]:
            clock = StepClock() if prompt.shape[0] == 1 else None
            kwargs = {**hf_kwargs, "streamer": clock} if clock is not None else hf_kwargs
            if assistant is None:
                target.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
            else:  # HF assisted generation takes one row at a time: the rows run one after another
                for row in prompt:
                    target.generate(row[None], attention_mask=torch.ones_like(row[None]), assistant_model=assistant,
                                    **kwargs)
            return (clock.steps() if clock is not None else None), None
        return lambda graphs, compile: run

    def flashspec(build_decoder: Any) -> Any:
        def make(graphs: bool | None, compile: bool | str) -> Any:
            decoder = build_decoder(graphs, compile)

            def run() -> tuple[StepTimes, dict[str, Any]]:
                stats = decoder.generate(prompt, seed=0, **common).stats
                return StepTimes.of(stats), stats.summary()
            return run
        return make

    eager = SpeculativeDecoder(target, pool, policy="thompson", gamma=args.gamma)
    gamma = args.gamma
    makers = {
        "hf_plain": hf(None),
        "hf_assisted": hf(draft),
        "flashspec_eager": flashspec(lambda graphs, compile: eager),
        "fast_plain": flashspec(lambda graphs, compile: FastPlainDecoder(target, graphs=graphs, compile=compile)),
        "fast_speculative": flashspec(lambda graphs, compile: FastSpeculativeDecoder(
            target, pool, policy="thompson", draft_sync="lazy", gamma=gamma, graphs=graphs, compile=compile)),
        "fast_speculative_sync_all": flashspec(lambda graphs, compile: FastSpeculativeDecoder(
            target, pool, policy="thompson", draft_sync="all", gamma=gamma, graphs=graphs, compile=compile)),
        "fast_speculative_one_draft": flashspec(lambda graphs, compile: FastSpeculativeDecoder(
            target, [draft], policy="fixed", gamma=gamma, graphs=graphs, compile=compile)),
    }
    skip = set(args.skip) | ({"hf_assisted"} if prompt.shape[0] > args.hf_assisted_max_batch else set())
    return {name: make for name, make in makers.items() if name not in skip}


def settings_to_try(name: str, args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """The (graphs, compile) settings a method tries in turn until one runs: as asked; then, for a fast
    method, without compile and (on CUDA) without CUDA graphs, so a kernel that cannot be compiled or
    captured still leaves a measured fast path and the error that stopped the faster one."""
    tries = [{"graphs": None, "compile": args.compile}]
    if name in FAST_METHODS:
        if args.compile:
            tries.append({"graphs": None, "compile": False})
        if device.type == "cuda":
            tries.append({"graphs": False, "compile": False})
    return tries


def error_text(error: BaseException, frames: int = 12) -> str:
    """The error and the last `frames` lines of its traceback, for the JSON."""
    import traceback

    lines = "".join(traceback.format_exception(type(error), error, error.__traceback__)).splitlines()
    return "\n".join(lines[-frames:])[-4000:]


def measure(name: str, make: Any, args: argparse.Namespace, device: torch.device, batch: int) -> dict[str, Any]:
    """One method's entry: tok/s over the timed requests, its stats summary, step p50/p99 and the
    cold/warm latency traces; or the errors of every setting it tried."""
    failures: list[dict[str, Any]] = []
    for setting in settings_to_try(name, args, device):
        observe = Observed(device)
        calls: list[Any] = []
        try:
            run = make(**setting)
            times = timed(lambda: calls.append(observe(run)), args.repeats, device)
        except Exception as error:  # recorded: the next setting, and the next method, still run
            failures.append({**setting, "error": error_text(error)})
            print(f"B={batch} {name:17s} FAILED with {setting}: {error_text(error, 1)}", flush=True)
            continue
        tokens = batch * args.new_tokens
        entry: dict[str, Any] = {"seconds": times, "tok_s_median": tokens / statistics.median(times),
                                 "tok_s_min": tokens / max(times), "tok_s_max": tokens / min(times)}
        (cold_steps, _), cold_seen = calls[0]
        (warm_steps, summary), warm_seen = calls[-1]
        if summary is not None:
            entry.update({key: summary.get(key) for key in ("acceptance_rate", "token_acceptance",
                                                            "mean_tokens_per_step", "p50_step_latency_s",
                                                            "p99_step_latency_s", "steps", "per_arm")})
        if warm_steps is not None:
            warm = latency_trace(warm_steps)
            entry["p50_step_ms"], entry["p99_step_ms"] = warm.get("p50_ms"), warm.get("p99_ms")
            entry["latency_trace"] = {"cold": latency_trace(cold_steps), "warm": warm}
        entry["observed"] = {"cold": cold_seen, "warm": warm_seen}
        if name in FAST_METHODS:
            entry["settings"] = setting
        if failures:
            entry["failed_settings"] = failures
        return entry
    return {"error": failures[-1]["error"], "failed_settings": failures}


def anatomy(decoder: FastSpeculativeDecoder, device: torch.device, bucket: int) -> dict[str, Any]:
    """Each piece of the step timed alone from its own CUDA graph, at the step's shapes (and the
    16-token catch-up window a draft reads after one step away, at γ = 4)."""
    session = decoder._session
    batch, gamma = session.batch, session.gamma
    target, draft = session.target, session.drafts[0]
    last = (session.buffers.lengths - 1).clamp(min=gamma)
    offsets = torch.arange(gamma + 1, device=device)
    window = last[:, None] - gamma + offsets
    tokens = session.buffers.seq.gather(1, window)
    one = tokens[:, :1].clone()
    pieces = {
        "target_forward_q": lambda: target.forward(tokens, last[:, None] + offsets, bucket),
        "draft_window_q": lambda: draft.forward(tokens, window, bucket, torch.full_like(one, gamma)),
        # each drafted token past the first, as the step drafts it (a feature draft fed its own last output)
        "draft_forward_1": lambda: draft.next_draft(one, last[:, None], bucket),
        "target_forward_1": lambda: target.forward(one, last[:, None], bucket),
    }
    span = torch.arange(16, device=device)
    catch_up = (last[:, None] - 15 + span).clamp(min=0)
    catch_tokens = session.buffers.seq.gather(1, catch_up)
    pieces["draft_catch_up_16"] = lambda: draft.forward(catch_tokens, catch_up, bucket, torch.full_like(one, 15))
    logits = torch.randn(batch, gamma + 1, target.lm_head.out_features, device=device)
    draft_logits = torch.randn(batch, gamma, target.lm_head.out_features, device=device)
    drafted = torch.randint(0, target.lm_head.out_features, (batch, gamma), device=device)
    from flashspec.kernels import verify_triton

    key = torch.tensor([1, 2], device=device)
    prefixes = session.prefixes_of(key)  # the step computes these in its prologue
    pieces["verify"] = lambda: verify_triton(logits, draft_logits, drafted, session.sampling, key, prefixes=prefixes)
    out: dict[str, Any] = {}
    for name, piece in pieces.items():
        graph, _ = capture(piece)
        out[name] = time_calls(graph.replay, repeats=50, warmup=5, device=device)["median_ms"]
    out["sum_of_parts_ms"] = (out["target_forward_q"] + out["draft_window_q"] + (gamma - 1) * out["draft_forward_1"]
                              + out["verify"])
    out["sampling_and_commit_not_in_parts"] = True
    return out


def step_breakdown(target: torch.nn.Module, drafts: list[torch.nn.Module], prompt: torch.Tensor,
                   args: argparse.Namespace, params: fs.SamplingParams, device: torch.device,
                   spec: dict[str, Any], bandwidth: float) -> dict[str, Any]:
    """CUDA only: the cost of a draft switch (two model drafts, fixed vs alternating, both sync modes),
    the one-draft step's anatomy, and the roofline at copy `bandwidth` (bytes/s); fields of the cell.
    Uses the (graphs, compile) setting that `spec` (the fast_speculative entry) ran with."""
    setting = spec.get("settings", {"graphs": None, "compile": args.compile})
    options = dict(gamma=args.gamma, **setting)
    batch, draft = prompt.shape[0], drafts[0]
    common = dict(max_new_tokens=args.new_tokens, sampling=params, ignore_eos=True, seed=0)
    switching = {}
    for sync in ("lazy", "all"):  # two model drafts: fixed on one vs alternating every step
        fast = FastSpeculativeDecoder(target, drafts[:2], policy="fixed", draft_sync=sync, **options)
        fast.generate(prompt, **common)
        steady = fast.generate(prompt, **common).stats.summary()
        fast.policy = Alternate(2)
        fast.generate(prompt, **common)
        alternating = fast.generate(prompt, **common).stats.summary()
        switching[sync] = {"step_ms_fixed_draft_p50": 1e3 * steady["p50_step_latency_s"],
                           "step_ms_alternating_p50": 1e3 * alternating["p50_step_latency_s"]}
        switching[sync]["switch_cost_ms"] = (switching[sync]["step_ms_alternating_p50"]
                                             - switching[sync]["step_ms_fixed_draft_p50"])
    fast = FastSpeculativeDecoder(target, [draft], policy="fixed", **options)
    fast.generate(prompt, **common)
    steady = fast.generate(prompt, **common).stats.summary()
    out: dict[str, Any] = {"step_ms_fixed_draft_p50": 1e3 * steady["p50_step_latency_s"],
                           "switching_two_drafts": switching, "switch_cost_ms": switching["lazy"]["switch_cost_ms"]}
    if setting["graphs"] is False:  # the anatomy times captured pieces: nothing to time without graphs
        out["anatomy_ms"] = None
        return out
    # step graphs are keyed ("step", arm, bucket): time the pieces at the largest bucket the steps used
    parts = anatomy(fast, device, bucket=max(key[2] for key in fast._session.graphs if key[0] == "step"))
    filled = prompt.shape[1] + args.new_tokens
    weights = floor_bytes(target, batch, filled) + args.gamma * floor_bytes(draft, batch, filled)
    out["anatomy_ms"] = parts
    out["step_over_parts"] = out["step_ms_fixed_draft_p50"] / parts["sum_of_parts_ms"]
    # roofline: tokens per step / (bytes a step must read / copy bandwidth), per row
    out["roofline_tok_s_per_row"] = (spec["mean_tokens_per_step"] or 1) / (weights / bandwidth)
    out["roofline_fraction"] = (spec["tok_s_median"] / batch) / out["roofline_tok_s_per_row"]
    print(f"B={batch} anatomy {json.dumps({k: round(v, 4) for k, v in parts.items()})} "
          f"step(one draft) {out['step_ms_fixed_draft_p50']:.3f} ms, step/parts "
          f"{out['step_over_parts']:.2f}, switching {json.dumps(switching)}", flush=True)
    return out


def quantization_record(target: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any] | None:
    """What the quantized target is: the scheme, its 4-bit linear layers, and bitsandbytes' version."""
    if not args.quantization:
        return None
    layers = [module for module in target.modules() if type(module).__name__ in ("Linear4bit", "LinearNF4")]
    return {"scheme": args.quantization, "linear4bit_layers": len(layers),
            "compute_dtype": str(getattr(layers[0], "compute_dtype", None)) if layers else None,
            "bitsandbytes": provenance.versions(("bitsandbytes",)).get("bitsandbytes"),
            "lm_head_dtype": str(target.lm_head.weight.dtype), "drafts": "unquantized"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    try:
        target, drafts, zoo = build(args, device)
    except ValueError as error:
        print(f"bench_fast: {error}", file=sys.stderr)
        return 2
    params = fs.SamplingParams(temperature=1.0)
    origin = provenance.record(["python", "experiments/bench_fast.py", *argv], args.git_sha)
    record: dict[str, Any] = {"cells": [], "copy_bandwidth_bytes_per_s": copy_bandwidth(device),
                              "quantization": quantization_record(target, args)}

    def write() -> None:
        if args.out:  # after every method: a run cut short keeps what it measured
            provenance.write_result(args.out, origin, {**vars(args), "device": str(device)}, record)

    vocab = target.lm_head.out_features
    for batch in args.batches:
        if zoo is not None:  # held-out Python prompts of the zoo, cycled to fill the batch
            from flashspec_lab import zoo as zoo_module

            pool = zoo_module.prompt_batch(zoo, "python")
            prompt = pool[torch.arange(batch) % pool.shape[0]].to(device)
        else:
            generator = torch.Generator().manual_seed(batch)
            prompt = torch.randint(3, vocab, (batch, args.prompt_tokens), generator=generator).to(device)
        cell: dict[str, Any] = {"batch": batch, "methods": {}}
        record["cells"].append(cell)
        methods = cell["methods"]
        for name, make in method_runs(target, drafts, prompt, args, params).items():
            entry = methods[name] = measure(name, make, args, device, batch)
            write()
            if "error" in entry:
                continue
            steps = (f"  step p50 {entry['p50_step_ms']:.2f} ms p99 {entry['p99_step_ms']:.2f} ms"
                     if entry.get("p50_step_ms") is not None else "")
            fallback = f"  (fell back to {entry['settings']})" if entry.get("failed_settings") else ""
            print(f"B={batch} {name:17s} {entry['tok_s_median']:9.1f} tok/s "
                  f"[{entry['tok_s_min']:.1f}, {entry['tok_s_max']:.1f}]{steps}{fallback}", flush=True)
        ratios = {}
        for a, b in (("fast_plain", "hf_plain"), ("fast_speculative", "hf_assisted"),
                     ("fast_speculative", "fast_plain"), ("fast_speculative_one_draft", "fast_plain"),
                     ("fast_speculative_sync_all", "fast_plain"), ("fast_speculative", "fast_speculative_sync_all"),
                     ("fast_speculative", "flashspec_eager"), ("fast_speculative", "hf_plain"),
                     ("flashspec_eager", "hf_plain")):
            if "tok_s_median" in methods.get(a, {}) and "tok_s_median" in methods.get(b, {}):
                ratios[f"{a}/{b}"] = methods[a]["tok_s_median"] / methods[b]["tok_s_median"]
        cell["ratios"] = ratios
        spec = methods.get("fast_speculative", {})
        if device.type == "cuda" and "tok_s_median" in spec:
            try:
                cell.update(step_breakdown(target, drafts, prompt, args, params, device, spec,
                                           record["copy_bandwidth_bytes_per_s"]))
            except Exception as error:  # recorded: the cell's timings above stand without it
                cell["step_breakdown_error"] = error_text(error)
                print(f"B={batch} step breakdown FAILED: {error_text(error, 1)}", flush=True)
        print(f"B={batch} ratios {json.dumps({k: round(v, 2) for k, v in ratios.items()})}", flush=True)
        write()
        if args.out:
            print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
