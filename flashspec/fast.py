"""The fast path: the whole speculative step on the device, replayed from CUDA graphs.

`FastSpeculativeDecoder` is `SpeculativeDecoder` for Llama-family models (`flashspec.runner`), with
the host taken off the critical path (the step itself lives in `flashspec.fast_session`):

- Every model (target and model drafts) runs through a `LlamaRunner`: a static KV cache with
  slot == position, so a rejected draft slot needs no rollback -- the next step writes it again.
  A `FeatureDraft` runs through a `FeatureRunner`, which reads the hidden states the target's runner
  writes at the same positions (`flashspec.features`).
- One step is pure device work on preallocated buffers: the chosen draft re-reads the last γ+1
  tokens (a "window" forward; a draft chosen after steps away first catches up over the older
  tokens it missed, in one forward captured as its own small graph), samples γ tokens, the target scores them
  in one (γ+1)-token forward, `verify` accepts and samples, and the commit appends each row's tokens, cut by its
  budget and EOS. With `draft_sync="all"` every model draft re-reads the last γ+1 tokens every step instead, so
  no draft ever lags (a switch is free, every step pays for every draft). The step's key comes from a
  step counter in a device buffer (`rng.step_key`), advanced inside the step, so a replay draws
  fresh uniforms.
- `compile=True` compiles each model's decode and verify forwards with torch.compile before the graphs
  are captured: by default the whole forward as one graph with fused projections (`compile_scope="forward"`),
  or each layer's dense regions (`"regions"`, quicker to compile); see `runner.LlamaRunner`.
- On CUDA, each (arm, attention bucket) step is captured once as a CUDA graph and replayed, and so is
  each prefilled runner's prefill per (batch, width bucket) (`runner.LlamaRunner.prefill(graphed=True)`;
  under lazy sync only the target is prefilled).
- Adaptive γ (`gammas=`): the arms are (draft, γ) pairs. Each arm's step graph has its own query
  lengths (the draft's γ+1 window, the target's γ+1 verify); the buffers are sized by the largest
  γ, the commit always takes that width (shorter arms pad with -1, never emitted), and a lazy draft
  shared by several arms catches up over the tokens appended since it last ran, bounded by the γ+1
  of every step since (`catch_up_tokens`), which the host knows without reading the device. γ = 0 adds the
  plain arm: its step (a graph of its own per bucket) is one target forward and one token sampled from it, 1 token
  appended per row; `FastPlainDecoder` is that arm alone.
- The host only picks the arm and launches. It reads step t's outcome (accepted counts, finished
  rows, and a flag for non-finite logits) through a pinned-memory copy and an event `lag` steps later, so the
  GPU always has queued work. The policy therefore sees step t only from step t + lag on: the choice at every
  step is a function of the past, which is all Theorem 1 asks, so the output stays exactly the target's. A step
  whose logits held NaN or +inf raises FloatingPointError when the host reads it, as the eager engine does.

Randomness: the key schedule of `flashspec.front` (the eager engine's too), so with the same arm choices a seed
gives the eager engine's tokens. Greedy output equals the target's greedy decoding.
"""
from __future__ import annotations

import collections
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from flashspec import models, runner
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder
from flashspec.fast_session import Session, session_capacity
from flashspec.features import FeatureDraft
from flashspec.front import Front, GenerationResult, Request, StepEvent, position_limit
from flashspec.stats import GenerationStats

DRAFT_SYNC_MODES = ("lazy", "all")
ENGINES = ("auto", "fast", "eager")
# The options only the fast engine takes, with their defaults (`make_decoder` refuses them for the eager one).
FAST_OPTIONS = {"graphs": None, "lag": 2, "draft_sync": "lazy", "compile": False, "compile_scope": "forward",
                "sessions": 1,
                "tp": None}


class FastSpeculativeDecoder(Front):
    """Exact speculative decoding with static caches and CUDA graphs (see the module docstring).

    Requests share a session (static caches, buffers, captured graphs) when their batch, sampling, stop
    tokens and cache size match; the cache size is prompt + max_new_tokens rounded up onto the attention
    buckets' grid (`fast_session.session_capacity`), so requests of similar lengths reuse one session. The
    decoder keeps the `sessions` most recently used ones.

    Args:
        target: a Llama-family HF causal LM (`flashspec.runner.supports`).
        drafts: Llama-family HF causal LMs sharing the target's tokenizer, `flashspec.features.FeatureDraft`
            drafts (fed the target's hidden states, which the target's runner then writes at every position;
            all of them must read the same states) and/or `PromptLookupDrafter` objects.
        policy, policy_kwargs: as for `SpeculativeDecoder`.
        gamma: drafted tokens per step (fixed: it is part of the captured graphs).
        gammas, arm_costs: as for `SpeculativeDecoder`: arms are (draft, γ) pairs learning from the
            throughput reward. Measured costs are a running median of each arm's step
            time as the host already reads it, `lag` steps late: on CUDA the device time between
            consecutive step ends (the recorded events; no extra sync), on a CPU the step's own
            (synchronous) launch time; a step that captured a graph is not timed (capture is not
            its cost). The choice of step t still uses only steps <= t - lag: Theorem 1 holds.
        graphs: capture CUDA graphs of the steps and of each runner's prefill per width bucket (default: when
            the target is on CUDA).
        lag: steps between a step's launch and the host reading its outcome (>= 1).
        backend: verify backend on CUDA, "triton" (default when available) or "torch".
        verify_method: as for `SpeculativeDecoder`: "token" (default) or "block" (block verification).
        draft_sync: "lazy" (only the chosen draft runs; a draft chosen after k steps away catches
            up over the at most k·(γ+1) tokens it missed in one forward, and a model draft is not
            prefilled: its first step of a request catches up over the whole context) or "all" (every
            model draft is prefilled and re-reads the last γ+1 tokens every step).
        compile: torch.compile the models' forwards and the step's small pieces (True, or a mode
            in `runner.COMPILE_MODES`); costs seconds to minutes per new shape, once per process.
        compile_scope: what `compile` compiles, one of `runner.COMPILE_SCOPES`: "forward" (default: each
            model's whole decode/verify forward as one graph, q/k/v and gate/up fused, attention over the
            whole cache) or "regions" (per-layer dense regions). A sharded target compiles regions.
        sessions: how many sessions to keep (default 1), the least recently used dropped first: a stream whose
            requests fall into a few cache sizes (prompts of different lengths) then replays each size's graphs
            instead of capturing them again at every change of size; each one kept holds its own static caches.
        tp: a `flashspec.tp.TensorParallel` when the target is sharded over its ranks
            (`flashspec.tp.shard_target`); every rank then runs the same `generate`, and the ranks
            check on the host that they got the same request and emit the same tokens (`tp.guard_*`).
            None (default): one process, nothing changes.

    `graphs_captured` counts the CUDA graphs captured so far, in every session: the difference over a
    timed run says how many captures that timing includes (0 without graphs).
    """

    def __init__(self, target: torch.nn.Module, drafts: Sequence[Any], policy: Any = "thompson", gamma: int = 4,
                 policy_kwargs: dict[str, Any] | None = None, graphs: bool | None = None, lag: int = 2,
                 backend: str = "auto", draft_sync: str = "lazy", compile: bool | str = False, *,
                 tp: Any = None, gammas: Sequence[int] | None = None, arm_costs: Sequence[float] | None = None,
                 compile_scope: str = "forward", verify_method: str = "token", sessions: int = 1,
                 _plain: bool = False, _paths: bool = False) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
            raise ValueError(f"lag must be an int >= 1 (steps before the host reads an outcome), got {lag!r}")
        if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
            raise ValueError(f"sessions must be an int >= 1 (cache sizes kept with their graphs), got {sessions!r}")
        if graphs is not None and not isinstance(graphs, bool):
            raise ValueError(f"graphs must be True, False or None (None: on CUDA), got {graphs!r}")
        if draft_sync not in DRAFT_SYNC_MODES:
            raise ValueError(f"draft_sync must be one of {DRAFT_SYNC_MODES}, got {draft_sync!r}")
        if not isinstance(compile, bool) and compile not in runner.COMPILE_MODES:
            raise ValueError(f"compile must be True, False or one of {runner.COMPILE_MODES}, got {compile!r}")
        if compile_scope not in runner.COMPILE_SCOPES:
            raise ValueError(f"compile_scope must be one of {runner.COMPILE_SCOPES}, got {compile_scope!r}")
        if isinstance(target, torch.nn.Module) and hasattr(target, "config"):
            runner.check_supported(target)
        sharded_over = int(getattr(target, "flashspec_tp_size", 1))
        if (tp.size if tp is not None else 1) != sharded_over:
            raise ValueError(f"the target is sharded over {sharded_over} rank(s) but tp is "
                             f"{'None' if tp is None else f'a group of {tp.size}'}: pass the TensorParallel the "
                             "target was sharded with (flashspec.tp.shard_target(target, tp))")
        self.tp = tp
        self.lag = lag
        self.graphs = graphs
        self.draft_sync = draft_sync
        self.compile = compile
        self.compile_scope = "regions" if sharded_over > 1 else compile_scope  # collectives stay outside a graph
        super().__init__(target, drafts, policy, gamma, policy_kwargs, backend, gammas, arm_costs, plain=_plain,
                         verify_method=verify_method)
        read = {draft.feature_layers for draft in self.drafts if isinstance(draft, FeatureDraft)}
        if len(read) > 1:
            raise ValueError(f"every FeatureDraft of one decoder must read the same target states, got {sorted(read)}")
        if read and tp is not None:
            raise ValueError("FeatureDraft drafts read the target's hidden states, which a sharded target does not "
                             "hand over: run them without tp")
        self.state_layers: tuple[int, ...] = next(iter(read), ())  # what the target's runner writes for them
        self.sessions = sessions
        self.paths = _paths  # every model draft's chain verified together each step (`FastPathsDecoder`)
        self._sessions: collections.OrderedDict[tuple, Session] = collections.OrderedDict()  # oldest use first
        self.graphs_captured = 0  # over every session: a new session captures its graphs again

    def reach(self) -> int:
        """Cache slots a step writes past the pending token's: the largest γ, or every path's under `paths`."""
        return len(self.drafts) * self.gamma if self.paths else self.max_gamma

    def _accept_drafts(self, drafts: list[Any]) -> list[Any]:
        for index, draft in enumerate(drafts):
            if isinstance(draft, PromptLookupDrafter):
                continue
            if not isinstance(draft, torch.nn.Module):
                raise ValueError(f"drafts[{index}] must be a Llama-family HF model, a FeatureDraft or a "
                                 f"PromptLookupDrafter, got {type(draft).__name__} (the eager SpeculativeDecoder "
                                 "takes any Drafter)")
            reason = unsupported_draft(draft)
            if reason is not None:
                raise ValueError(f"drafts[{index}] cannot run on the fast path: {reason}")
            models.check_compatible(self.target, draft, draft_name=f"drafts[{index}]")
        return drafts

    def close(self) -> None:
        """Free the session: its CUDA graphs, static KV caches and host buffers (the next `generate`
        builds them again). Under tensor parallelism, do this before `destroy_process_group`: graphs
        that captured NCCL collectives keep the communicator alive (`flashspec.tp.shutdown`). Every session kept
        goes."""
        while self._sessions:
            self._sessions.popitem(last=False)[1].close()

    @property
    def _session(self) -> Session | None:
        """The session of the last `generate` (None before the first)."""
        return next(reversed(self._sessions.values()), None)

    def capture_graphs(self, lengths: Sequence[int]) -> int:
        """Capture ahead of time, in every session kept (those of the last `sessions` cache sizes; lengths past a
        session's capacity are capped at it), every graph a step can replay while
        its longest row holds one of `lengths` tokens: each arm's step at that length's attention bucket and,
        for a model draft under lazy sync, its catch-up at every length the step loop can ask for there
        (`catch_up_tokens`: powers of two, capped at the bucket), and the prefill of a prompt whose width
        falls in one of those buckets of each runner a prefill fills (the target's; the drafts' under
        `draft_sync="all"`). A timed stream served afterwards in that session captures
        nothing, whichever arms its policy picks and whatever its prompts' widths below the largest length.
        Nothing is committed: the captures run frozen, at a fill that fits each bucket, and the buffers are
        put back. Returns the graphs captured (0 without graphs)."""
        if not self._sessions:
            raise ValueError("capture_graphs needs a session: call generate once first (it fixes the shapes)")
        if isinstance(lengths, (str, bytes)) or not all(isinstance(n, int) and n > 0 for n in lengths):
            raise ValueError(f"lengths must be positive ints (tokens in the longest row), got {lengths!r}")
        lengths = list(lengths)
        captured = sum(session.capture_all(lengths) for session in self._sessions.values())
        self.graphs_captured += captured
        return captured

    def _decode(self, request: Request, stats: GenerationStats, on_step: Callable[[StepEvent], None] | None,
                timing: bool) -> GenerationResult:
        batch, width, budgets = request.batch, request.width, request.budgets
        limit, _ = position_limit(self.target, self.drafts)
        capacity = session_capacity(width + max(budgets), self.reach() + 1, limit)
        if self.tp is not None:  # every rank must decode the same request (one small host all_gather)
            self.tp.guard_request(request.input_ids, request.mask,
                                  (request.seed, budgets, request.sampling, sorted(request.stop_ids), request.pad_id,
                                   self.gamma, self.gammas, self.lag, self.draft_sync, type(self.policy).__name__))
        device = self.device
        use_graphs = device.type == "cuda" if self.graphs is None else self.graphs
        if use_graphs and device.type != "cuda":
            raise ValueError("graphs=True needs the target on a CUDA device")
        key = (batch, capacity, request.sampling, tuple(sorted(request.stop_ids)), use_graphs, self.draft_sync,
               self.compile, self.compile_scope)
        session = self._sessions.get(key)
        if session is None:
            while len(self._sessions) >= self.sessions:  # the least recently used goes before the new one allocates
                self._sessions.popitem(last=False)[1].close()
            session = self._sessions[key] = Session(self, key, batch, capacity, request.sampling,
                                                    set(request.stop_ids), use_graphs)
        self._sessions.move_to_end(key)
        stats.synchronized_timing = device.type == "cuda"
        start = time.perf_counter()
        lengths = session.prefill(request.tokens.to(device), request.mask.to(device), budgets, request.seed,
                                  request.pad_id)
        stats.prefill_s = time.perf_counter() - start
        self.graphs_captured += session.prefill_captures
        num_generated = session.run(self, budgets, lengths, stats, on_step)
        stats.total_s = time.perf_counter() - start
        stats.generated_tokens = sum(num_generated)
        sequences = session.output(request.input_ids, request.mask, max(num_generated), request.pad_id)
        return GenerationResult(sequences=sequences, num_generated=torch.tensor(num_generated, dtype=torch.long),
                                stats=stats)


class FastPlainDecoder(FastSpeculativeDecoder):
    """Plain autoregressive decoding on the same runner, step graphs and host loop: one target
    forward and one on-device sample per token. The baseline a fast engine must beat (as gpt-fast)."""

    def __init__(self, target: torch.nn.Module, graphs: bool | None = None, lag: int = 2,
                 compile: bool | str = False, *, tp: Any = None, compile_scope: str = "forward",
                 sessions: int = 1) -> None:
        super().__init__(target, [], policy="fixed", gamma=1, graphs=graphs, lag=lag, compile=compile, tp=tp,
                         compile_scope=compile_scope, sessions=sessions, _plain=True)


class FastPathsDecoder(FastSpeculativeDecoder):
    """Every draft drafts a chain of γ tokens each step and the target scores them all in one forward over
    the tree they form under the pending token (`runner.TokenTree.chains`: one chain per draft,
    `LlamaRunner.tree_forward`); `flashspec.paths` verifies the chains together (exact: chapter 8) and the kept
    path's keys and values are moved to the slots of their positions (`LlamaRunner.keep_path`). There is no arm
    to choose: the drafts re-read their window every step (`draft_sync="all"`). Each step writes 1 + K·γ target
    slots (K drafts), which the sessions' cache sizes leave room for. The verification is one Triton launch
    (`flashspec.kernels.paths`) where `backend` verifies with Triton, else PyTorch; neither syncs with the host,
    so the step is captured like the others, and a seed gives both backends' tokens.

    Args:
        target, graphs, lag, compile, compile_scope, sessions, backend: as for `FastSpeculativeDecoder`.
        drafts: one or more Llama-family HF causal LMs sharing the target's tokenizer, `FeatureDraft`s (the
            tree forward writes every node's target states and `keep_path` moves the kept path's into place, so
            a feature draft reads what a chain forward would have left) and/or `PromptLookupDrafter` objects
            (whose fixed proposals are verified with q one-hot at them).
        gamma: tokens each draft drafts per step.
    """

    def __init__(self, target: torch.nn.Module, drafts: Sequence[torch.nn.Module], gamma: int = 4,
                 graphs: bool | None = None, lag: int = 2, compile: bool | str = False, *,
                 compile_scope: str = "forward", sessions: int = 1, backend: str = "auto") -> None:
        drafts = list(drafts)
        if not drafts:
            raise ValueError("FastPathsDecoder needs at least one draft model (use FastPlainDecoder for none)")
        for index, draft in enumerate(drafts):
            if not isinstance(draft, (torch.nn.Module, PromptLookupDrafter)):
                raise ValueError(f"drafts[{index}] must be a Llama-family HF model, a FeatureDraft or a "
                                 f"PromptLookupDrafter for FastPathsDecoder, got {type(draft).__name__}")
        super().__init__(target, drafts, policy="fixed", gamma=gamma, graphs=graphs, lag=lag, draft_sync="all",
                         backend=backend, compile=compile, compile_scope=compile_scope, sessions=sessions,
                         _paths=True)


def unsupported_draft(draft: torch.nn.Module) -> str | None:
    """`runner.unsupported_reason` of the model a draft's runner runs (a FeatureDraft's decoder body)."""
    return runner.unsupported_reason(draft.body if isinstance(draft, FeatureDraft) else draft)


def fast_supported(target: torch.nn.Module, drafts: Sequence[Any]) -> str | None:
    """Why the fast path cannot run this pool (None when it can)."""
    reason = runner.unsupported_reason(target)
    if reason is not None:
        return f"target: {reason}"
    for index, draft in enumerate(drafts):
        if isinstance(draft, PromptLookupDrafter):
            continue
        if not isinstance(draft, torch.nn.Module):
            return f"drafts[{index}] is a custom Drafter"
        reason = unsupported_draft(draft)
        if reason is not None:
            return f"drafts[{index}]: {reason}"
    return None


_WARNED: set[str] = set()


def choose_engine(target: torch.nn.Module, drafts: Sequence[Any], engine: str = "auto", tp: Any = None) -> str:
    """"fast" or "eager" for this pool: "fast" and "eager" as asked (ValueError when the fast path cannot run the
    models, or the eager one cannot: a feature draft, or `tp`); "auto" takes the fast path where it pays and can
    run -- on a CUDA device, or wherever a draft needs the target's hidden states, or under `tp` -- else eager."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    reason = fast_supported(target, drafts)
    reads_states = any(isinstance(draft, FeatureDraft) for draft in drafts)  # only the fast path feeds them
    if engine == "eager" and reads_states:
        raise ValueError("the eager engine cannot run a feature draft (it reads the target's hidden states, which "
                         "only the fast path hands over); use engine='fast' or 'auto'")
    if engine == "eager" and tp is not None:
        raise ValueError("tp (tensor parallelism) runs on the fast path only; use engine='fast' or 'auto'")
    if engine == "fast" or tp is not None or reads_states:
        if reason is not None:
            need = "tp (tensor parallelism) needs" if tp is not None else "engine='fast' needs"
            raise ValueError(f"{need} the fast path, which cannot run these models ({reason}); "
                             "use drafts and a target it supports, or the eager engine")
        return "fast"
    if engine == "eager":
        return "eager"
    on_cuda = next(target.parameters()).device.type == "cuda"
    if on_cuda and reason is not None and reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"flashspec: fast path unavailable ({reason}); using the eager engine", stacklevel=3)
    return "fast" if on_cuda and reason is None else "eager"


def make_decoder(target: torch.nn.Module, drafts: Sequence[Any], fast: bool | str = "auto", *,
                 engine: str | None = None, **options: Any) -> Front:
    """The decoder for this pool: a `FastSpeculativeDecoder` or the eager `SpeculativeDecoder`, chosen by
    `choose_engine` (the CLI's `--engine` calls this too). `engine` ("auto", "fast", "eager") or, as before,
    `fast` (True = "fast", False = "eager", "auto"). `options` go to the decoder; the fast-only ones (`graphs`,
    `lag`, `draft_sync`, `compile`, `compile_scope`, `sessions`, `tp`) are refused for the eager engine unless left
    at their defaults."""
    if engine is None:
        if fast not in (True, False, "auto"):
            raise ValueError(f"fast must be True, False or 'auto', got {fast!r}")
        engine = {True: "fast", False: "eager"}.get(fast, "auto")
    chosen = choose_engine(target, drafts, engine, options.get("tp"))
    if chosen == "fast":
        return FastSpeculativeDecoder(target, drafts, **options)
    set_fast = sorted(name for name, default in FAST_OPTIONS.items()
                      if name in options and options[name] is not default and options[name] != default)
    if set_fast:
        raise ValueError(f"{', '.join(set_fast)} apply to the fast path only, and the eager engine runs here "
                         f"(engine={engine!r}); drop them or use engine='fast' with models it supports")
    eager = {name: value for name, value in options.items() if name not in FAST_OPTIONS}
    return SpeculativeDecoder(target, drafts, **eager)
