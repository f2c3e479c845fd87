"""Speculative verification in two Triton launches, with no host sync (book/design.md §1, §4).

Launch 1, `_stats_kernel` -- one streaming pass over every logit row. Grid
(row blocks, γ+1 positions, V-splits); each program reduces one V-chunk of the target row
at its position and of the draft row at the same position to an online log-sum-exp partial
(max, sum of exp(x - max)) -- or, greedy, to a (max, first argmax) partial.

Launch 2, `_sample_kernel` -- accept, then residual/bonus sample. Grid (row blocks,
V-splits). Every program first redoes the accept test of its rows from the ≤ 2γ+1
partials and the two logits at each drafted token (O(1) in V per candidate), so it knows
n = the first rejection without waiting for anyone; then it streams its V-chunk of the
one position it samples from (the first rejected, or the bonus position γ): an
exponential race (Gumbel-max) over log max(0, p - q), or over log p for the bonus, with
counter-based noise. It writes its chunk's winner; the last program of its row block
to finish (an atomic ticket) reduces the chunk winners and writes tokens/num_accepted.
So B = 1 still spreads each pass over the whole GPU, and nothing returns to the host.

Both kernels take BLOCK_B rows per program: 1 on a GPU with a real vocabulary; many when the
vocabulary is tiny or when Triton runs in its CPU interpreter, where each program costs
milliseconds of Python.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch
import triton

from flashspec import rng
from flashspec.kernels import rng as krng
from flashspec.kernels.plan import GPU_PLAN, LaunchPlan, make_plan  # noqa: F401  (re-exported: the benchmark tunes GPU_PLAN)
from flashspec.kernels.sample_pass import _sample_kernel
from flashspec.kernels.shims import SCALE_DIVIDE, SCALE_MULTIPLY, SCALE_NONE, _cdiv, interpreting  # noqa: F401
from flashspec.kernels.stats_pass import _stats_kernel
from flashspec.sampling import SamplingParams, truncate_logits

_COMPILE_OPTIONS: dict = {} if interpreting() else {"enable_fp_fusion": False}

_COUNTERS: dict[tuple[str, int | None], torch.Tensor] = {}


def _ticket_counter(device: torch.device, size: int) -> torch.Tensor:
    """Zeroed int32 tickets, kept between calls (each call's last program resets its entry).
    One buffer per device: calls on one device must not run concurrently on several streams."""
    key = (device.type, device.index)
    counter = _COUNTERS.get(key)
    if counter is None or counter.numel() < size:
        counter = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = counter
    return counter


def _round16(count: int) -> int:
    return (count + 15) // 16 * 16


@functools.lru_cache(maxsize=64)
def _prefixes(key: rng.Key) -> tuple[int, int]:
    return (krng.as_int32(krng.stream_prefix(key, rng.STREAM_ACCEPT)),
            krng.as_int32(krng.stream_prefix(key, rng.STREAM_SAMPLE)))


def device_prefixes(key: torch.Tensor) -> torch.Tensor:
    """int32 [2]: the accept and sample stream prefixes of a device key (lo, hi), in torch ops --
    `krng.stream_prefix` without leaving the device (about 40 small kernels unless compiled: the
    fast path computes them in its compiled step prologue and passes them to `verify_triton`)."""
    h = rng.fmix32(rng.fmix32((key[0] ^ rng.SALT) & rng.MASK32) ^ key[1])
    prefixes = torch.stack([rng.fmix32(h ^ rng.STREAM_ACCEPT), rng.fmix32(h ^ rng.STREAM_SAMPLE)])
    return torch.where(prefixes >= 2**31, prefixes - 2**32, prefixes).to(torch.int32)


class _Launcher:
    """Launch a jit kernel; after its first launch per specialisation, call the compiled binary
    directly. Triton's own per-call path (argument binding, cache key built from a string of
    the options) costs tens of µs of host time, more than the kernels at small B. Our key
    refines Triton's specialisation -- every tensor's dtype and 16-byte alignment, every int's
    divisibility by 16, equality to 1 and int32 range, every constexpr and option -- so a cached
    binary is the one Triton itself would pick. FLASHSPEC_TRITON_FAST_LAUNCH=0 turns it off."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.binaries: dict = {}

    @staticmethod
    def _spec(arg) -> object:
        if isinstance(arg, torch.Tensor):
            return (arg.dtype, arg.data_ptr() % 16 == 0)
        if isinstance(arg, bool):
            return ("b", arg)
        if isinstance(arg, int):
            return (arg % 16 == 0, arg == 1, -(2**31) <= arg < 2**31)
        return type(arg)

    def __call__(self, grid: tuple, args: tuple, meta: dict) -> None:
        if interpreting():
            with np.errstate(all="ignore"):  # log(0), inf - inf in masked lanes are intended
                self.kernel[grid](*args, **meta)
            return
        if not FAST_LAUNCH:
            self.kernel[grid](*args, **meta)
            return
        device = torch.cuda.current_device()
        key = (device, tuple(self._spec(a) for a in args), tuple(meta.items()))
        binary = self.binaries.get(key)
        if binary is None:
            self.binaries[key] = self.kernel[grid](*args, **meta)
            return
        constexprs = tuple(meta[name] for name in self.kernel.arg_names[len(args):])
        stream = _current_stream(device)
        binary.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                   binary.function, binary.packed_metadata, binary.launch_metadata(grid, stream, *args, *constexprs),
                   triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook,
                   *args, *constexprs)


FAST_LAUNCH = os.environ.get("FLASHSPEC_TRITON_FAST_LAUNCH", "1") != "0"
_STATS_LAUNCHER = _Launcher(_stats_kernel)
_SAMPLE_LAUNCHER = _Launcher(_sample_kernel)


try:  # what Triton's own launcher uses
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover
    def _current_stream(device_index: int) -> int:
        return torch.cuda.current_stream(device_index).cuda_stream


@dataclass
class PreparedVerify:
    """One verify step with its buffers allocated and its two launches bound (no host sync).

    `run()` launches both kernels; the benchmark times `launch_stats` / `launch_sample` alone.
    """

    plan: LaunchPlan
    stats_grid: tuple[int, int, int]
    stats_args: tuple
    stats_meta: dict
    sample_grid: tuple[int, int]
    sample_args: tuple
    sample_meta: dict
    tokens: torch.Tensor
    num_accepted: torch.Tensor

    def launch_stats(self) -> None:
        _STATS_LAUNCHER(self.stats_grid, self.stats_args, self.stats_meta)

    def launch_sample(self) -> None:
        _SAMPLE_LAUNCHER(self.sample_grid, self.sample_args, self.sample_meta)

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.launch_stats()
        self.launch_sample()
        return self.tokens, self.num_accepted


def verify_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    key: rng.Key | torch.Tensor,
    *,
    block_b: int | None = None,
    block_v: int | None = None,
    num_splits: int | None = None,
    prefixes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton backend of `flashspec.verify` (shapes already checked there): (tokens [B, γ+1], num_accepted [B]).

    Two launches, no host sync. Top-k / top-p first truncate the logits in torch (a sort,
    O(V log V)); the kernels' fast path is temperature only. `block_b`, `block_v` and
    `num_splits` override the launch plan (tests use them to force several V-chunks).
    `prefixes` is `device_prefixes(key)` when the caller (a device key) computed it already.
    """
    return prepare_verify(target_logits, draft_logits, draft_tokens, params, key,
                          block_b=block_b, block_v=block_v, num_splits=num_splits, prefixes=prefixes).run()


def prepare_verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    key: rng.Key | torch.Tensor,
    *,
    block_b: int | None = None,
    block_v: int | None = None,
    num_splits: int | None = None,
    prefixes: torch.Tensor | None = None,
) -> PreparedVerify:
    """Allocate outputs and work buffers and bind both launches (see `verify_triton`).

    `key` is a host Key (its stream prefixes become launch arguments) or a device int64 tensor [2]
    (lo, hi): then the prefixes are computed on the device into a buffer the kernel reads, so a
    captured graph whose key buffer changes between replays draws new uniforms each time."""
    device = target_logits.device
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got target_logits on {device}; "
            "use backend='torch' (or TRITON_INTERPRET=1 to run the kernels on the CPU)"
        )
    batch, gamma = draft_tokens.shape
    vocab = target_logits.shape[2]
    greedy = params.greedy
    if greedy:
        draft_logits = None
        scale_mode, scale = SCALE_NONE, 1.0
    elif params.needs_truncation:
        target_logits = truncate_logits(target_logits.float() / params.temperature, params)
        if draft_logits is not None:
            draft_logits = truncate_logits(draft_logits.float() / params.temperature, params)
        scale_mode, scale = SCALE_NONE, 1.0
    elif params.temperature == 1.0:
        scale_mode, scale = SCALE_NONE, 1.0
    elif device.type == "cuda":
        scale_mode, scale = SCALE_MULTIPLY, float(np.float32(1.0) / np.float32(params.temperature))
    else:
        scale_mode, scale = SCALE_DIVIDE, float(params.temperature)
    has_draft = draft_logits is not None
    target = target_logits.contiguous()
    draft = draft_logits.contiguous() if has_draft else target
    tokens_in = draft_tokens.contiguous()

    plan = make_plan(batch, gamma, vocab, device, greedy, block_b, block_v, num_splits)
    row_blocks = _cdiv(batch, plan.block_b)
    width = 2 * gamma + 1
    split = plan.sample_splits > 1
    stats_size = _round16(batch * width * plan.stats_splits)
    race_size = _round16(batch * 2 * plan.sample_splits) if split else 0
    # two allocations (fp32 and int32 work), sliced; chunks start 64-byte aligned
    floats = torch.empty(2 * stats_size + race_size, dtype=torch.float32, device=device)
    ints = torch.empty((stats_size if greedy else 0) + race_size + 16, dtype=torch.int32, device=device)
    part_max = floats[:stats_size]
    part_sum = part_max if greedy else floats[stats_size:2 * stats_size]
    part_idx = ints[:stats_size] if greedy else ints
    race_val = floats[2 * stats_size:] if split else floats
    race_idx = ints[(stats_size if greedy else 0):] if split else ints
    counter = _ticket_counter(device, row_blocks) if split else ints
    out_tokens = torch.empty((batch, gamma + 1), dtype=torch.int64, device=device)
    out_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    prefix_in_memory = isinstance(key, torch.Tensor)
    if prefix_in_memory:
        prefixes = device_prefixes(key) if prefixes is None else prefixes
        accept_prefix, sample_prefix = prefixes[0:1], prefixes[1:2]
    else:
        accept_prefix, sample_prefix = _prefixes(key)

    stats_args = (target, draft, part_max, part_sum, part_idx,
                  batch, gamma, vocab, plan.stats_splits, scale)
    stats_meta = dict(CHUNK=plan.stats_chunk, SCALE_MODE=scale_mode, HAS_DRAFT=has_draft, GREEDY=greedy,
                      BLOCK_B=plan.block_b, BLOCK_V=plan.stats_block_v, num_warps=plan.stats_warps,
                      **_COMPILE_OPTIONS)
    sample_args = (target, draft, tokens_in, part_max, part_sum, part_idx, race_val, race_idx, counter,
                   out_tokens, out_accepted,
                   batch, gamma, vocab, plan.stats_splits, plan.sample_splits, scale,
                   accept_prefix, sample_prefix)
    sample_meta = dict(CHUNK=plan.sample_chunk, SCALE_MODE=scale_mode, HAS_DRAFT=has_draft, GREEDY=greedy,
                       SPLIT=split, PRECISE=not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory,
                       BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=plan.block_s, BLOCK_S2=plan.block_s2,
                       BLOCK_V=plan.sample_block_v, num_warps=plan.sample_warps, **_COMPILE_OPTIONS)
    return PreparedVerify(
        plan=plan,
        stats_grid=(row_blocks, gamma + 1, plan.stats_splits),
        stats_args=stats_args,
        stats_meta=stats_meta,
        sample_grid=(row_blocks, plan.sample_splits),
        sample_args=sample_args,
        sample_meta=sample_meta,
        tokens=out_tokens,
        num_accepted=out_accepted,
    )
