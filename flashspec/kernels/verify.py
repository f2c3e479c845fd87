"""Speculative verification in Triton, in two launches or one, with no host sync (book/design.md §1, §4).

Launch 1, `_stats_kernel` -- one streaming pass over every logit row. Grid
(row blocks, γ+1 positions, V-splits); each program reduces one V-chunk of the target row
at its position and of the draft row at the same position to an online log-sum-exp partial
(max, sum of exp(x - max)) -- or, greedy, to a (max, first argmax) partial.

Launch 2, `_sample_kernel` -- accept, then residual/bonus sample. Grid (row blocks,
V-splits). Every program first redoes the accept test of its rows from the ≤ 2γ+1
partials and the two logits at each drafted token (O(1) in V per candidate), so it knows
n = the first rejection without waiting for anyone; then it streams its V-chunk of the
one position it samples from (the first rejected, or the bonus position γ) in the two-level
race of `flashspec.sampling.block_race`: the weights max(0, p - q), or p for the bonus, summed
per block of 256 tokens, the blocks raced with counter-based noise, then the tokens of the
chunk's winning block. It writes its chunk's winner; the last program of its row block
to finish (an atomic ticket) reduces the chunk winners and writes tokens/num_accepted.
So B = 1 still spreads each pass over the whole GPU, and nothing returns to the host.

Or one launch, `_fused_kernel` (kernels/fused_pass.py): grid (row blocks, V-splits); each program
writes its V-chunk's partials of all 2γ+1 rows, and the last program of a row block to finish (an
atomic ticket) runs launch 2's program over the whole vocabulary. One launch fewer and no second
read of the partials' scheduling, but one program streams the sampled row alone. Both give the same
tokens for the same V-splits.

The second of the two may be a programmatic dependent launch (`plan.pdl`, SM90+): the stats launch lets it
start at once and it waits on the GPU for the stats launch's writes, so its launch overlaps the stats pass.

Or one cooperative launch, `_coop_kernel` (kernels/coop_pass.py), at T > 0: grid (rows, V-splits), every
program resident at once; each loads its chunk of all 2γ+1 rows in one round trip, stores the partials,
waits at a per-row barrier, then runs launch 2's program on its own chunk. One launch and one dependent
round trip fewer than the two launches, with the same tokens.

Or one cluster launch, `_cluster_kernel` (kernels/cluster_pass.py), at T > 0 on SM90+ with Triton >= 3.9: one
program per row, spread over the blocks of a thread-block cluster, whose reductions meet in distributed shared
memory instead of global memory: no partials, tickets or barriers in global memory at all. `make_plan` picks
one of the four per shape (`plan.SHAPE_PLANS`, from the benchmark).

Both kernels take BLOCK_B rows per program: 1 on a GPU with a real vocabulary; many when the
vocabulary is tiny or when Triton runs in its CPU interpreter, where each program costs
milliseconds of Python.
"""
from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import triton

from flashspec import rng
from flashspec.kernels import rng as krng
from flashspec_lab.kernels.cluster_pass import _cluster_kernel
from flashspec_lab.kernels.coop_pass import _coop_kernel, barrier_phases
from flashspec_lab.kernels.fused_pass import _fused_kernel
from flashspec.kernels.one_pass import _one_pass_kernel
from flashspec.kernels.plan import GPU_PLAN, SHAPE_PLANS, LaunchPlan, make_plan  # noqa: F401  (re-exported: the benchmark tunes them)
from flashspec.kernels.sample_pass import _sample_kernel
from flashspec.kernels.shims import SCALE_DIVIDE, SCALE_MULTIPLY, SCALE_NONE, _cdiv, interpreting  # noqa: F401
from flashspec.kernels.stats_pass import _stats_accept_kernel, _stats_kernel
from flashspec.verify import check_residual
from flashspec.sampling import REJECTION_PROPOSALS, SAMPLE_BLOCK, SamplingParams, truncate_logits

_COMPILE_OPTIONS: dict = {} if interpreting() else {"enable_fp_fusion": False}

_COUNTERS: dict[tuple[str, int | None], tuple[torch.Tensor, int]] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown ticket buffers: a captured graph may still hold their address


def _ticket_counter(device: torch.device, size: int, address: bool = False) -> torch.Tensor | int:
    """Zeroed int32 tickets, kept between calls (each call's last program resets its entry), or their
    address. One buffer per device: calls on one device must not run concurrently on several streams."""
    key = (device.type, device.index)
    cached = _COUNTERS.get(key)
    if cached is None or cached[0].numel() < size:
        if cached is not None:
            _RETIRED.append(cached[0])
        counter = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        cached = _COUNTERS[key] = (counter, counter.data_ptr())
    return cached[1] if address else cached[0]


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

    @classmethod
    def spec_key(cls, args: tuple, meta: dict) -> tuple:
        """The specialisation of a launch, from every argument (one `_spec` each) and every constexpr."""
        return tuple(cls._spec(a) for a in args), tuple(meta.items())

    def _entry(self, args: tuple, meta: dict, key: int | None) -> object:
        """What a binary is cached under: `key` when given (`_entry_id` of the caller's device and `launch_key`),
        else (device, specialisation) computed from the arguments."""
        return (torch.cuda.current_device(), self.spec_key(args, meta)) if key is None else key

    def registers(self, args: tuple, meta: dict, key: int | None = None) -> dict | None:
        """Registers and spills per thread of the binary cached for these arguments (after a launch), or
        None (interpreted, Triton's own launch path, or not launched yet): what bounds the programs per SM."""
        if interpreting() or not FAST_LAUNCH:
            return None
        cached = self.binaries.get(self._entry(args, meta, key))
        if cached is None:
            return None
        binary = cached[0]
        return {"registers": int(getattr(binary, "n_regs", -1)), "spills": int(getattr(binary, "n_spills", -1)),
                "shared_bytes": int(getattr(binary.metadata, "shared", -1))}

    def __call__(self, grid: tuple, args: tuple, meta: dict, key: int | None = None) -> None:
        """Launch. `key`, when given, stands for (current device, `spec_key(args, meta)`) (computing that costs
        about a µs per argument): it must determine it, as `_entry_id` of `launch_key` does for the verify steps.
        Pointer arguments may be raw addresses (ints) once the binary is cached (`_is_warm`)."""
        if interpreting():
            with np.errstate(all="ignore"):  # log(0), inf - inf in masked lanes are intended
                self.kernel[grid](*args, **meta)
            return
        if not FAST_LAUNCH:
            self.kernel[grid](*args, **meta)
            return
        entry = self._entry(args, meta, key)
        cached = self.binaries.get(entry)
        if cached is None:
            binary = self.kernel[grid](*args, **meta)
            self.binaries[entry] = (binary, tuple(meta[name] for name in self.kernel.arg_names[len(args):]),
                                    torch.cuda.current_device())
            return
        binary, constexprs, device_index = cached
        stream = _current_stream(device_index)
        enter_hook, exit_hook = _launch_hooks()
        # what Triton passes: the hook's metadata, built only when there is a hook to read it
        metadata = None if enter_hook is None else binary.launch_metadata(grid, stream, *args, *constexprs)
        binary.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                   binary.function, binary.packed_metadata, metadata, enter_hook, exit_hook, *args, *constexprs)


def _launch_hooks() -> tuple:
    """Triton's launch enter and exit hooks, None where there is none: Triton >= 3.9 keeps each as a chain that
    may be empty (calling an empty chain, and building the metadata it would read, cost about a µs a launch)."""
    runtime = triton.knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return (None if enter is None or getattr(enter, "calls", True) == [] else enter,
            None if leave is None or getattr(leave, "calls", True) == [] else leave)


def launch_key(plan: LaunchPlan, inputs: tuple, shape: tuple[int, int, int], flags: dict, prefix: tuple) -> tuple:
    """What decides the compiled binaries of one verify step, in a few cheap fields: the plan (every block
    size, split count and option), the flags, the caller's three tensors' dtypes and 16-byte alignment, the
    exact B, γ, V, and where the key's prefixes live. Everything else a launch passes is fixed by these: the
    work buffers are this module's own allocations (fp32/int32, 64-byte aligned slices), `scale` is always a
    float, and the prefixes as ints are int32 and unspecialised (`do_not_specialize`)."""
    target, draft, tokens_in = inputs
    accept_prefix, sample_prefix, in_memory = prefix
    where = (accept_prefix.data_ptr() % 16, sample_prefix.data_ptr() % 16) if in_memory else None
    return (plan, flags["SCALE_MODE"], flags["HAS_DRAFT"], flags["GREEDY"], shape, where,
            target.dtype, draft.dtype, tokens_in.dtype,
            target.data_ptr() % 16 == 0, draft.data_ptr() % 16 == 0, tokens_in.data_ptr() % 16 == 0)


FAST_LAUNCH = os.environ.get("FLASHSPEC_TRITON_FAST_LAUNCH", "1") != "0"
_STATS_LAUNCHER = _Launcher(_stats_kernel)
_STATS_ACCEPT_LAUNCHER = _Launcher(_stats_accept_kernel)
_SAMPLE_LAUNCHER = _Launcher(_sample_kernel)
_FUSED_LAUNCHER = _Launcher(_fused_kernel)
_COOP_LAUNCHER = _Launcher(_coop_kernel)
_CLUSTER_LAUNCHER = _Launcher(_cluster_kernel)
_ONE_PASS_LAUNCHER = _Launcher(_one_pass_kernel)


# the current CUDA device without `torch.cuda.current_device`'s lazy-init check (a µs): for calls whose tensors are
# on a CUDA device already
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

try:  # what Triton's own launcher uses
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover
    def _current_stream(device_index: int) -> int:
        return torch.cuda.current_stream(device_index).cuda_stream


@dataclass
class PreparedVerify:
    """One verify step with its buffers allocated and its launches bound (no host sync).

    `run()` launches the fused kernel (`plan.fused`), the cooperative one (`plan.coop`) or both kernels; the
    benchmark times `launch_stats` / `launch_sample` alone. Grids and arguments of the plan not chosen are None.
    """

    plan: LaunchPlan
    tokens: torch.Tensor
    num_accepted: torch.Tensor
    stats_grid: tuple[int, int, int] | None = None
    stats_args: tuple | None = None
    stats_meta: dict | None = None
    sample_grid: tuple[int, int] | None = None
    sample_args: tuple | None = None
    sample_meta: dict | None = None
    fused_grid: tuple[int, int] | None = None
    fused_args: tuple | None = None
    fused_meta: dict | None = None
    coop_grid: tuple[int, int] | None = None
    coop_args: tuple | None = None
    coop_meta: dict | None = None
    cluster_grid: tuple[int] | None = None
    cluster_args: tuple | None = None
    cluster_meta: dict | None = None
    one_pass_grid: tuple[int, int, int] | None = None
    one_pass_args: tuple | None = None
    one_pass_meta: dict | None = None
    key: int | None = None  # `_entry_id`: stands for each launch's device and specialisation (None: per launch)
    keep: tuple = ()  # the tensors whose raw addresses the launches hold (a warm step's): alive while this is
    direct: tuple = ()  # a warm step's launches, fired without `_Launcher` (`_WarmStep.launch_list`)

    def launch_stats(self) -> None:
        launcher = _STATS_ACCEPT_LAUNCHER if self.plan.accept_once else _STATS_LAUNCHER
        launcher(self.stats_grid, self.stats_args, self.stats_meta, self.key)

    def launch_sample(self) -> None:
        _SAMPLE_LAUNCHER(self.sample_grid, self.sample_args, self.sample_meta, self.key)

    def launch_fused(self) -> None:
        _FUSED_LAUNCHER(self.fused_grid, self.fused_args, self.fused_meta, self.key)

    def launch_coop(self) -> None:
        """One cooperative launch; interpreted, the two halves of the kernel either side of its barrier."""
        for meta in barrier_phases(self.coop_meta):
            _COOP_LAUNCHER(self.coop_grid, self.coop_args, meta, self.key)

    def launch_cluster(self) -> None:
        _CLUSTER_LAUNCHER(self.cluster_grid, self.cluster_args, self.cluster_meta, self.key)

    def launch_one_pass(self) -> None:
        _ONE_PASS_LAUNCHER(self.one_pass_grid, self.one_pass_args, self.one_pass_meta, self.key)

    def registers(self) -> dict:
        """`_Launcher.registers` of each kernel this step launches (call after a run)."""
        if self.plan.cluster:
            return {"cluster": _CLUSTER_LAUNCHER.registers(self.cluster_args, self.cluster_meta, self.key)}
        if self.plan.one_pass:
            return {"one_pass": _ONE_PASS_LAUNCHER.registers(self.one_pass_args, self.one_pass_meta, self.key)}
        if self.plan.fused:
            return {"fused": _FUSED_LAUNCHER.registers(self.fused_args, self.fused_meta, self.key)}
        if self.plan.coop:
            return {"coop": _COOP_LAUNCHER.registers(self.coop_args, self.coop_meta, self.key)}
        stats = _STATS_ACCEPT_LAUNCHER if self.plan.accept_once else _STATS_LAUNCHER
        return {"stats": stats.registers(self.stats_args, self.stats_meta, self.key),
                "sample": _SAMPLE_LAUNCHER.registers(self.sample_args, self.sample_meta, self.key)}

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.direct and FAST_LAUNCH:  # a warm step's compiled binaries, called straight (no hooks to feed)
            enter_hook, exit_hook = _launch_hooks()
            if enter_hook is None and exit_hook is None:
                device_index, launches = self.direct
                stream = _current_stream(device_index)
                for fire, args in launches:
                    fire(stream, args)
                return self.tokens, self.num_accepted
        if self.plan.one_pass:
            self.launch_one_pass()
        elif self.plan.fused:
            self.launch_fused()
        elif self.plan.coop:
            self.launch_coop()
        elif self.plan.cluster:
            self.launch_cluster()
        else:
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
    fused: bool | None = None,
    tuning: tuple[tuple[str, int], ...] | None = None,
    draft_is_log_probs: bool = False,
    residual: str = "race",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton backend of `flashspec.verify` (shapes already checked there): (tokens [B, γ+1], num_accepted [B]).
    `draft_is_log_probs`: `draft_logits` holds the draft's warped log-probs (as `flashspec.verify`'s argument):
    the stats pass then streams the target's logits only.

    One launch or two, no host sync. Top-k / top-p first truncate the logits in torch (a sort,
    O(V log V)); the kernels' fast path is temperature only. `block_b`, `block_v` and
    `num_splits` override the launch plan (tests use them to force several V-chunks).
    `prefixes` is `device_prefixes(key)` when the caller (a device key) computed it already.
    `fused`: True one launch, False two, None the plan's choice for this shape (`plan.SHAPE_PLANS`
    on a GPU; two launches in the interpreter). `tuning`: (key, value) pairs of `plan.GPU_PLAN` that replace the
    shape's `SHAPE_PLANS` entry (benchmark variants; in the interpreter only "lanes" matters).
    `residual`: as `flashspec.verify`'s; "rejection" runs the one-pass plan (`kernels/one_pass.py`) whatever the
    shape, `fused` and the launch-structure keys of `tuning` (its tile and grid keys still apply).
    """
    in_memory = isinstance(key, torch.Tensor)
    if in_memory and prefixes is None:
        prefixes = device_prefixes(key)  # once, for the warm lookup and, if cold, for prepare_verify
    step = _warm_step(target_logits, draft_logits, draft_tokens, params, prefixes if in_memory else None,
                      warm_options(block_b, block_v, num_splits, fused, tuning, draft_is_log_probs, residual))
    if step is not None and step.calls and _launch_hooks() == (None, None):
        if in_memory:  # the kernels read the device key's prefixes (int32) at these addresses
            accept = prefixes.data_ptr()
            sample = accept + prefixes.stride(0) * prefixes.element_size()
        else:
            accept, sample = _prefixes(key)
        return step.launch(target_logits, draft_logits, draft_tokens, accept, sample)
    return prepare_verify(target_logits, draft_logits, draft_tokens, params, key, block_b=block_b, block_v=block_v,
                          num_splits=num_splits, prefixes=prefixes, fused=fused, tuning=tuning,
                          draft_is_log_probs=draft_is_log_probs, residual=residual).run()


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
    fused: bool | None = None,
    tuning: tuple[tuple[str, int], ...] | None = None,
    draft_is_log_probs: bool = False,
    residual: str = "race",
) -> PreparedVerify:
    """Allocate outputs and work buffers and bind the launches (see `verify_triton`). `tuning`: (key, value)
    pairs of `GPU_PLAN` that replace this shape's `SHAPE_PLANS` entry (the benchmark's plan variants).

    `key` is a host Key (its stream prefixes become launch arguments) or a device int64 tensor [2]
    (lo, hi): then the prefixes are computed on the device into a buffer the kernel reads, so a
    captured graph whose key buffer changes between replays draws new uniforms each time."""
    device = target_logits.device
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got target_logits on {device}; "
            "use backend='torch' (or TRITON_INTERPRET=1 to run the kernels on the CPU)"
        )
    prefix_in_memory = isinstance(key, torch.Tensor)
    if prefix_in_memory and prefixes is None:
        prefixes = device_prefixes(key)
    accept_prefix, sample_prefix = _stream_prefixes(key, prefixes)
    if draft_is_log_probs and draft_logits is None:
        raise ValueError("draft_is_log_probs=True needs draft_logits (the draft's log-probs); pass them, or "
                         "draft_is_log_probs=False for deterministic proposals")
    check_residual(residual)
    options = warm_options(block_b, block_v, num_splits, fused, tuning, draft_is_log_probs, residual)
    warm_key = _warm_key(target_logits, draft_logits, draft_tokens, params, prefixes if prefix_in_memory else None,
                         options)
    if warm_key is not None:
        step = _WARM_STEPS.get(warm_key)
        if step is not None:
            return step.prepare(target_logits, draft_logits, draft_tokens, accept_prefix, sample_prefix)
    batch, gamma = draft_tokens.shape
    vocab = target_logits.shape[2]
    greedy = params.greedy
    if greedy:
        draft_logits = None
        scale_mode, scale = SCALE_NONE, 1.0
    elif params.needs_truncation:
        target_logits = truncate_logits(target_logits.float() / params.temperature, params)
        if draft_logits is not None and not draft_is_log_probs:  # log-probs come warped already
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

    plan = make_plan(batch, gamma, vocab, device, greedy, block_b, block_v, num_splits, fused, tuning, residual)
    inputs = (target, draft, tokens_in)
    shape = (batch, gamma, vocab)
    # HAS_DRAFT: 0 no draft logits (deterministic proposals, or greedy), 1 logits, 2 warped log-probs
    flags = dict(SCALE_MODE=scale_mode, HAS_DRAFT=(2 if draft_is_log_probs else 1) if has_draft else 0,
                 GREEDY=greedy)
    prefix = (accept_prefix, sample_prefix, prefix_in_memory)
    device_index = _device_index(device)
    entry = _entry_id(device_index, launch_key(plan, inputs, shape, flags, prefix))
    warm = _is_warm(plan, entry, device_index)
    layout = _work_layout(batch, gamma, plan, greedy, vocab)
    bind = _binder(plan)
    if warm and warm_key is not None:  # later calls with this key reuse the binding (`_WarmStep`)
        template = bind(plan, (_Slot(_TARGET), _Slot(_DRAFT), _Slot(_TOKENS)),
                        (_Slot(_BASE), _Slot(_BASE, 4 * layout.accepted)),
                        {name: _Slot(_BASE, 4 * offset) for name, offset, _, _ in layout.fields}, shape, scale, flags,
                        (_Slot(_ACCEPT), _Slot(_SAMPLE), prefix_in_memory), entry, device, True)
        step = _WarmStep.from_template(template, has_draft, layout.words, layout.accepted, batch, gamma)
        _WARM_STEPS[warm_key] = step
        return step.prepare(target, draft if has_draft else None, tokens_in, accept_prefix, sample_prefix)
    if warm:  # every launch of this step calls a cached binary: raw addresses, no tensor views
        inputs = (target.data_ptr(), draft.data_ptr(), tokens_in.data_ptr())
        if prefix_in_memory:
            prefix = (accept_prefix.data_ptr(), sample_prefix.data_ptr(), True)
    memory = torch.empty(layout.words // 2, dtype=torch.int64, device=device)
    outputs = (memory[:batch * (gamma + 1)].view(batch, gamma + 1),
               memory[layout.accepted // 2:layout.accepted // 2 + batch])
    work = layout.addresses(memory.data_ptr()) if warm else layout.views(memory)
    prepared = bind(plan, inputs, outputs, work, shape, scale, flags, prefix, entry, device, warm)
    # raw addresses do not keep their tensors alive (a contiguous or truncated copy made here would be freed
    # on return): the step holds them
    prepared.keep = (target, draft, tokens_in, memory, accept_prefix, sample_prefix)
    return prepared


def _stream_prefixes(key: rng.Key | torch.Tensor, prefixes: torch.Tensor | None) -> tuple:
    """The accept and sample stream prefixes a step's launches take: a host key's two ints, or, for a device key,
    the two one-element views of `prefixes` (`device_prefixes(key)`) whose addresses the kernels read."""
    if isinstance(key, torch.Tensor):
        return prefixes[0:1], prefixes[1:2]
    return _prefixes(key)


def _warm_step(target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor, params: SamplingParams,
               prefixes: torch.Tensor | None, options: tuple) -> "_WarmStep | None":
    """The binding an earlier call with the same `_warm_key` left, or None (cold, or a call that cannot reuse one)."""
    warm_key = _warm_key(target, draft, tokens, params, prefixes, options)
    return None if warm_key is None else _WARM_STEPS.get(warm_key)


_TARGET, _DRAFT, _TOKENS, _BASE, _ACCEPT, _SAMPLE = range(6)  # what a `_Slot` reads from a warm call


class _Slot(NamedTuple):
    """A launch argument that changes from call to call in a warm step's binding: the call's value `source`
    (the three inputs' addresses, the step's allocation's address, the two stream prefixes or their addresses)
    plus `offset` bytes."""

    source: int
    offset: int = 0


@dataclass(frozen=True)
class _WarmStep:
    """One verify step's launches bound once, for every later call with the same `_warm_key`: each launch's
    arguments with `_Slot`s where a call's addresses and prefixes go. A call then allocates its buffers and fills
    the slots; the plan, the launch key, the layout and the launches' constants are not computed again (building
    them took about half of an eager step's host time)."""

    plan: LaunchPlan
    key: int
    has_draft: bool
    words: int
    accepted: int
    batch: int
    gamma: int
    launches: tuple[tuple[str, tuple, tuple, tuple, dict], ...]  # (field, grid, arguments, slots, meta)
    binaries: tuple = ()  # each launch's cached (binary, constexprs, device) (`_Launcher.binaries`); () interpreted
    calls: tuple = ()  # each launch as (fire(stream, arguments), arguments with constexprs, slots): `launch`

    @classmethod
    def from_template(cls, template: PreparedVerify, has_draft: bool, words: int, accepted: int, batch: int,
                      gamma: int) -> "_WarmStep":
        """From a step bound to `_Slot`s (the bind functions, given slots for inputs, outputs, work and prefixes)."""
        launches = []
        for field in _LAUNCH_FIELDS:
            args = getattr(template, field + "_args")
            if args is not None:
                slots = tuple((position, arg.source, arg.offset) for position, arg in enumerate(args)
                              if isinstance(arg, _Slot))
                launches.append((field, getattr(template, field + "_grid"), args, slots,
                                 getattr(template, field + "_meta")))
        # `_launchers` lists the plan's launchers in the order of `_LAUNCH_FIELDS`, as `launches` holds them
        binaries = tuple(launcher.binaries.get(template.key) for launcher in _launchers(template.plan))
        if None in binaries:
            binaries = ()
        calls = tuple((_firing(binary, grid), list(args) + list(constexprs), slots)
                      for (_, grid, args, slots, _), (binary, constexprs, _) in zip(launches, binaries))
        return cls(plan=template.plan, key=template.key, has_draft=has_draft, words=words,
                   accepted=accepted, batch=batch, gamma=gamma, launches=tuple(launches),
                   binaries=binaries, calls=calls)

    def fields(self, values: tuple[int, ...]) -> dict:
        """`PreparedVerify`'s grid, arguments and meta of each launch, the slots filled from `values` (indexed by
        `_Slot.source`)."""
        fields = {}
        for field, grid, template, slots, meta in self.launches:
            args = list(template)
            for position, source, offset in slots:
                args[position] = values[source] + offset
            fields[field + "_grid"], fields[field + "_args"], fields[field + "_meta"] = grid, tuple(args), meta
        return fields

    def launch_list(self, fields: dict) -> tuple:
        """(device, ((fire, arguments and constexprs), ...)): what `PreparedVerify.run` launches without
        `_Launcher` (`_firing`); () when a binary is not cached."""
        if not self.binaries:
            return ()
        launches = tuple((fire, fields[field + "_args"] + constexprs) for (field, *_), (fire, _, _), (_, constexprs, _)
                         in zip(self.launches, self.calls, self.binaries))
        return self.binaries[0][2], launches

    def launch(self, target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor, accept: int,
               sample: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This call's step launched at once (`verify_triton`'s warm path, while no launch hook is set): one
        allocation, the slots filled, each cached binary fired; (tokens, num_accepted) are views of the
        allocation. `accept`, `sample`: a host key's two stream prefixes, or the addresses of a device key's.
        Nothing outlives the call but the outputs: the inputs are the caller's (contiguous, so never copied
        here) and the stream orders their reuse after these kernels."""
        memory = torch.empty(self.words // 2, dtype=torch.int64, device=target.device)
        target_address = target.data_ptr()
        values = (target_address, draft.data_ptr() if self.has_draft else target_address, tokens.data_ptr(),
                  memory.data_ptr(), accept, sample)
        stream = _current_stream(self.binaries[0][2])
        for fire, template, slots in self.calls:
            args = template.copy()
            for position, source, offset in slots:
                args[position] = values[source] + offset
            fire(stream, args)
        width = self.gamma + 1
        return (memory.as_strided((self.batch, width), (width, 1)),
                memory.as_strided((self.batch,), (1,), self.accepted // 2))

    def prepare(self, target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor,
                accept_prefix: int | torch.Tensor, sample_prefix: int | torch.Tensor) -> PreparedVerify:
        """This call's step: fresh outputs and work buffers (one allocation), the slots filled."""
        memory = torch.empty(self.words // 2, dtype=torch.int64, device=target.device)
        target_address = target.data_ptr()
        in_memory = isinstance(accept_prefix, torch.Tensor)
        fields = self.fields((target_address, draft.data_ptr() if self.has_draft else target_address,
                              tokens.data_ptr(), memory.data_ptr(),
                              accept_prefix.data_ptr() if in_memory else accept_prefix,
                              sample_prefix.data_ptr() if in_memory else sample_prefix))
        step = PreparedVerify(plan=self.plan, tokens=memory[:self.batch * (self.gamma + 1)].view(self.batch, -1),
                              num_accepted=memory[self.accepted // 2:self.accepted // 2 + self.batch], key=self.key,
                              direct=self.launch_list(fields), **fields)
        # raw addresses do not keep their tensors alive: the step holds them
        step.keep = (target, draft, tokens, memory, accept_prefix, sample_prefix)
        return step


def _firing(binary, grid: tuple):
    """fire(stream, arguments): one launch of a cached binary with no hook, through the launcher's C entry
    where this Triton's launcher is the one `_raw_launch_call` recognises (skipping its Python wrapper: two
    closures and the scratch checks, about a µs a launch), else through the launcher itself."""
    grid_x, grid_y, grid_z = tuple(grid) + (1,) * (3 - len(grid))
    run, function, packed = binary.run, binary.function, binary.packed_metadata
    raw = _raw_launch_call(run)
    if raw is not None:
        launch, cooperative, pdl, annotations, signature = raw

        def fire(stream: int, args: list) -> None:
            launch(grid_x, grid_y, grid_z, stream, function, cooperative, pdl, packed, None, None, None, None,
                   None, annotations, signature, args)
        return fire

    def fire(stream: int, args: list) -> None:
        run(grid_x, grid_y, grid_z, stream, function, packed, None, None, None, *args)
    return fire


# what Triton 3.9's CudaLauncher.__call__ passes to its C launch: `_raw_launch_call` checks that the wrapper still
# reads so before calling the C entry the same way
_LAUNCH_CALL_39 = ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, "
                   "kernel_metadata, launch_metadata, launch_enter_hook, launch_exit_hook, global_scratch, "
                   "profile_scratch, self.arg_annotations, self.kernel_signature, kernel_args)")


@functools.lru_cache(maxsize=None)
def _wrapper_calls_launch_as_39(launcher_type: type) -> bool:
    try:
        source = inspect.getsource(launcher_type.__call__)
    except (OSError, TypeError):
        return False
    return _LAUNCH_CALL_39 in " ".join(source.split()).replace("( ", "(").replace(" )", ")")


def _raw_launch_call(launcher) -> tuple | None:
    """(launch, cooperative, pdl, argument annotations, kernel signature) of a launcher whose Python wrapper
    only forwards to its C entry (Triton 3.9's: no global or profile scratch, no sanitizer), else None."""
    names = ("launch", "launch_cooperative_grid", "launch_pdl", "arg_annotations", "kernel_signature")
    if (not all(hasattr(launcher, name) for name in names) or getattr(launcher, "global_scratch_size", 1)
            or getattr(launcher, "profile_scratch_size", 1) or getattr(launcher, "gsan_enabled", False)
            or not _wrapper_calls_launch_as_39(type(launcher))):
        return None
    return tuple(getattr(launcher, name) for name in names)


_LAUNCH_FIELDS = ("stats", "sample", "fused", "coop", "cluster", "one_pass")
_WARM_STEPS: dict[tuple, _WarmStep] = {}


def warm_options(block_b: int | None = None, block_v: int | None = None, num_splits: int | None = None,
                 fused: bool | None = None, tuning: tuple[tuple[str, int], ...] | None = None,
                 draft_is_log_probs: bool = False, residual: str = "race") -> tuple:
    """The call options that decide a step's binding besides its tensors (`_warm_key`'s `options`)."""
    return (block_b, block_v, num_splits, fused, tuning, draft_is_log_probs, residual)


def _warm_key(target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor, params: SamplingParams,
              prefixes: torch.Tensor | None, options: tuple) -> tuple | None:
    """What decides a step's binding, read from the call's arguments alone (a few µs): the device, the
    inputs' shapes, dtypes and 16-byte alignment, the sampling parameters, where device-key prefixes lie, and
    the plan overrides. None where a call cannot reuse a binding: interpreted, Triton's own launch path,
    top-k/top-p (the truncated logits are copies), or inputs that need a contiguous copy."""
    if not FAST_LAUNCH or target.device.type != "cuda" or interpreting() or params.needs_truncation:
        return None
    if params.greedy:
        draft = None
    if not (target.is_contiguous() and tokens.is_contiguous() and (draft is None or draft.is_contiguous())):
        return None
    where = None if prefixes is None else (prefixes.data_ptr() % 16, prefixes.stride(0))
    return (_current_device(), target.shape, target.dtype, target.data_ptr() % 16 == 0,
            None if draft is None else (draft.dtype, draft.data_ptr() % 16 == 0),
            tokens.shape, tokens.dtype, tokens.data_ptr() % 16 == 0, params, where, options)


def _binder(plan: LaunchPlan):
    """The function binding a step's launches under `plan` (`_bind_two_launches` and the one-launch kinds)."""
    return (_bind_one_pass if plan.one_pass else _bind_fused if plan.fused else _bind_coop if plan.coop
            else _bind_cluster if plan.cluster else _bind_two_launches)


def _device_index(device: torch.device) -> int | None:
    """The CUDA device whose binaries a launch uses (the current one, as Triton's launcher); None interpreted."""
    if device.type != "cuda" or interpreting():
        return None
    return _current_device()


_ENTRY_IDS: dict[tuple, int] = {}


def _entry_id(device_index: int | None, key: tuple) -> int:
    """A small int standing for (device, `launch_key`): hashing the key (its plan has twenty fields) once per
    step instead of once per binary lookup."""
    return _ENTRY_IDS.setdefault((device_index, key), len(_ENTRY_IDS))


def _launchers(plan: LaunchPlan) -> tuple[_Launcher, ...]:
    if plan.one_pass:
        return (_ONE_PASS_LAUNCHER,)
    if plan.fused:
        return (_FUSED_LAUNCHER,)
    if plan.coop:
        return (_COOP_LAUNCHER,)
    if plan.cluster:
        return (_CLUSTER_LAUNCHER,)
    return (_STATS_ACCEPT_LAUNCHER if plan.accept_once else _STATS_LAUNCHER, _SAMPLE_LAUNCHER)


def _is_warm(plan: LaunchPlan, entry: int, device_index: int | None) -> bool:
    """Every launch of this step has its compiled binary cached under `entry`, so it can take raw device
    addresses for its pointers (Triton's launcher reads an int as the address, skipping `data_ptr()` and the
    driver's pointer query per argument; a first launch needs tensors, which Triton types its pointers by)."""
    return (FAST_LAUNCH and device_index is not None
            and all(entry in launcher.binaries for launcher in _launchers(plan)))


@dataclass(frozen=True)
class _WorkLayout:
    """Where one step's outputs and work buffers lie in its single allocation, in 4-byte words: the int64
    outputs (tokens, then num_accepted), then the fp32 stats partials (max, sum), the race's scores, the
    accept outcomes, then the int32 part (argmax partials when greedy, the race's indices, spare words
    the ticket falls back to). Every buffer starts 64-byte aligned (what `launch_key` assumes); a buffer a
    plan does not use is 16 words of a valid one of its type (never empty: an empty view's address is 0)."""

    words: int
    accepted: int
    fields: tuple[tuple[str, int, int, bool], ...]  # (name, offset, length, is float32)

    def views(self, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        floats, ints = memory.view(torch.float32), memory.view(torch.int32)
        return {name: (floats if is_float else ints)[offset:offset + length]
                for name, offset, length, is_float in self.fields}

    def addresses(self, base: int) -> dict[str, int]:
        return {name: base + 4 * offset for name, offset, _, _ in self.fields}


@functools.lru_cache(maxsize=256)
def _work_layout(batch: int, gamma: int, plan: LaunchPlan, greedy: bool, vocab: int = 0) -> _WorkLayout:
    """The single allocation of a step under `plan` (a pure function of the shape, so cached); `vocab` sizes the
    one-pass plan's block pairs."""
    splits = plan.fused_splits if plan.fused else plan.coop_splits if plan.coop else plan.stats_splits
    stats = 16 if plan.cluster else _round16(batch * (2 * gamma + 1) * splits)  # the cluster plan keeps them on chip
    if plan.cluster or plan.one_pass:
        race = 0
    elif plan.coop:
        race = _round16(batch * 2 * plan.coop_splits)
    else:
        race = _round16(batch * 2 * plan.sample_splits) if not plan.fused and plan.sample_splits > 1 else 0
    info = _round16(6 * batch) if plan.accept_once else 0
    blocks = (_round16(batch * (gamma + 1) * _cdiv(vocab, SAMPLE_BLOCK))
              if plan.one_pass and not greedy and vocab > SAMPLE_BLOCK else 0)
    accepted = _round16(2 * batch * (gamma + 1))
    floats = accepted + _round16(2 * batch)
    ints = floats + 2 * stats + race + info + 2 * blocks
    fields = (
        ("part_max", floats, stats, True),
        ("part_sum", floats if greedy else floats + stats, stats, True),
        ("race_val", floats + 2 * stats if race else floats, race or 16, True),
        ("info", floats + 2 * stats + race if info else floats, info or 16, True),
        ("block_max", floats + 2 * stats + race + info if blocks else floats, blocks or 16, True),
        ("block_sum", floats + 2 * stats + race + info + blocks if blocks else floats, blocks or 16, True),
        ("part_idx", ints, stats if greedy else 16, False),
        ("race_idx", ints + (stats if greedy else 0), race or 16, False),
        ("ints", ints, 16, False),
    )
    words = ints + (stats if greedy else 0) + race + 16
    return _WorkLayout(words=words + words % 2, accepted=accepted, fields=fields)


def _bind_two_launches(plan: LaunchPlan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int],
                       scale: float, flags: dict, prefix: tuple, entry: int, device: torch.device,
                       addresses: bool) -> PreparedVerify:
    """The stats launch and the sample launch (module docstring), bound to fresh work buffers (`work`: views,
    or, `addresses`, raw addresses once the binaries are cached, or a warm step's `_Slot`s)."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    row_blocks = _cdiv(batch, plan.block_b)
    split = plan.sample_splits > 1
    part_max, part_sum, part_idx, race_val, race_idx, info = (
        work[name] for name in ("part_max", "part_sum", "part_idx", "race_val", "race_idx", "info"))
    counter = _ticket_counter(device, row_blocks, addresses) if split or plan.accept_once else work["ints"]
    precise = plan.precise and not interpreting()
    if plan.accept_once:  # the stats launch's last program per row block runs the accept test (same tickets:
        # it resets them before the sampling launch starts)
        stats_args = (target, draft, tokens_in, part_max, part_sum, counter, info,
                      batch, gamma, vocab, plan.stats_splits, scale, accept_prefix)
        stats_meta = dict(CHUNK=plan.stats_chunk, SCALE_MODE=flags["SCALE_MODE"], HAS_DRAFT=flags["HAS_DRAFT"],
                          PRECISE=precise, PREFIX_IN_MEMORY=prefix_in_memory, BLOCK_B=plan.block_b,
                          BLOCK_P=plan.block_p, BLOCK_S=plan.block_s, BLOCK_V=plan.stats_block_v, PDL=plan.pdl,
                          LANE_ELEMS=plan.stats_lane_elems, num_warps=plan.stats_warps, **_COMPILE_OPTIONS)
    else:
        stats_args = (target, draft, part_max, part_sum, part_idx,
                      batch, gamma, vocab, plan.stats_splits, scale)
        stats_meta = dict(CHUNK=plan.stats_chunk, **flags,
                          BLOCK_B=plan.block_b, BLOCK_V=plan.stats_block_v, PDL=plan.pdl,
                          LANE_ELEMS=plan.stats_lane_elems, num_warps=plan.stats_warps,
                          **_COMPILE_OPTIONS)
    sample_args = (target, draft, tokens_in, part_max, part_sum, part_idx, race_val, race_idx, counter, info,
                   out_tokens, out_accepted,
                   batch, gamma, vocab, plan.stats_splits, plan.sample_splits, scale,
                   accept_prefix, sample_prefix)
    sample_meta = dict(CHUNK=plan.sample_chunk, **flags,
                       SPLIT=split, PRECISE=precise, PREFIX_IN_MEMORY=prefix_in_memory,
                       LANES=plan.lanes, ACCEPTED=plan.accept_once,
                       BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=plan.block_s, BLOCK_S2=plan.block_s2,
                       BLOCK_V=plan.sample_block_v, PDL=plan.pdl, num_warps=plan.sample_warps, **_COMPILE_OPTIONS,
                       **({"launch_pdl": True} if plan.pdl else {}))
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
        key=entry,
    )


def _bind_fused(plan: LaunchPlan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int],
                scale: float, flags: dict, prefix: tuple, entry: int, device: torch.device,
                addresses: bool) -> PreparedVerify:
    """The one fused launch (module docstring), bound to fresh partial buffers (`work`, as for the two)."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    row_blocks = _cdiv(batch, plan.block_b)
    split = plan.fused_splits > 1
    part_max, part_sum, part_idx = work["part_max"], work["part_sum"], work["part_idx"]
    counter = _ticket_counter(device, row_blocks, addresses) if split else work["ints"]
    args = (target, draft, tokens_in, part_max, part_sum, part_idx, counter, out_tokens, out_accepted,
            batch, gamma, vocab, plan.fused_splits, scale, accept_prefix, sample_prefix)
    meta = dict(CHUNK=plan.fused_chunk, ROW=_cdiv(vocab, plan.sample_block_v) * plan.sample_block_v, **flags,
                SPLIT=split, PRECISE=plan.precise and not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory,
                LANES=plan.lanes,
                BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=plan.block_s3,
                STATS_BLOCK_V=plan.stats_block_v, BLOCK_V=plan.sample_block_v, num_warps=plan.stats_warps,
                **_COMPILE_OPTIONS)
    return PreparedVerify(plan=plan, tokens=out_tokens, num_accepted=out_accepted,
                          fused_grid=(row_blocks, plan.fused_splits), fused_args=args, fused_meta=meta, key=entry)


def _bind_coop(plan: LaunchPlan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int],
               scale: float, flags: dict, prefix: tuple, entry: int, device: torch.device,
               addresses: bool) -> PreparedVerify:
    """The one cooperative launch (module docstring), bound to fresh work buffers (`work`, as for the two). Its
    counters: a race ticket, a barrier arrival count and a departure count per row, zero between calls."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    part_max, part_sum, race_val, race_idx = (work[name] for name in ("part_max", "part_sum", "race_val", "race_idx"))
    counter = _ticket_counter(device, 3 * batch, addresses)
    args = (target, draft, tokens_in, part_max, part_sum, race_val, race_idx, counter, out_tokens, out_accepted,
            batch, gamma, vocab, plan.coop_splits, scale, accept_prefix, sample_prefix)
    meta = dict(CHUNK=plan.coop_chunk, SCALE_MODE=flags["SCALE_MODE"], HAS_DRAFT=flags["HAS_DRAFT"], PHASE=0,
                PRECISE=plan.precise and not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory, LANES=plan.lanes,
                BLOCK_P=plan.block_p, BLOCK_S=plan.block_s4, BLOCK_V=plan.coop_block_v, num_warps=plan.coop_warps,
                **_COMPILE_OPTIONS, **({} if interpreting() else {"launch_cooperative_grid": True}))
    return PreparedVerify(plan=plan, tokens=out_tokens, num_accepted=out_accepted,
                          coop_grid=(batch, plan.coop_splits), coop_args=args, coop_meta=meta, key=entry)


def _bind_cluster(plan: LaunchPlan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int],
                  scale: float, flags: dict, prefix: tuple, entry: int, device: torch.device,
                  addresses: bool) -> PreparedVerify:
    """The one cluster launch (`kernels/cluster_pass.py`): a program per row, `plan.cluster_ctas` blocks each.
    It needs no work buffers and no counters: its blocks meet on chip."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    args = (target, draft, tokens_in, out_tokens, out_accepted, gamma, vocab, scale, accept_prefix, sample_prefix)
    meta = dict(ROW=_cdiv(vocab, plan.cluster_block_v) * plan.cluster_block_v, SCALE_MODE=flags["SCALE_MODE"],
                HAS_DRAFT=flags["HAS_DRAFT"], PRECISE=plan.precise and not interpreting(),
                PREFIX_IN_MEMORY=prefix_in_memory, STAGES=plan.cluster_stages, BLOCK_P=plan.block_p,
                BLOCK_V=plan.cluster_block_v,
                num_warps=plan.cluster_warps, **_COMPILE_OPTIONS,
                **({} if interpreting() else {"num_ctas": plan.cluster_ctas}))
    return PreparedVerify(plan=plan, tokens=out_tokens, num_accepted=out_accepted,
                          cluster_grid=(batch,), cluster_args=args, cluster_meta=meta, key=entry)


def _bind_one_pass(plan: LaunchPlan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int],
                   scale: float, flags: dict, prefix: tuple, entry: int, device: torch.device,
                   addresses: bool) -> PreparedVerify:
    """The one launch of the residual by rejection (`kernels/one_pass.py`): grid (row blocks, γ+1, V-splits), a
    ticket per row block."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    one_block = vocab <= SAMPLE_BLOCK
    num_blocks = 1 if one_block else _cdiv(vocab, SAMPLE_BLOCK)
    args = (target, draft, tokens_in, work["part_max"], work["part_sum"], work["part_idx"], work["block_max"],
            work["block_sum"], _ticket_counter(device, _cdiv(batch, plan.block_b), addresses), out_tokens, out_accepted,
            batch, gamma, vocab, plan.stats_splits, num_blocks, scale, accept_prefix, sample_prefix)
    meta = dict(CHUNK=plan.stats_chunk, ROW=_cdiv(vocab, plan.sample_block_v) * plan.sample_block_v, **flags,
                PRECISE=plan.precise and not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory,
                PROPOSALS=REJECTION_PROPOSALS, ONE_BLOCK=one_block,
                SB=triton.next_power_of_2(vocab) if one_block else SAMPLE_BLOCK,
                BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=plan.block_s,
                BLOCK_NB=triton.next_power_of_2(num_blocks),
                BLOCK_V=plan.stats_block_v, SAMPLE_BLOCK_V=plan.sample_block_v, STOP=plan.one_pass_stop,
                num_warps=plan.stats_warps,
                **_COMPILE_OPTIONS)
    return PreparedVerify(plan=plan, tokens=out_tokens, num_accepted=out_accepted,
                          one_pass_grid=(_cdiv(batch, plan.block_b), gamma + 1, plan.stats_splits), one_pass_args=args,
                          one_pass_meta=meta, key=entry)
