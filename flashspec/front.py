"""The request front both engines share: arguments checked once where they enter, the arms and their names, the
policy's select/update loop, and one key schedule.

`SpeculativeDecoder` (the eager engine, `flashspec.engine`) and `FastSpeculativeDecoder` (static caches and CUDA
graphs, `flashspec.fast`) differ only in how they run a step. Everything in front of the step is here, in
`Front`: the constructor checks γ (`check_gamma`), the γ values of adaptive arms (`check_gammas`), the verify
backend and method (`check_verify_method`) and the policy (with its `policy_kwargs`); `Front.generate` checks the request (prompt, mask, budgets,
sampling, seed, stop and pad ids, every model's positions) into a `Request`, starts the policy for the request,
and hands the request to the engine's `_decode`.

One key schedule: step t of a run with seed s draws every uniform from the key `rng.step_key(Key(s), t)` — the
verifier on its accept and sample streams, draft d on its own stream `rng.draft_stream(d)`, a plain step (the arm
`PLAIN` that `gammas` holding 0 adds) its one token on the sample stream at position 0. Both engines compute
that key (the fast one on the device, from a step counter its graphs advance), so with the same arm choices the
same seed gives the same tokens in either engine (up to the rounding of their two forward implementations, which
can flip a near-tie). They may choose other arms, and so emit other tokens, when the policy learns from the steps:
the fast engine's host reads a step's outcome `lag` steps late, and measured step costs (adaptive γ) differ between
engines. Near a model's last position the eager engine drafts fewer tokens (a model with learned positions has none
past its last), where the fast engine's RoPE models draft the full γ.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flashspec import models, rng
from flashspec.checks import check_budgets, check_prompt, check_token_ids, resolve_pad
from flashspec.rewards import StepCosts
from flashspec.sampling import METHODS, SamplingParams
from flashspec.stats import GenerationStats

# A step drafts at most this many tokens. Acceptance decays geometrically with the position, so a longer
# speculation only allocates memory; the bound stops absurd values before they allocate.
MAX_GAMMA = 256
BACKENDS = ("auto", "torch", "triton")
POLICY_SEED_TAG = 0x9011C7  # the policy's generator restarts from derive_seed(seed, POLICY_SEED_TAG) per request


def check_gamma(gamma: Any, name: str = "gamma") -> int:
    """`gamma` (drafted tokens per step) as validated: an int in [1, MAX_GAMMA]."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        raise ValueError(f"{name} must be an int in [1, {MAX_GAMMA}] (drafted tokens per step; 2-8 is typical), "
                         f"got {gamma!r}")
    return gamma


def check_gammas(gammas: Any, name: str = "gammas") -> tuple[int, ...] | None:
    """`gammas` as validated: None, or distinct ints in [0, MAX_GAMMA] (the γ values arms may use), at least one
    of them >= 1. γ = 0 adds the plain-decoding arm (`PLAIN`, named `PLAIN_ARM`: the target alone, one token per step)."""
    if gammas is None:
        return None
    if isinstance(gammas, (str, bytes, int)) or not isinstance(gammas, Sequence) or len(gammas) == 0:
        raise ValueError(f"{name} must be None or a non-empty list of ints, e.g. [2, 4, 8], got {gammas!r}")
    for value in gammas:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GAMMA:
            raise ValueError(f"{name} must hold ints in [0, {MAX_GAMMA}] (drafted tokens per step; 0 adds the "
                             f"plain-decoding arm), got {value!r} in {list(gammas)!r}")
    if len(set(gammas)) != len(gammas):
        raise ValueError(f"{name} must not repeat a value (each γ is one arm per draft), got {list(gammas)!r}; "
                         "drop the duplicates")
    if max(gammas) == 0:
        raise ValueError(f"{name} must hold a γ >= 1 beside 0, e.g. [0, 2, 4], got {list(gammas)!r}: 0 alone is "
                         "plain decoding, which runs no draft (use flashspec.FastPlainDecoder for that)")
    return tuple(gammas)


def check_sampling(sampling: Any) -> SamplingParams:
    """`sampling` as given, or the default `SamplingParams()` for None."""
    if sampling is None:
        return SamplingParams()
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be a flashspec.SamplingParams, got {type(sampling).__name__}")
    return sampling


def check_verify_method(method: Any) -> str:
    """`verify_method` as validated: one of `flashspec.sampling.METHODS` (how `flashspec.verify` judges a chain)."""
    if method not in METHODS:
        raise ValueError(f"verify_method must be one of {METHODS} ('token': each draft up to the first rejection; "
                         f"'block': the chain as a whole, never fewer accepted tokens), got {method!r}")
    return method


def check_backend(backend: Any) -> str:
    """`backend` of `flashspec.verify` as validated: "auto", "torch" or "triton"."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} (the verify backend; 'auto' = Triton on CUDA), "
                         f"got {backend!r}")
    return backend


@dataclass(frozen=True)
class Request:
    """One `generate` call as checked: prompts left-padded (`input_ids` [B, P] long, as given; `tokens` the same
    with masked positions set to `pad_id`, which is what the models embed), `mask` [B, P] bool, per-row token
    `budgets`, `sampling`, `seed`, `stop_ids` (empty with ignore_eos) and the `pad_id` written after a row ends."""

    input_ids: torch.Tensor
    tokens: torch.Tensor
    mask: torch.Tensor
    budgets: list[int]
    sampling: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    pad_id: int

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]


@dataclass(frozen=True)
class StepEvent:
    """Passed to `on_step` after each step: the tokens each row appended (host lists, pad after EOS)."""

    step: int
    arm: int
    new_tokens: list[list[int]]
    num_generated: list[int]
    gamma: int | None = None  # the step's drafted tokens per row


@dataclass
class GenerationResult:
    """sequences: [B, prompt + generated], right-padded with the pad id after each row's end;
    num_generated: [B] tokens generated per row (EOS included); stats: GenerationStats."""

    sequences: torch.Tensor
    num_generated: torch.Tensor
    stats: GenerationStats


PLAIN = (-1, 0)  # the plain-decoding arm: no draft (index -1), γ = 0; one target forward, one token per step
PLAIN_ARM = "plain"  # its name beside drafts (every draft arm's name carries "@γ=", so it never collides)


def make_arms(n_drafts: int, gamma: int, gammas: tuple[int, ...] | None) -> list[tuple[int, int]]:
    """The arms as (draft index, γ): one per draft at `gamma`, or every draft × every γ >= 1 of `gammas`
    (draft-major: arm = draft · (number of γ >= 1) + position of γ among them), then, when `gammas` holds 0,
    the plain arm `PLAIN` last, so adding it renumbers no draft arm."""
    if gammas is None:
        return [(draft, gamma) for draft in range(n_drafts)]
    arms = [(draft, value) for draft in range(n_drafts) for value in gammas if value > 0]
    return arms + [PLAIN] if 0 in gammas and n_drafts else arms


def draft_name(draft: Any, index: int) -> str:
    """A draft's display name: a drafter's own `name`, else "draft<index>:<checkpoint folder>" for a model."""
    name = getattr(draft, "name", None)
    if isinstance(name, str) and name:
        return name
    config = getattr(draft, "config", None)
    path = str(getattr(config, "_name_or_path", "") or "").rstrip("/")
    return f"draft{index}:{path.rsplit('/', 1)[-1]}" if path else f"draft{index}"


def unique_names(names: Sequence[str]) -> list[str]:
    """`names` with repeats told apart by their position ("prompt-lookup", "prompt-lookup#2"): arm statistics are
    keyed by name, so two drafts sharing one (two prompt-lookup drafters) must not share an entry."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out if len(set(out)) == len(out) else [f"{name}[{index}]" for index, name in enumerate(names)]


# The config fields a draft's step cost depends on besides its parameter count, dtype and device.
COST_CONFIG_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                      "num_key_value_heads")


def cost_signature(draft: Any) -> Hashable:
    """What a draft's step cost depends on: equal signatures mean the same compute per step.

    A torch module (or a drafter holding one as `.model`, like `ModelDrafter`): its class name, parameter
    count, the dtype and device of its first parameter and the shape fields of its `config` (None where
    absent); a wrapper's class name is added, since another drafter may run the same model differently.
    Anything else (a `PromptLookupDrafter`, an unknown drafter) shares with nothing: ("object", id(draft)).
    """
    model = draft if isinstance(draft, torch.nn.Module) else getattr(draft, "model", None)
    if not isinstance(model, torch.nn.Module):
        return ("object", id(draft))
    first = next(model.parameters(), None)
    config = getattr(model, "config", None)
    shape = tuple(_hashable(getattr(config, field, None)) for field in COST_CONFIG_FIELDS)
    kind = type(model).__name__ if draft is model else f"{type(draft).__name__}({type(model).__name__})"
    return (kind, sum(parameter.numel() for parameter in model.parameters()),
            None if first is None else str(first.dtype), None if first is None else str(first.device), shape)


def _hashable(value: Any) -> Hashable:
    """A config value as a hashable (a list, e.g. per-layer sizes, becomes a tuple)."""
    return tuple(value) if isinstance(value, list) else value


def arm_cost_groups(arms: list[tuple[int, int]], drafts: Sequence[Any]) -> list[Hashable]:
    """Each arm's cost group for `StepCosts(groups=...)`: (its draft's `cost_signature`, γ), so arms whose
    drafts run the same compute at the same γ share their measured costs. An arm without a draft (plain
    decoding's draft index -1) is a group of its own."""
    return [(cost_signature(drafts[draft]), gamma) if 0 <= draft < len(drafts) else ("arm", arm)
            for arm, (draft, gamma) in enumerate(arms)]


def resolve_policy(policy: Any, n_arms: int, policy_kwargs: dict[str, Any] | None = None) -> Any:
    """A policy object from a name (`flashspec.bandits.make_policy`, given `policy_kwargs`) or an object with
    select/update (then `policy_kwargs` must be empty)."""
    if policy_kwargs is not None and not isinstance(policy_kwargs, dict):
        raise ValueError(f"policy_kwargs must be a dict of the policy's options or None, got "
                         f"{type(policy_kwargs).__name__}")
    if isinstance(policy, str):
        from flashspec import bandits

        policy = bandits.make_policy(policy, n_arms, **(policy_kwargs or {}))
    elif policy_kwargs:
        raise ValueError(f"policy_kwargs {sorted(policy_kwargs)} configure a policy built by name; the policy "
                         f"object {type(policy).__name__} is built already: drop policy_kwargs")
    if getattr(policy, "needs_true_values", False):
        raise ValueError(
            f"policy {getattr(policy, 'name', policy)!r} reads the true per-arm values (simulation only); "
            "pick a learning policy such as 'thompson'"
        )
    if all(callable(getattr(policy, method, None)) for method in ("select", "update")):
        return policy
    raise ValueError(
        f"policy must be a policy name (e.g. 'thompson') or an object with select()/update(arm, reward), "
        f"got {type(policy).__name__}"
    )


def start_request(policy: Any, seed: int, arms: list[tuple[int, int]], step_costs: StepCosts | None) -> None:
    """What a policy hears at the start of a `generate`: its seed (derived from the run's), a request
    boundary (policies may re-prior, `request_decay`), and -- for policies that model the arms, such as
    `GammaThompsonSampling` -- the (draft, γ) arms and where their step costs are kept."""
    reseed = getattr(policy, "reseed", None)
    if callable(reseed):
        reseed(rng.derive_seed(seed, POLICY_SEED_TAG))
    on_request_start = getattr(policy, "on_request_start", None)
    if callable(on_request_start):
        on_request_start()
    bind_arms = getattr(policy, "bind_arms", None)
    if callable(bind_arms):
        bind_arms(arms, step_costs)


def update_policy(policy: Any, arm: int, num_accepted: list[int], gamma: int,
                  step_costs: StepCosts | None = None) -> None:
    """Reward from one step's acceptances (the past of every later step). With `step_costs` (arms
    of their own γ): the throughput reward, skipped while the arm has no cost yet, unless the policy
    `learns_from_steps` (it reads the costs itself). Otherwise policies with `update_step` (Thompson
    sampling) get the geometric conjugate update per row; others the mean acceptance fraction in [0, 1].
    A plain step (γ = 0) drafted nothing: its throughput reward counts its one token per row, a policy that
    learns from steps gets it with γ = 0 (`GammaThompsonSampling` counts no acceptance from it), and no other
    policy hears of it without step costs (it has no acceptance to learn from). A policy with `update_shared_step`
    (`GammaThompsonSampling`, whose budget counts steps, not rows) gets the rows' counts in one call, every step,
    rows finished or not."""
    shared = getattr(policy, "update_shared_step", None)
    if callable(shared):
        shared(arm, num_accepted, gamma)
        return
    learns_from_steps = getattr(policy, "learns_from_steps", False)
    if not num_accepted or (gamma == 0 and step_costs is None and not learns_from_steps):
        return
    if step_costs is not None and not learns_from_steps:
        reward = step_costs.reward(arm, num_accepted, gamma)
        if reward is not None:
            policy.update(arm, reward)
        return
    update_step = getattr(policy, "update_step", None)
    if callable(update_step):
        for accepted in num_accepted:
            update_step(arm, accepted, gamma)
    elif gamma > 0:
        policy.update(arm, sum(num_accepted) / (gamma * len(num_accepted)))


def position_limit(target: torch.nn.Module, drafts: Sequence[Any]) -> tuple[int | None, str]:
    """The fewest positions any model holds (the target or a model draft) and which model that is
    ((None, "") when no model says)."""
    limits = [(models.max_positions_of(target), "target")]
    for index, draft in enumerate(drafts):
        model = draft if isinstance(draft, torch.nn.Module) else getattr(draft, "model", None)
        if isinstance(model, torch.nn.Module) and getattr(model, "config", None) is not None:
            limits.append((models.max_positions_of(model), f"drafts[{index}]"))
    known = [(limit, name) for limit, name in limits if limit is not None]
    return min(known, key=lambda pair: pair[0]) if known else (None, "")


class Front(abc.ABC):
    """What both decoders share: the constructor's checks, the arms and their names, the policy, and `generate`
    up to the engine's own step loop (`_decode`). Subclasses set `self.drafts` (through `_accept_drafts`)."""

    def __init__(self, target: torch.nn.Module, drafts: Sequence[Any], policy: Any = "thompson", gamma: int = 4,
                 policy_kwargs: dict[str, Any] | None = None, backend: str = "auto",
                 gammas: Sequence[int] | None = None, arm_costs: Sequence[float] | None = None,
                 plain: bool = False, verify_method: str = "token") -> None:
        self.gamma = check_gamma(gamma)
        self.gammas = check_gammas(gammas)
        self.backend = check_backend(backend)
        self.verify_method = check_verify_method(verify_method)
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise ValueError(f"target must be a Hugging Face causal LM, got {type(target).__name__}")
        if isinstance(drafts, (torch.nn.Module, str)) or not isinstance(drafts, Sequence) or (
                len(drafts) == 0 and not plain):
            raise ValueError("drafts must be a non-empty list of draft models and/or Drafter objects "
                             "(e.g. [flashspec.PromptLookupDrafter()])")
        self.target = target
        self.drafts: list[Any] = self._accept_drafts(list(drafts))
        # (draft index, γ) per arm; plain decoding has one arm, the target alone (`PLAIN`)
        self.arms = make_arms(len(self.drafts), self.gamma, self.gammas) or [PLAIN]
        self.max_gamma = max(arm_gamma for _, arm_gamma in self.arms)
        # arms whose drafts run the same compute at the same γ share measured step costs; kept so a caller can
        # start a fresh StepCosts(len(arms), groups=decoder.cost_groups)
        self.cost_groups = arm_cost_groups(self.arms, self.drafts)
        if self.gammas is None and arm_costs is not None:
            raise ValueError("arm_costs sets the cost of each (draft, γ) arm: pass gammas=[...] with it")
        self.step_costs = (None if self.gammas is None
                           else StepCosts(len(self.arms), fixed=arm_costs, groups=self.cost_groups))
        self.policy = resolve_policy(policy, len(self.arms), policy_kwargs)

    def _accept_drafts(self, drafts: list[Any]) -> list[Any]:
        """The engine's own form of each draft (checked); the base takes them as given."""
        return drafts

    @property
    def arm_names(self) -> list[str]:
        """One unique name per arm: the draft's name, "@γ=<γ>" added when arms carry their own γ; the plain arm
        is `PLAIN_ARM` ("target" when it is the only arm)."""
        if not self.drafts:
            return ["target"]
        names = unique_names([draft_name(draft, index) for index, draft in enumerate(self.drafts)])
        if self.gammas is None:
            return names
        return [PLAIN_ARM if draft < 0 else f"{names[draft]}@γ={arm_gamma}" for draft, arm_gamma in self.arms]

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def request(self, input_ids: Any, attention_mask: Any = None, max_new_tokens: Any = 64,
                sampling: Any = None, seed: Any = 0, eos_token_id: Any = None, ignore_eos: bool = False,
                pad_token_id: Any = None) -> Request:
        """Check one `generate` call's arguments (each here, once) into a `Request`."""
        sampling = check_sampling(sampling)
        seed = rng.check_seed(seed)
        vocab = models.vocab_size_of(self.target)
        input_ids, mask = check_prompt(input_ids, attention_mask, vocab)
        batch, width = input_ids.shape
        budgets = check_budgets(max_new_tokens, batch)
        limit, holder = position_limit(self.target, self.drafts)
        if limit is not None and width > limit:
            raise ValueError(f"the prompt is {width} tokens but the {holder} holds only {limit} positions; "
                             "shorten the prompt")
        if limit is not None and width + max(budgets) > limit:
            raise ValueError(f"prompt length {width} + max_new_tokens {max(budgets)} exceeds the {holder}'s {limit} "
                             f"positions; lower max_new_tokens to at most {limit - width}")
        if not isinstance(ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {ignore_eos!r}")
        default_eos = models.special_token_ids(self.target)["eos_token_id"]
        stop_ids = set() if ignore_eos else check_token_ids(
            "eos_token_id", default_eos if eos_token_id is None else eos_token_id, vocab)
        if pad_token_id is not None:
            check_token_ids("pad_token_id", pad_token_id, vocab)
        pad_id = resolve_pad(pad_token_id, self.target, stop_ids)
        # masked prompt positions are never attended, but they are embedded: whatever id the caller left there
        # (-100 from a collator) must become a valid one
        tokens = torch.where(mask, input_ids, torch.full_like(input_ids, pad_id))
        return Request(input_ids, tokens, mask, budgets, sampling, seed, frozenset(stop_ids), pad_id)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int | Sequence[int] = 64, sampling: SamplingParams | None = None, seed: int = 0,
                 eos_token_id: int | Sequence[int] | None = None, ignore_eos: bool = False,
                 pad_token_id: int | None = None, on_step: Callable[[StepEvent], None] | None = None,
                 timing: bool = False) -> GenerationResult:
        """Generate up to `max_new_tokens` (an int, or one int per row) after left-padded prompts.

        `seed` (an int in [0, 2**64)) fixes every draw of the run: the drafts' and the verifier's sampling
        (`rng.step_key`, the module docstring's schedule) and the policy's own randomness (its generator restarts
        from a seed derived from `seed`), so a fresh decoder given the same inputs and seed returns the same output.
        A reused decoder keeps what its policy learned (arm statistics) from earlier calls, so its choices -- and
        with them the output -- may differ from a fresh decoder's; call `decoder.policy.reset()` to forget them.
        `eos_token_id` defaults to the target's (`ignore_eos=True` turns stopping off); `on_step` receives a
        `StepEvent` after each step; `timing=True` synchronises the device around each eager step so its latency
        is device-accurate (the fast engine's latencies on CUDA always are: device time between step ends).
        Raises FloatingPointError when a model returns NaN or +inf logits (or a row of -inf).
        """
        if on_step is not None and not callable(on_step):
            raise ValueError(f"on_step must be a callable taking a StepEvent, or None, got {type(on_step).__name__}")
        request = self.request(input_ids, attention_mask, max_new_tokens, sampling, seed, eos_token_id, ignore_eos,
                               pad_token_id)
        stats = GenerationStats(arm_names=self.arm_names, batch_size=request.batch, prompt_length=request.width,
                                synchronized_timing=bool(timing),
                                arm_gammas=None if self.gammas is None else [g for _, g in self.arms])
        start_request(self.policy, request.seed, self.arms, self.step_costs)
        return self._decode(request, stats, on_step, bool(timing))

    @abc.abstractmethod
    def _decode(self, request: Request, stats: GenerationStats, on_step: Callable[[StepEvent], None] | None,
                timing: bool) -> GenerationResult:
        """The engine's own step loop over a checked request (the policy already started for it)."""

    def choose_arm(self) -> int:
        """The policy's arm for the next step, from the past only (Theorem 1)."""
        arm = int(self.policy.select())
        if not 0 <= arm < len(self.arms):
            raise ValueError(f"policy returned arm {arm}, but there are {len(self.arms)} arms")
        return arm
