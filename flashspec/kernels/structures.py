"""The registry of the verify step's launch structures: which kernels one step launches, and how.

A structure has a name (`LaunchPlan.structure`) and knows the launchers of a plan (`launchers`), how to bind a
step's launches (`bind`: each one's grid, arguments and meta), the work buffers a step needs (`work`), the plan
keys it adds to `plan.GPU_PLAN` (`keys`, with their defaults) and the parameters it adds to a plan (`plan`: a
small frozen object, `LaunchPlan.params`). The library registers the two launches (`two_launch`) and the one
pass of the residual by rejection (`one_pass`); the lab registers its own (`import flashspec_lab.kernels`).

`make_plan` takes the default structure of the residual sampler unless a plan asks for another: by the plan key
of its name set to 1 (`tuning=(("coop", 1),)`, or a `SHAPE_PLANS` entry), or, for the structure `FUSED`, by
`fused=True`. Several asked: the lowest `priority` that can run at the shape (`plan` returns None where it
cannot: greedy, a grid that does not fit, a GPU without the feature), else the default.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, NamedTuple

import triton

from flashspec.sampling import SAMPLE_BLOCK

FUSED = "fused"  # the structure `fused=True` asks for
LAB = "import flashspec_lab.kernels"  # what registers the lab's structures (fused, coop, cluster)


class Launch(NamedTuple):
    """One kernel launch of a bound step: `launcher(grid, args, meta, key)` fires it. `name` tells a step's
    launches apart (the benchmark times the two launches' "stats" and "sample" alone)."""

    name: str
    launcher: Any  # a `launcher._Launcher`
    grid: tuple
    args: tuple
    meta: dict


@dataclass(frozen=True)
class Work:
    """Work buffers one step needs, in 4-byte words (`step._work_layout` rounds and places them): log-sum-exp
    partials (`stats`: each of max and sum; 0: none), the race's chunk winners (`race`: each of value and index)
    and per-block sums (`blocks`: each of max and sum)."""

    stats: int
    race: int = 0
    blocks: int = 0


@dataclass(frozen=True)
class PlanContext:
    """What a structure's `plan` reads: the shape, the merged plan keys (`config`), the caller's forced tile and
    split count, and what `make_plan` chose for the stats pass and the device."""

    batch: int
    gamma: int
    vocab: int
    greedy: bool
    compiled: bool  # a GPU plan (else the interpreter's)
    config: Mapping[str, int]
    block_v: int | None  # the caller's tile, or None
    num_splits: int | None  # the caller's split count, or None
    row_blocks: int
    stats_block_v: int
    stats_tiles: int  # tiles one stats program loops over at most
    target_programs: int  # the grid `make_plan` aims for
    sms: int  # multiprocessors of the GPU (0 interpreted)
    has_clusters: bool  # thread-block clusters run here (always, interpreted: one block)

    def tile(self, key: str, scale: int = 1) -> int:
        """The vocabulary tile of plan key `key` (times `scale`) on a GPU, at most the padded vocabulary; the
        stats tile interpreted; the caller's `block_v` if given."""
        if self.block_v:
            return self.block_v
        if not self.compiled:
            return self.stats_block_v
        return min(int(self.config[key]) * scale, triton.next_power_of_2(self.vocab))

    def sampling_tile(self, name: str, width: int) -> int:
        """`width` as a sampling tile: whole blocks of `SAMPLE_BLOCK` tokens once V > SAMPLE_BLOCK (a table's
        narrower tile is raised to one block; a caller's narrower `block_v` is refused, naming `name`)."""
        if self.greedy or self.vocab <= SAMPLE_BLOCK:
            return width
        return check_sampling_tile(name, width if self.block_v else max(width, SAMPLE_BLOCK), self.vocab)


def check_sampling_tile(name: str, width: int, vocab: int) -> int:
    """`width`, or a ValueError naming `name` where a sampling tile would split a block of `SAMPLE_BLOCK`."""
    if width < SAMPLE_BLOCK:
        raise ValueError(f"{name}={width}: a sampling tile holds whole blocks of {SAMPLE_BLOCK} tokens once "
                         f"V > {SAMPLE_BLOCK} (V = {vocab}); use a power of two >= {SAMPLE_BLOCK}")
    return width


@dataclass(frozen=True, eq=False)
class Structure:
    """One launch structure of the verify step (module docstring)."""

    name: str
    residual: str  # the residual sampler it draws with ("race" or "rejection", as `flashspec.verify`'s)
    launches: int  # kernel launches per step on a GPU
    launchers: Callable[..., tuple]  # (plan) -> its `_Launcher`s, in launch order
    bind: Callable[..., tuple[Launch, ...]]  # (plan, inputs, outputs, work, shape, scale, flags, prefix, device,
    #                                          addresses) -> its launches, bound
    work: Callable[..., Work]  # (plan, batch, gamma, greedy, vocab) -> its work buffers
    plan: Callable[[PlanContext], Hashable | None]  # its `LaunchPlan.params`, or None where it cannot run
    keys: Mapping[str, int] = field(default_factory=dict)  # its plan keys and their defaults
    default: bool = False  # its residual's structure when no other is asked for (else asked by its name's key)
    priority: int = 0  # among several asked, the lowest that can run wins
    fixes: Mapping[str, Any] = field(default_factory=dict)  # shared `LaunchPlan` fields it sets (options it lacks)


_REGISTRY: dict[str, Structure] = {}


def register(structure: Structure) -> Structure:
    """Add `structure` (a structure of the same name is replaced). Its keys must be new, and a structure that is
    not its residual's default is asked for by the key of its own name."""
    if not structure.default and structure.name not in structure.keys:
        raise ValueError(f"structure {structure.name!r}: a structure other than its residual's default is asked for "
                         f"by the plan key of its name; add {structure.name!r} to its keys")
    others = [s for s in _REGISTRY.values() if s.name != structure.name]
    taken = {key for s in others for key in s.keys} & set(structure.keys)
    if taken:
        raise ValueError(f"structure {structure.name!r}: plan keys {sorted(taken)} belong to another structure")
    if structure.default and any(s.default and s.residual == structure.residual for s in others):
        raise ValueError(f"structure {structure.name!r}: residual {structure.residual!r} has a default structure")
    _REGISTRY[structure.name] = structure
    return structure


def get(name: str) -> Structure:
    """The registered structure `name`, or a ValueError naming it and how to register the lab's."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"launch structure {name!r} is not registered (registered: {sorted(_REGISTRY)}); "
                         f"{LAB} registers the lab's structures (fused, coop, cluster)") from None


def names() -> tuple[str, ...]:
    """The registered structures' names."""
    return tuple(sorted(_REGISTRY))


def plan_keys() -> dict[str, int]:
    """Every registered structure's plan keys with their defaults."""
    return {key: value for structure in _REGISTRY.values() for key, value in structure.keys.items()}


def choose(context: PlanContext, residual: str, fused: bool | None) -> tuple[Structure, Hashable]:
    """(structure, its params) of a step (module docstring): `fused` True asks for `FUSED`, False for the
    default; None leaves it to the plan keys in `context.config`."""
    if fused is False:
        asked = []
    else:
        asked = [name for name, structure in _REGISTRY.items() if not structure.default and context.config.get(name)]
        if fused:
            asked.append(FUSED)
    for structure in sorted({name: get(name) for name in asked}.values(), key=lambda s: (s.priority, s.name)):
        if structure.residual == residual:
            params = structure.plan(context)
            if params is not None:
                return structure, params
    default = next((s for s in _REGISTRY.values() if s.default and s.residual == residual), None)
    if default is None:
        raise ValueError(f"no launch structure draws the residual by {residual!r} (registered: {sorted(_REGISTRY)})")
    return default, default.plan(context)
