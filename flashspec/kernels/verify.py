"""Speculative verification in Triton, with no host sync (book/design.md §1, §4).

The default launch structure is two launches (`kernels/two_launch.py`):

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

The second of the two may be a programmatic dependent launch (`plan.pdl`, SM90+): the stats launch lets it
start at once and it waits on the GPU for the stats launch's writes, so its launch overlaps the stats pass.

residual="rejection" runs one launch on the stats pass's grid instead (`kernels/one_pass.py`). Other launch
structures register themselves in `flashspec.kernels.structures` (the lab's fused, cooperative and cluster
launches: `import flashspec_lab.kernels`); `make_plan` takes one where a plan asks for it.

The kernels take BLOCK_B rows per program: 1 on a GPU with a real vocabulary; many when the
vocabulary is tiny or when Triton runs in its CPU interpreter, where each program costs
milliseconds of Python.

This module binds and runs a step: `prepare_verify` plans it (`kernels/plan.py`), allocates its buffers and binds
its structure's launches into a `PreparedVerify` (`kernels/step.py`); `verify_triton` runs it, from a warm binding
once one exists (`step._WarmStep`), through the launchers of `kernels/launcher.py`.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from flashspec import rng
from flashspec.kernels import rng as krng
from flashspec.kernels import block_pass, structures
from flashspec.kernels.launcher import FAST_LAUNCH, _current_device, _launch_hooks
from flashspec.kernels.plan import LaunchPlan, make_plan
from flashspec.kernels.shims import SCALE_DIVIDE, SCALE_MULTIPLY, SCALE_NONE, interpreting
from flashspec.kernels.step import (_ACCEPT, _BASE, _DRAFT, _SAMPLE, _TARGET, _TOKENS, _WARM_STEPS, PreparedVerify,
                                    _Slot, _WarmStep, _warm_key, _warm_step, _work_layout, warm_options)
from flashspec.sampling import SamplingParams, truncate_logits
from flashspec.sampling import check_method


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


def launch_key(plan: LaunchPlan, inputs: tuple, shape: tuple[int, int, int], flags: dict, prefix: tuple) -> tuple:
    """What decides the compiled binaries of one verify step, in a few cheap fields: the plan (every block
    size, split count, option, the structure and its parameters), the flags, the caller's three tensors' dtypes
    and 16-byte alignment, the exact B, γ, V, and where the key's prefixes live. Everything else a launch passes
    is fixed by these: the work buffers are this module's own allocations (fp32/int32, 64-byte aligned slices),
    `scale` is always a float, and the prefixes as ints are int32 and unspecialised (`do_not_specialize`)."""
    target, draft, tokens_in = inputs
    accept_prefix, sample_prefix, in_memory = prefix
    where = (accept_prefix.data_ptr() % 16, sample_prefix.data_ptr() % 16) if in_memory else None
    return (plan, flags["SCALE_MODE"], flags["HAS_DRAFT"], flags["GREEDY"], shape, where,
            target.dtype, draft.dtype, tokens_in.dtype,
            target.data_ptr() % 16 == 0, draft.data_ptr() % 16 == 0, tokens_in.data_ptr() % 16 == 0)


def _device_index(device: torch.device) -> int | None:
    """The CUDA device whose binaries a launch uses (the current one, as Triton's launcher); None interpreted."""
    if device.type != "cuda" or interpreting():
        return None
    return _current_device()


_ENTRY_IDS: dict[tuple, int] = {}


def _entry_id(device_index: int | None, key: tuple) -> int:
    """A small int standing for (device, `launch_key`): hashing the key (its plan has a score of fields) once per
    step instead of once per binary lookup."""
    return _ENTRY_IDS.setdefault((device_index, key), len(_ENTRY_IDS))


def _is_warm(plan: LaunchPlan, entry: int, device_index: int | None) -> bool:
    """Every launch of this step has its compiled binary cached under `entry`, so it can take raw device
    addresses for its pointers (Triton's launcher reads an int as the address, skipping `data_ptr()` and the
    driver's pointer query per argument; a first launch needs tensors, which Triton types its pointers by)."""
    return (FAST_LAUNCH and device_index is not None
            and all(entry in launcher.binaries for launcher in structures.get(plan.structure).launchers(plan)))


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
    method: str = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton backend of `flashspec.verify` (shapes already checked there): (tokens [B, γ+1], num_accepted [B]).
    `draft_is_log_probs`: `draft_logits` holds the draft's warped log-probs (as `flashspec.verify`'s argument):
    the stats pass then streams the target's logits only.

    The plan's launch structure (`make_plan`), no host sync. Top-k / top-p first truncate the logits in torch (a
    sort, O(V log V)); the kernels' fast path is temperature only. `block_b`, `block_v` and
    `num_splits` override the launch plan (tests use them to force several V-chunks).
    `prefixes` is `device_prefixes(key)` when the caller (a device key) computed it already.
    `fused`: True the fused single launch (a structure of the lab: `import flashspec_lab.kernels` registers it),
    False the two launches, None the plan's choice for this shape. `tuning`: (key, value) pairs of `plan.GPU_PLAN`
    and of the registered structures' keys that replace the shape's `SHAPE_PLANS` entry (benchmark variants;
    interpreted, only the structures' keys and the two launches' options matter). A structure named but not
    registered is refused (ValueError).
    `residual`: as `flashspec.verify`'s; "rejection" runs the one-pass plan (`kernels/one_pass.py`) whatever the
    shape, `fused` and the launch-structure keys of `tuning` (its tile and grid keys still apply; a structure
    they name must still be registered). `method`: as `flashspec.verify`'s; "block" at T > 0 runs block
    verification's three launches (`kernels/block_pass.py`) whatever `fused` and the structure keys say.
    """
    check_method(method, residual)
    sampler = block_pass.SAMPLER if method == "block" and not params.greedy else residual
    in_memory = isinstance(key, torch.Tensor)
    if in_memory and prefixes is None:
        prefixes = device_prefixes(key)  # once, for the warm lookup and, if cold, for prepare_verify
    step = _warm_step(target_logits, draft_logits, draft_tokens, params, prefixes if in_memory else None,
                      warm_options(block_b, block_v, num_splits, fused, tuning, draft_is_log_probs, sampler))
    if step is not None and step.calls and _launch_hooks() == (None, None):
        if in_memory:  # the kernels read the device key's prefixes (int32) at these addresses
            accept = prefixes.data_ptr()
            sample = accept + prefixes.stride(0) * prefixes.element_size()
        else:
            accept, sample = _prefixes(key)
        return step.launch(target_logits, draft_logits, draft_tokens, accept, sample)
    return prepare_verify(target_logits, draft_logits, draft_tokens, params, key, block_b=block_b, block_v=block_v,
                          num_splits=num_splits, prefixes=prefixes, fused=fused, tuning=tuning,
                          draft_is_log_probs=draft_is_log_probs, residual=residual, method=method).run()


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
    method: str = "token",
) -> PreparedVerify:
    """Allocate outputs and work buffers and bind the plan's launches (see `verify_triton`). `tuning`: (key, value)
    pairs of `GPU_PLAN` and of the registered structures' keys that replace this shape's `SHAPE_PLANS` entry (the
    benchmark's plan variants).

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
    check_method(method, residual)
    sampler = block_pass.SAMPLER if method == "block" and not params.greedy else residual  # its structures' key
    options = warm_options(block_b, block_v, num_splits, fused, tuning, draft_is_log_probs, sampler)
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

    plan = make_plan(batch, gamma, vocab, device, greedy, block_b, block_v, num_splits, fused, tuning, sampler)
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
    bind = structures.get(plan.structure).bind
    if warm and warm_key is not None:  # later calls with this key reuse the binding (`_WarmStep`)
        launches = bind(plan, (_Slot(_TARGET), _Slot(_DRAFT), _Slot(_TOKENS)),
                        (_Slot(_BASE), _Slot(_BASE, 4 * layout.accepted)),
                        {name: _Slot(_BASE, 4 * offset) for name, offset, _, _ in layout.fields}, shape, scale, flags,
                        (_Slot(_ACCEPT), _Slot(_SAMPLE), prefix_in_memory), device, True)
        step = _WarmStep.from_launches(plan, entry, launches, has_draft, layout.words, layout.accepted, batch, gamma)
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
    launches = bind(plan, inputs, outputs, work, shape, scale, flags, prefix, device, warm)
    # raw addresses do not keep their tensors alive (a contiguous or truncated copy made here would be freed
    # on return): the step holds them
    return PreparedVerify(plan=plan, tokens=outputs[0], num_accepted=outputs[1], launches=launches, key=entry,
                          keep=(target, draft, tokens_in, memory, accept_prefix, sample_prefix))


def _stream_prefixes(key: rng.Key | torch.Tensor, prefixes: torch.Tensor | None) -> tuple:
    """The accept and sample stream prefixes a step's launches take: a host key's two ints, or, for a device key,
    the two one-element views of `prefixes` (`device_prefixes(key)`) whose addresses the kernels read."""
    if isinstance(key, torch.Tensor):
        return prefixes[0:1], prefixes[1:2]
    return _prefixes(key)


