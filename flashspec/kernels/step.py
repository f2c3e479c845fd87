"""One verify step's launches, bound: `PreparedVerify` (what `prepare_verify` returns), the single allocation of its
outputs and work buffers (`_work_layout`), and the warm step (`_WarmStep`): a step's launches bound once, with
slots where each call's addresses go, and fired straight from Triton's compiled binaries."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from flashspec.kernels import structures
from flashspec.kernels.launcher import FAST_LAUNCH, _current_device, _current_stream, _firing, _launch_hooks
from flashspec.kernels.plan import LaunchPlan
from flashspec.kernels.shims import interpreting
from flashspec.kernels.structures import Launch
from flashspec.sampling import SamplingParams


@dataclass
class PreparedVerify:
    """One verify step with its buffers allocated and its launches bound (no host sync).

    `run()` fires every launch of the plan's structure in order; `launch(name)` fires one alone (the benchmark
    times the two launches' "stats" and "sample" apart)."""

    plan: LaunchPlan
    tokens: torch.Tensor
    num_accepted: torch.Tensor
    launches: tuple[Launch, ...] = ()
    key: int | None = None  # `_entry_id`: stands for each launch's device and specialisation (None: per launch)
    keep: tuple = ()  # the tensors whose raw addresses the launches hold (a warm step's): alive while this is
    direct: tuple = ()  # a warm step's launches, fired without `_Launcher` (`_WarmStep.launch_list`)

    @property
    def launch_names(self) -> tuple[str, ...]:
        return tuple(launch.name for launch in self.launches)

    def named(self, name: str) -> Launch:
        """The launch called `name` (the two launches: "stats", "sample"; a one-launch structure: its name)."""
        for launch in self.launches:
            if launch.name == name:
                return launch
        raise ValueError(f"no launch {name!r} in this {self.plan.structure} step; its launches: "
                         f"{list(self.launch_names)}")

    def launch(self, name: str) -> None:
        """Fire the launch called `name` alone."""
        launch = self.named(name)
        launch.launcher(launch.grid, launch.args, launch.meta, self.key)

    def registers(self) -> dict:
        """`_Launcher.registers` of each launch, by name (call after a run)."""
        return {launch.name: launch.launcher.registers(launch.args, launch.meta, self.key) for launch in self.launches}

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.direct and FAST_LAUNCH:  # a warm step's compiled binaries, called straight (no hooks to feed)
            enter_hook, exit_hook = _launch_hooks()
            if enter_hook is None and exit_hook is None:
                device_index, launches = self.direct
                stream = _current_stream(device_index)
                for fire, args in launches:
                    fire(stream, args)
                return self.tokens, self.num_accepted
        for launch in self.launches:
            launch.launcher(launch.grid, launch.args, launch.meta, self.key)
        return self.tokens, self.num_accepted


def _round16(count: int) -> int:
    return (count + 15) // 16 * 16


@dataclass(frozen=True)
class _WorkLayout:
    """Where one step's outputs and work buffers lie in its single allocation, in 4-byte words: the int64
    outputs (tokens, then num_accepted), then the fp32 stats partials (max, sum), the race's scores, the
    accept outcomes, the block pairs, then the int32 part (argmax partials when greedy, the race's indices, spare
    words the ticket falls back to). Every buffer starts 64-byte aligned (what `launch_key` assumes); a buffer a
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
    """The single allocation of a step under `plan` (a pure function of the shape, so cached): the buffers its
    structure asks for (`Structure.work`; `vocab` sizes the block pairs), and the accept outcomes of
    `plan.accept_once`."""
    need = structures.get(plan.structure).work(plan, batch, gamma, greedy, vocab)
    stats = _round16(need.stats) or 16  # a structure without partials keeps them on chip
    race, blocks = _round16(need.race), _round16(need.blocks)
    info = _round16(6 * batch) if plan.accept_once else 0
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


_TARGET, _DRAFT, _TOKENS, _BASE, _ACCEPT, _SAMPLE = range(6)  # what a `_Slot` reads from a warm call


class _Slot(NamedTuple):
    """A launch argument that changes from call to call in a warm step's binding: the call's value `source`
    (the three inputs' addresses, the step's allocation's address, the two stream prefixes or their addresses)
    plus `offset` bytes."""

    source: int
    offset: int = 0


def _fill(launch: Launch, slots: tuple, values: tuple[int, ...]) -> Launch:
    """`launch` with each slot's argument (position, source, offset) set from `values` (indexed by source)."""
    args = list(launch.args)
    for position, source, offset in slots:
        args[position] = values[source] + offset
    return launch._replace(args=tuple(args))


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
    launches: tuple[tuple[Launch, tuple], ...]  # each launch with `_Slot`s, and its slots (position, source, offset)
    binaries: tuple = ()  # each launch's cached (binary, constexprs, device) (`_Launcher.binaries`); () interpreted
    calls: tuple = ()  # each launch as (fire(stream, arguments), arguments with constexprs, slots): `launch`

    @classmethod
    def from_launches(cls, plan: LaunchPlan, key: int, template: tuple[Launch, ...], has_draft: bool, words: int,
                      accepted: int, batch: int, gamma: int) -> "_WarmStep":
        """From a step's launches bound to `_Slot`s (its structure's `bind`, given slots for inputs, outputs, work
        and prefixes), each binary cached under `key`."""
        launches = tuple((launch, tuple((position, arg.source, arg.offset) for position, arg in enumerate(launch.args)
                                        if isinstance(arg, _Slot)))
                         for launch in template)
        binaries = tuple(launch.launcher.binaries.get(key) for launch in template)
        if None in binaries:
            binaries = ()
        calls = tuple((_firing(binary, launch.grid), list(launch.args) + list(constexprs), slots)
                      for (launch, slots), (binary, constexprs, _) in zip(launches, binaries))
        return cls(plan=plan, key=key, has_draft=has_draft, words=words, accepted=accepted, batch=batch, gamma=gamma,
                   launches=launches, binaries=binaries, calls=calls)

    def filled(self, values: tuple[int, ...]) -> tuple[Launch, ...]:
        """Each launch with its slots filled from `values` (indexed by `_Slot.source`)."""
        return tuple(_fill(launch, slots, values) for launch, slots in self.launches)

    def launch_list(self, launches: tuple[Launch, ...]) -> tuple:
        """(device, ((fire, arguments and constexprs), ...)): what `PreparedVerify.run` launches without
        `_Launcher` (`_firing`); () when a binary is not cached."""
        if not self.binaries:
            return ()
        fired = tuple((fire, launch.args + constexprs) for launch, (fire, _, _), (_, constexprs, _)
                      in zip(launches, self.calls, self.binaries))
        return self.binaries[0][2], fired

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
        launches = self.filled((target_address, draft.data_ptr() if self.has_draft else target_address,
                                tokens.data_ptr(), memory.data_ptr(),
                                accept_prefix.data_ptr() if in_memory else accept_prefix,
                                sample_prefix.data_ptr() if in_memory else sample_prefix))
        step = PreparedVerify(plan=self.plan, tokens=memory[:self.batch * (self.gamma + 1)].view(self.batch, -1),
                              num_accepted=memory[self.accepted // 2:self.accepted // 2 + self.batch], key=self.key,
                              launches=launches, direct=self.launch_list(launches))
        # raw addresses do not keep their tensors alive: the step holds them
        step.keep = (target, draft, tokens, memory, accept_prefix, sample_prefix)
        return step


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


def _warm_step(target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor, params: SamplingParams,
               prefixes: torch.Tensor | None, options: tuple) -> _WarmStep | None:
    """The binding an earlier call with the same `_warm_key` left, or None (cold, or a call that cannot reuse one)."""
    warm_key = _warm_key(target, draft, tokens, params, prefixes, options)
    return None if warm_key is None else _WARM_STEPS.get(warm_key)
