"""The default launch structure: the stats launch, then the sample launch (`flashspec.kernels.verify`'s docstring).

Its options are plan fields every structure shares (`LaunchPlan.lanes`, `accept_once`, `pdl`, `stats_lane_elems`,
`precise`), since the default plans choose among them per shape; it adds no parameters of its own.
"""
from __future__ import annotations

import torch

from flashspec.kernels.launcher import _COMPILE_OPTIONS, _Launcher, _ticket_counter
from flashspec.kernels.sample_pass import _sample_kernel
from flashspec.kernels.shims import _cdiv, interpreting
from flashspec.kernels.stats_pass import _stats_accept_kernel, _stats_kernel
from flashspec.kernels.structures import Launch, PlanContext, Structure, Work

NAME = "two_launch"
STATS_LAUNCHER = _Launcher(_stats_kernel)
_STATS_ACCEPT_LAUNCHER = _Launcher(_stats_accept_kernel)
SAMPLE_LAUNCHER = _Launcher(_sample_kernel)


def launchers(plan) -> tuple[_Launcher, _Launcher]:
    """The stats launch's launcher (the one that also runs the accept test, `plan.accept_once`), the sample's."""
    return (_STATS_ACCEPT_LAUNCHER if plan.accept_once else STATS_LAUNCHER, SAMPLE_LAUNCHER)


def work(plan, batch: int, gamma: int, greedy: bool, vocab: int) -> Work:
    """Partials of every row at every stats split; chunk winners where the sampling pass splits V."""
    return Work(stats=batch * (2 * gamma + 1) * plan.stats_splits,
                race=batch * 2 * plan.sample_splits if plan.sample_splits > 1 else 0)


def plan(context: PlanContext) -> tuple:
    """No parameters beyond the shared plan fields."""
    return ()


def bind(plan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int], scale: float, flags: dict,
         prefix: tuple, device: torch.device, addresses: bool, accept_test: bool | None = None
         ) -> tuple[Launch, Launch]:
    """The stats launch and the sample launch, bound to fresh work buffers (`work`: views, or, `addresses`, raw
    addresses once the binaries are cached, or a warm step's `_Slot`s). `accept_test` False: the stats launch
    computes partials only even where the sample launch reads a stored outcome (`plan.accept_once`: another
    launch between the two stores it, as block verification's does); None: `plan.accept_once`."""
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
    accept_test = plan.accept_once if accept_test is None else accept_test
    if accept_test:  # the stats launch's last program per row block runs the accept test (same tickets:
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
    stats_launcher = _STATS_ACCEPT_LAUNCHER if accept_test else STATS_LAUNCHER
    return (Launch("stats", stats_launcher, (row_blocks, gamma + 1, plan.stats_splits), stats_args, stats_meta),
            Launch("sample", SAMPLE_LAUNCHER, (row_blocks, plan.sample_splits), sample_args, sample_meta))


STRUCTURE = Structure(name=NAME, residual="race", launches=2, launchers=launchers, bind=bind, work=work, plan=plan,
                      default=True)
