"""Where a plain decode step's device time goes: FlashSpec's fast plain step and gpt-fast's, kernel by kernel.

One process per (system, shape, variant), as in the peers benchmark (`flashspec_lab.peers`): same random weights,
a 32-token prompt, T = 1, 256 new tokens. Each process compiles and warms up, waits at a barrier until every
process has (compiling is CPU work that would disturb the timings), then times its requests and profiles one
under an exclusive lock, so no two processes time at once. The profile is `torch.profiler`'s CUDA activity over
one whole request: every kernel's name, launches per step and device microseconds per step, beside the step's
own wall time (tok/s) -- the sum of kernel time against the step says what is launch-bound and what is not.

Variants of FlashSpec's forward (`VARIANTS`) are patched in here, in the lab, so a candidate is measured
beside today's default before the library changes.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import inspect
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import flashspec as fs
from flashspec import runner
from flashspec.fast import FastPlainDecoder
from flashspec_lab import peers

# FlashSpec's forward: SDPA as the library picks it; SDPA's math backend; the one-row matmuls left to cuBLAS
# (inductor's coordinate-descent tuning otherwise turns each into a generated reduction, as gpt-fast's too); the
# whole forward compiled without coordinate-descent tuning (which also leaves them to cuBLAS)
VARIANTS = ("default", "math", "cublas-mm", "no-cdt")


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """FlashSpec's forward with `name`'s change in place (see VARIANTS). The compile variants turn inductor's
    on-disk graph cache off: it would not tell their graphs from the default's."""
    if name not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {name!r}")
    if name == "default":
        yield
        return
    if name in ("cublas-mm", "no-cdt"):
        with compile_variant(name):
            yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    original = runner.attend

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
               fold: bool) -> torch.Tensor:
        with sdpa_kernel([SDPBackend.MATH]):  # inductor generates (and fuses) the attention's kernels itself
            return original(q, k, v, mask, scale, fold)

    runner.attend = attend
    try:
        yield
    finally:
        runner.attend = original


@contextlib.contextmanager
def compile_variant(name: str) -> Iterator[None]:
    """"cublas-mm": inductor's decomposition of a matmul into a reduction removed while inside; "no-cdt": the
    whole-forward compile without coordinate-descent tuning (`runner.FORWARD_OPTIONS`)."""
    from torch._inductor import config, decomposition  # noqa: PLC0415

    removed: dict[Any, Any] = {}
    options = runner.FORWARD_OPTIONS
    if name == "cublas-mm":
        removed = {op: decomposition.decompositions.pop(op) for op in [torch.ops.aten.mm.default]
                   if op in decomposition.decompositions}
        decomposition.fast_random_decomps.cache_clear()  # the table inductor reads is built once and cached
    else:
        runner.FORWARD_OPTIONS = {key: value for key, value in options.items() if key != "coordinate_descent_tuning"}
    try:
        with config.patch(fx_graph_cache=False):
            yield
    finally:
        decomposition.decompositions.update(removed)
        decomposition.fast_random_decomps.cache_clear()
        runner.FORWARD_OPTIONS = options


def kernel_table(profile: torch.profiler.profile, steps: int, top: int = 40) -> dict[str, Any]:
    """Device kernels of a profiled request: the `top` by time with launches and microseconds per step, and the
    totals (all kernels' device time per step, kernels per step)."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in profile.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        entry = totals[event.name]
        entry[0] += 1
        entry[1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    return {"kernels_per_step": sum(count for count, _ in totals.values()) / steps,
            "kernel_us_per_step": sum(us for _, us in totals.values()) / steps,
            "top": [{"name": name[:160], "per_step": count / steps, "us_per_step": us / steps}
                    for name, (count, us) in ranked[:top]]}


class Barrier:
    """Processes of one run meet here: `ready()` marks this one warm and waits for the others (or `timeout`);
    `exclusive()` holds the run's lock while timing."""

    def __init__(self, folder: Path, parties: int, name: str, timeout: float = 600) -> None:
        self.folder, self.parties, self.name, self.timeout = folder, parties, name, timeout

    def ready(self) -> float:
        (self.folder / f"{self.name}.ready").touch()
        start = time.perf_counter()
        while len(list(self.folder.glob("*.ready"))) < self.parties and time.perf_counter() - start < self.timeout:
            time.sleep(0.5)
        return time.perf_counter() - start

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with open(self.folder / "timing.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def flashspec_request(shape: str, device: torch.device, settings: dict[str, Any]) -> Callable[[], int]:
    """FlashSpec's fast plain request at `shape` (compiled as `settings["compile"]`): returns its new tokens."""
    target, _ = peers.build_models(shape, device, settings["smoke"])
    prompt = peers.prompt_ids(settings["prompt_tokens"], target.config.vocab_size).to(device)
    decoder = FastPlainDecoder(target, compile=settings["compile"] or False)
    sampling = fs.SamplingParams(1.0)

    def request() -> int:
        result = decoder.generate(prompt, max_new_tokens=settings["new_tokens"], sampling=sampling, seed=0,
                                  ignore_eos=True)
        return int(result.num_generated.sum())

    return request


def gpt_fast_request(shape: str, device: torch.device, settings: dict[str, Any]) -> Callable[[], int]:
    """gpt-fast's plain `generate` at `shape`, its decode step compiled as its `main` does."""
    with peers.gpt_fast_path(Path(settings["gpt_fast"])):
        for name in ("generate", "model"):
            sys.modules.pop(name, None)
        import generate as gen  # noqa: PLC0415 - gpt-fast's, from the checkout
        import model as gpt_model  # noqa: PLC0415
    hf_target, _ = peers.build_models(shape, device, settings["smoke"])
    prompt = peers.prompt_ids(settings["prompt_tokens"], hf_target.config.vocab_size)[0].to(device)
    model = peers.gpt_fast_model(gpt_model, hf_target, settings["prompt_tokens"] + settings["new_tokens"] + 8)
    cosine = peers.logits_cosine(hf_target, model, prompt[None])
    del hf_target
    if cosine < peers.MIN_COSINE:
        raise RuntimeError(f"converted logits disagree with Hugging Face's: cosine {cosine}")
    if settings["compile"] and device.type == "cuda":
        gen.decode_one_token = torch.compile(gen.decode_one_token, mode="reduce-overhead", fullgraph=True)
    # signature() reads through the torch.no_grad wrapper (its __code__ is the wrapper's)
    extra = {"batch_size": 1} if "batch_size" in inspect.signature(gen.generate).parameters else {}

    def request() -> int:
        sequence, _ = gen.generate(model, prompt, settings["new_tokens"], **extra, interactive=False,
                                   draft_model=None, speculate_k=1, temperature=1.0, top_k=None)
        return sequence.shape[-1] - prompt.shape[0]

    return request


def profile_system(system: str, shape: str, name: str, settings: dict[str, Any], barrier: Barrier | None
                   ) -> dict[str, Any]:
    """Warm up, meet the others, then time `settings["repeats"]` requests and profile one (see the module)."""
    device = torch.device(settings["device"])
    torch._inductor.config.triton.unique_kernel_names = True  # kernel names that say what they fuse
    with variant(name if system == "flashspec" else "default"):
        make = flashspec_request if system == "flashspec" else gpt_fast_request
        start = time.perf_counter()
        request = make(shape, device, settings)
        peers.sync(device)
        request()
        peers.sync(device)
        record: dict[str, Any] = {"first_request_s": time.perf_counter() - start}
        record["waited_s"] = barrier.ready() if barrier else 0.0
        with barrier.exclusive() if barrier else contextlib.nullcontext():
            rates = []
            for _ in range(settings["repeats"]):
                peers.sync(device)
                begin = time.perf_counter()
                tokens = request()
                peers.sync(device)
                rates.append(tokens / (time.perf_counter() - begin))
            record.update(tok_s=rates, tok_s_median=sorted(rates)[len(rates) // 2])
            activities = [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else \
                [torch.profiler.ProfilerActivity.CPU]
            with torch.profiler.profile(activities=activities) as profile:
                request()
                peers.sync(device)
            record["profile"] = kernel_table(profile, settings["new_tokens"])
    return record


def run_child(system: str, shape: str, name: str, settings: dict[str, Any], folder: Path | None, parties: int,
              out: Path) -> None:
    """One process's work, written to `out` (an error is recorded, and this process still meets the barrier)."""
    barrier = Barrier(folder, parties, f"{system}-{shape}-{name}") if folder else None
    try:
        record = profile_system(system, shape, name, settings, barrier)
    except Exception as error:  # noqa: BLE001 - recorded: the other processes still run
        if barrier:
            (barrier.folder / f"{barrier.name}.ready").touch()
        record = {"error": f"{type(error).__name__}: {error}"[:2000]}
    out.write_text(json.dumps(record))
