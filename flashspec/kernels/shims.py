"""Shared pieces of the verify kernels: temperature scaling modes, the interpreter/compiled switch,
reductions and the per-element math, each in a form the Triton CPU interpreter runs fast.

Under TRITON_INTERPRET=1 a nested jit function costs milliseconds per call (the interpreter re-patches
triton.language each time), so helpers are plain Python there (`device_function`) and `tl.max` and
friends become the builtin reduce with the stock combine functions. `tlcore` must be a global of every
module whose jit functions reduce: the interpreter patches triton.language.core only when a kernel's
globals hold it.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language import core as tlcore
from triton.language.extra import libdevice

try:  # grid dependency control (programmatic dependent launch), SM90+: Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    PDL_AVAILABLE = True
except ImportError:  # pragma: no cover -- an older Triton: plans never ask for it
    gdc_launch_dependents = gdc_wait = None
    PDL_AVAILABLE = False

from flashspec.kernels.rng import device_function


def _triton_version() -> tuple[int, int]:
    major, minor = (triton.__version__.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


# Reductions across the blocks of a thread-block cluster (`num_ctas` > 1) lower from Triton 3.9 on; 3.6 fails
# to compile them (experiments/cluster_reduce_probe.py)
CLUSTERS_AVAILABLE = _triton_version() >= (3, 9)
# Per-block sums of a tile reshaped to [rows, blocks, block] lower well from Triton 3.9 on; 3.6 then gives the
# race inside the winning block a layout in which every thread holds the whole block (~40x the code, a minute or
# more of ptxas at the first launch), so there `sample_pass._block_race` sums each block as its own tile
RESHAPED_BLOCK_SUMS = _triton_version() >= (3, 9)

# How a logit is scaled by the temperature, chosen to round exactly as torch does it:
# torch divides on the CPU and multiplies by float32(1/T) on CUDA (a CPU-scalar divisor).
SCALE_NONE = 0
SCALE_DIVIDE = 1
SCALE_MULTIPLY = 2

INT32_MAX = tl.constexpr(2**31 - 1)  # constexpr: read inside the kernels


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, read at import:
    Triton itself reads it when it is first imported)."""
    return _INTERPRET


_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _cdiv(a: int, b: int) -> int:
    """Ceiling division on host ints (triton.cdiv is a jit helper, slow to call from Python)."""
    return -(-a // b)



# ----------------------------------------------------------------------------- reductions
# tl.max / tl.sum / tl.min are jit functions: the interpreter re-patches the language on each
# call (~5 ms). Interpreted, call the builtin reduce with the stock combine functions instead
# (the interpreter maps those to numpy); compiled, use the ordinary reductions. `tlcore` must
# be a global of this module for the interpreter to patch triton.language.core's builtins.
if interpreting():

    def _max(x, axis):
        return tlcore.reduce(x, axis, tl.standard._elementwise_max)

    def _min(x, axis):
        return tlcore.reduce(x, axis, tl.standard._elementwise_min)

    def _sum(x, axis):
        return tlcore.reduce(x, axis, tl.standard._sum_combine)

    def _max_index(x, axis):
        """(max, first index of the max) along `axis`."""
        return tlcore._reduce_with_indices(x, axis, tl.standard._argmax_combine_tie_break_left)

else:

    @triton.jit
    def _max(x, axis: tl.constexpr):
        return tl.max(x, axis)

    @triton.jit
    def _min(x, axis: tl.constexpr):
        return tl.min(x, axis)

    @triton.jit
    def _sum(x, axis: tl.constexpr):
        return tl.sum(x, axis)

    @triton.jit
    def _max_index(x, axis: tl.constexpr):
        """(max, first index of the max) along `axis`."""
        return tl.max(x, axis, return_indices=True)



@device_function
def _fold_first_max(best, best_idx, values, offset):
    """Fold a [BLOCK_B, N] tile into running (max, first index of it) per row; the tile's column c is index
    offset + c. Strict: an earlier tile keeps a tie, so the first index of the maximum wins over all tiles."""
    tile, arg = _max_index(values, axis=1)
    better = tile > best
    return tl.where(better, tile, best), tl.where(better, offset + arg.to(best_idx.dtype), best_idx)


# ----------------------------------------------------------------------------- math helpers
@device_function
def _log(x, PRECISE: tl.constexpr):
    """Natural log; correctly rounded libdevice on a GPU (the interpreter uses numpy's)."""
    if PRECISE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@device_function
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@device_function
def _log1p(x, PRECISE: tl.constexpr):
    """log(1 + x); the interpreter has no log1p, so it uses Goldberg's exact-ish rewrite."""
    if PRECISE:
        return libdevice.log1p(x)
    else:
        one_plus = 1.0 + x
        return tl.where(one_plus == 1.0, x, tl.log(one_plus) * (x / (one_plus - 1.0)))


@device_function
def _scale(x, scale, SCALE_MODE: tl.constexpr):
    """Logits divided by the temperature, rounded as torch rounds it on this device."""
    if SCALE_MODE == 1:
        return x / scale
    elif SCALE_MODE == 2:
        return x * scale
    else:
        return x


@device_function
def _draft_scale(y, scale, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr):
    """The draft's inputs as log q up to its normaliser: its logits scaled as the target's (HAS_DRAFT 1), or
    its log-probs as given (HAS_DRAFT 2: already warped and normalised, so neither scaled nor shifted)."""
    if HAS_DRAFT == 2:
        return y
    else:
        return _scale(y, scale, SCALE_MODE)


LOG2E = tl.constexpr(1.4426950408889634)

if interpreting():

    def _sum_exp_term(x):
        return tl.exp(x)

else:

    @triton.jit
    def _sum_exp_term(x):
        """exp(x) as one multiply and one MUFU.EX2 (`ex2.approx.ftz`: a result below 2**-126 flushes to zero).
        For the terms of a log-sum-exp sum (x <= 0, the sum >= 1), which need float32's precision, not
        libdevice's rounding; `tl.exp` adds a denormal fix-up around the same MUFU (four more instructions an
        element in the stats pass)."""
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * LOG2E], dtype=tl.float32,
                                         is_pure=True, pack=1)


@device_function
def _online_lse(running_max, running_sum, x, AXIS: tl.constexpr = 1):
    """Fold a tile into running (max, sum exp(x - max)) along its last axis `AXIS`; -inf safe. A [BLOCK_B, BLOCK_V]
    tile (AXIS 1) gives per-row partials [BLOCK_B]; a [BLOCK_B, LANES, LANE_ELEMS] tile (AXIS 2) per-lane partials
    [BLOCK_B, LANES], whose reductions stay inside a thread when LANE_ELEMS are the elements one thread holds: no
    shuffles or barriers per tile (`_lanes_lse` meets the lanes once, at the end)."""
    new_max = tl.maximum(running_max, _max(x, axis=AXIS))
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    running_sum = (running_sum * tl.exp(running_max - shift)
                   + _sum(_sum_exp_term(x - tl.expand_dims(shift, AXIS)), axis=AXIS))
    return new_max, running_sum


@device_function
def _lanes_lse(lane_max, lane_sum):
    """Per-lane (max, sum) [BLOCK_B, LANES] to per-row (max, sum exp(x - max)) [BLOCK_B]; -inf safe."""
    row_max = _max(lane_max, axis=1)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    return row_max, _sum(lane_sum * tl.exp(lane_max - shift[:, None]), axis=1)


@device_function
def _combine_lse(part_max, part_sum, PRECISE: tl.constexpr):
    """Reduce [BLOCK_B, BLOCK_P, BLOCK_S] chunk partials to (max, log sum exp(x - max))."""
    row_max = _max(part_max, axis=2)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = _sum(part_sum * _exp(part_max - shift[:, :, None], PRECISE), axis=2)
    return row_max, _log(total, PRECISE)

