"""Domain-switching workload and experiment: which draft should a server use when requests change domain?

A stream of requests (held-out prompts of the zoo's domains) is served one request at a time by one
`SpeculativeDecoder` whose policy lives across requests, exactly as a server would run it.  Two
workloads:

- ``blocks``: domains alternate in blocks of `block_size` consecutive requests (python x k, prose x k, ...);
- ``mixed``: every request's domain drawn uniformly at random (seeded).

Contestants: each fixed draft; the per-domain oracle (knows each request's domain and uses the draft with
the highest exact acceptance there, `oracle_arms`, as an upper reference); and the shipped bandit policies of
`flashspec.bandits`, each with and without a per-request reset (``request_decay`` 0 or 1, applied through
the request-boundary hook ``policy.on_request_start()``).  Every contestant serves the same requests with
the same seeds; reported are tokens/s, mean acceptance, tokens per step, and the arm-choice trace.
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flashspec import stats
from flashspec.sampling import SamplingParams

WORKLOADS = ("blocks", "mixed")
DEFAULT_BANDITS = ("thompson", "ucb1", "sw-ucb", "d-ts", "d-ucb", "exp3")
ORACLE = "per domain, the draft with the highest exact teacher-forced acceptance Σ min(p, q) on held-out text"


@dataclass(frozen=True)
class Request:
    """One request of the stream: its domain and prompt ids."""

    domain: str
    prompt_ids: list[int]


def make_workload(prompts: dict[str, list[list[int]]], kind: str, num_requests: int, block_size: int = 3,
                  seed: int = 0) -> list[Request]:
    """`num_requests` requests over the domains of `prompts` (domain -> list of prompt ids).

    ``blocks`` cycles the domains in their given order, `block_size` requests each; ``mixed`` draws each
    request's domain uniformly at random.  Within a domain, prompts are used in order, wrapping around.
    """
    if kind not in WORKLOADS:
        raise ValueError(f"kind must be one of {WORKLOADS}, got {kind!r}")
    if num_requests < 1 or block_size < 1:
        raise ValueError(f"num_requests and block_size must be >= 1, got {num_requests}, {block_size}")
    domains = list(prompts)
    if not domains or any(len(prompts[d]) == 0 for d in domains):
        raise ValueError("prompts must map every domain to at least one prompt")
    chooser = random.Random(seed)
    used = {d: 0 for d in domains}
    requests = []
    for index in range(num_requests):
        if kind == "blocks":
            domain = domains[(index // block_size) % len(domains)]
        else:
            domain = chooser.choice(domains)
        requests.append(Request(domain, list(prompts[domain][used[domain] % len(prompts[domain])])))
        used[domain] += 1
    return requests


def oracle_arms(acceptance: dict[str, dict[str, float]], draft_names: list[str],
                domains: tuple[str, ...] | list[str]) -> dict[str, int]:
    """The oracle's arm per domain: the index in `draft_names` of the draft with the highest acceptance there.

    `acceptance` is draft name -> domain -> acceptance; the experiments pass the exact teacher-forced
    Σ min(p, q) (`flashspec_lab.zoo.expected_acceptance_matrix`), which has no sampling noise (`ORACLE`).
    """
    return {d: max(range(len(draft_names)), key=lambda arm: acceptance[draft_names[arm]][d]) for d in domains}


class DomainOracle:
    """Plays the best draft of the current request's domain (told by the experiment, not learned)."""

    name = "oracle"

    def __init__(self, best_arm: dict[str, int]) -> None:
        self.best_arm = dict(best_arm)
        self.domain: str | None = None

    def set_domain(self, domain: str) -> None:
        self.domain = domain

    def select(self, context: Any = None) -> int:
        if self.domain is None:
            raise ValueError("DomainOracle.set_domain must be called before select")
        return self.best_arm[self.domain]

    def update(self, arm: int, reward: float) -> None:
        return None

    def reset(self) -> None:
        self.domain = None


WARM_UPS = (None, "replay", "all")


def serve_stream(target: torch.nn.Module, drafts: dict[str, torch.nn.Module], requests: list[Request], policy: Any,
                 gamma: int = 4, max_new_tokens: int = 48, temperature: float = 1.0, seed: int = 0,
                 reset_per_request: bool = False, backend: str = "auto", decoder: Any = None,
                 warm_up: str | None = None) -> dict[str, Any]:
    """Serve `requests` one by one with one decoder (policy state carried across requests).

    `reset_per_request` calls the policy's request-boundary hook (`on_request_start`) before each request.
    `decoder`: serve with this decoder over the same drafts in the same order (e.g. a
    `FastSpeculativeDecoder`, whose captured graphs then serve every contestant), its policy replaced by
    `policy`; default a new eager `SpeculativeDecoder` (`gamma`, `backend`).
    `warm_up="replay"`: before timing, serve the same requests with the same seeds under an untouched copy
    of `policy` (and the decoder's measured step costs put back afterwards), so a policy whose choices do
    not depend on timing makes the same choices again and the timed stream captures no new graph; a
    throughput (timing) reward may still choose differently, which `graph_captures` shows. `warm_up="all"`:
    the replay, then `FastSpeculativeDecoder.capture_graphs` over every length the stream's rows can reach,
    so the timed stream captures nothing whatever the policy picks (a fast decoder only).
    Returns totals, tokens/s (generation wall time only), acceptance, the per-step arm trace with the
    request index and the measured latency (`StepRecord.latency_s`) of each step, and `graph_captures`: CUDA graphs captured inside the timed stream
    (`FastSpeculativeDecoder.graphs_captured`: 0 when it runs without graphs; None for the eager engine).
    """
    from flashspec.drafters import ModelDrafter
    from flashspec.engine import SpeculativeDecoder

    if warm_up not in WARM_UPS:
        raise ValueError(f"warm_up must be one of {WARM_UPS}, got {warm_up!r}")
    extra: dict[str, Any] = {}
    if decoder is None:
        decoder = SpeculativeDecoder(target, drafts=[ModelDrafter(model, name=name) for name, model in drafts.items()],
                                     policy=policy, gamma=gamma, backend=backend)
        extra["timing"] = True
    sampling = SamplingParams(temperature=temperature)
    if warm_up == "all" and not hasattr(decoder, "capture_graphs"):
        raise ValueError("warm_up='all' needs a fast decoder (FastSpeculativeDecoder): it captures graphs ahead")
    if warm_up in ("replay", "all"):
        costs = copy.deepcopy(getattr(decoder, "step_costs", None))
        decoder.policy = copy.deepcopy(policy)  # before `policy` serves anything: a fresh, identical copy
        _serve(decoder, requests, sampling, max_new_tokens, seed, reset_per_request, extra)
        if warm_up == "all":
            longest = max(len(request.prompt_ids) for request in requests) + max_new_tokens + decoder.max_gamma + 1
            decoder.capture_graphs(range(1, longest + 1))
        if costs is not None:
            decoder.step_costs = costs
    decoder.policy = policy
    captured_before = getattr(decoder, "graphs_captured", None)
    run = _serve(decoder, requests, sampling, max_new_tokens, seed, reset_per_request, extra)
    generated, steps, arms = run["generated_tokens"], run["steps"], np.asarray(run["arm_trace"])
    return {
        "generated_tokens": generated, "seconds": run["seconds"], "tokens_per_s": generated / run["seconds"],
        "steps": steps, "tokens_per_step": generated / steps,
        "mean_acceptance": stats.acceptance_rate(run["accepted"], run["drafted"]),
        "token_acceptance": stats.token_acceptance_from_counts(run["accepted"], run["rejections"]),
        "arm_share": {name: float(np.mean(arms == a)) for a, name in enumerate(drafts)},
        **{key: run[key] for key in ("arm_trace", "accepted_trace", "request_of_step", "latency_trace")},
        "graph_captures": None if captured_before is None else decoder.graphs_captured - captured_before,
    }


def _serve(decoder: Any, requests: list[Request], sampling: SamplingParams, max_new_tokens: int, seed: int,
           reset_per_request: bool, extra: dict[str, Any]) -> dict[str, Any]:
    """One pass over `requests` (request i with seed `seed` + i) under the decoder's policy: generation wall
    time, token and step counts, and the per-step traces."""
    device = decoder.device
    arms, accepted_trace, request_of_step, latency_trace = [], [], [], []
    total_s = 0.0
    generated = accepted = drafted = rejections = steps = 0
    for index, request in enumerate(requests):
        if isinstance(decoder.policy, DomainOracle):
            decoder.policy.set_domain(request.domain)
        if reset_per_request:
            decoder.policy.on_request_start()
        input_ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=device)
        started = time.perf_counter()
        result = decoder.generate(input_ids, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed + index,
                                  ignore_eos=True, **extra)
        total_s += time.perf_counter() - started
        generated += int(result.num_generated.sum())
        for record in result.stats.steps:
            arms.append(record.arm)
            accepted_trace.append(sum(record.num_accepted))
            request_of_step.append(index)
            latency_trace.append(record.latency_s)
            accepted += sum(record.num_accepted)
            drafted += record.gamma * len(record.num_accepted)
            rejections += sum(1 for n in record.num_accepted if n < record.gamma)
            steps += 1
    return {"generated_tokens": generated, "seconds": total_s, "steps": steps, "accepted": accepted,
            "drafted": drafted, "rejections": rejections, "arm_trace": arms, "accepted_trace": accepted_trace,
            "request_of_step": request_of_step, "latency_trace": latency_trace}


def contestants(n_arms: int, draft_names: list[str], best_arm: dict[str, int],
                bandits: tuple[str, ...] = DEFAULT_BANDITS, seed: int = 0) -> list[tuple[str, Any, bool]]:
    """(label, policy object, reset_per_request) for fixed drafts, the oracle and each bandit +/- reset."""
    from flashspec.bandits import make_policy

    entries: list[tuple[str, Any, bool]] = [
        (f"fixed:{name}", make_policy("fixed", n_arms, arm=arm), False) for arm, name in enumerate(draft_names)
    ]
    entries.append(("oracle", DomainOracle(best_arm), False))
    for name in bandits:
        entries.append((name, make_policy(name, n_arms, seed=seed, request_decay=1.0), False))
        entries.append((f"{name}+reset", make_policy(name, n_arms, seed=seed, request_decay=0.0), True))
    return entries


def run_switching_experiment(target: torch.nn.Module, drafts: dict[str, torch.nn.Module],
                             prompts: dict[str, list[list[int]]], best_arm: dict[str, int], num_requests: int,
                             block_size: int, max_new_tokens: int, gamma: int = 4,
                             bandits: tuple[str, ...] = DEFAULT_BANDITS, seed: int = 0,
                             progress: bool = True, backend: str = "auto", temperature: float = 1.0,
                             decoder: Any = None) -> dict[str, Any]:
    """Every contestant on both workloads; adds the targets' ratios (best bandit vs oracle and vs best fixed).

    `decoder` (optional, see `serve_stream`) serves every contestant, e.g. one `FastSpeculativeDecoder`;
    each contestant's timed stream is then preceded by its replay (`warm_up="replay"`), which captures the
    graphs that stream uses."""
    from tqdm.auto import tqdm

    from flashspec.bandits import make_policy

    draft_names = list(drafts)
    results: dict[str, Any] = {}
    if decoder is None:
        # Every contestant gets a new eager decoder: one full-length request per draft before any timing warms
        # the process, whose first contestant would otherwise pay for kernel compilation and allocator growth
        # (seen on the H200: ~50% slower steps).
        warm = make_workload(prompts, "blocks", 1, 1, seed)
        for arm in range(len(draft_names)):
            serve_stream(target, drafts, warm, make_policy("fixed", len(draft_names), arm=arm), gamma,
                         max_new_tokens, temperature, seed=seed + 20_000, backend=backend)
    for kind in WORKLOADS:
        requests = make_workload(prompts, kind, num_requests, block_size, seed)
        entries = contestants(len(draft_names), draft_names, best_arm, bandits, seed)
        runs: dict[str, Any] = {}
        for label, policy, reset in tqdm(entries, desc=f"switching [{kind}]", disable=not progress):
            runs[label] = serve_stream(target, drafts, requests, policy, gamma, max_new_tokens, temperature,
                                       seed=seed, reset_per_request=reset, backend=backend, decoder=decoder,
                                       warm_up=None if decoder is None else "replay")
        results[kind] = {"requests": [r.domain for r in requests], "runs": runs, "summary": summarise(runs)}
    return results


def summarise(runs: dict[str, Any]) -> dict[str, Any]:
    """Best fixed draft, best bandit (by tokens/s), and the two ratios with their targets."""
    fixed = {k: v for k, v in runs.items() if k.startswith("fixed:")}
    bandit = {k: v for k, v in runs.items() if not k.startswith("fixed:") and k != "oracle"}
    best_fixed = max(fixed, key=lambda k: fixed[k]["tokens_per_s"])
    best_bandit = max(bandit, key=lambda k: bandit[k]["tokens_per_s"])
    oracle = runs["oracle"]

    def ratios(key: str) -> dict[str, float]:
        return {
            "best_bandit_vs_oracle": bandit[best_bandit][key] / oracle[key],
            "best_bandit_vs_best_fixed": bandit[best_bandit][key] / max(v[key] for v in fixed.values()),
        }

    return {
        "best_fixed": best_fixed, "best_bandit": best_bandit,
        "tokens_per_s": ratios("tokens_per_s"), "tokens_per_step": ratios("tokens_per_step"),
        "targets": {"bandit_vs_oracle_min": 0.95, "bandit_vs_best_fixed_min": 1.15},
    }


def switches_per_step(run: dict[str, Any]) -> float:
    """Fraction of steps that use a different draft than the step before it in the same request.

    Each such switch makes the new draft first run its lagging KV cache over the tokens it missed.
    """
    arms = np.asarray(run["arm_trace"])
    requests = np.asarray(run["request_of_step"])
    if arms.size < 2:
        return 0.0
    switched = (arms[1:] != arms[:-1]) & (requests[1:] == requests[:-1])
    return float(switched.sum() / arms.size)


def switching_cost(record: dict[str, Any]) -> dict[str, float]:
    """Least-squares fit ms/step = base_ms + per_switch_ms * switches/step over every contestant of every
    workload in a switching record: what one draft switch costs on the machine that ran it."""
    rates, step_ms = [], []
    for block in record["results"].values():
        for run in block["runs"].values():
            rates.append(switches_per_step(run))
            step_ms.append(1000.0 * run["seconds"] / run["steps"])
    x, y = np.asarray(rates), np.asarray(step_ms)
    if x.size < 3 or np.ptp(x) == 0:
        raise ValueError("switching_cost needs contestants with different switching rates")
    per_switch, base = np.polyfit(x, y, 1)
    return {"base_ms": float(base), "per_switch_ms": float(per_switch),
            "correlation": float(np.corrcoef(x, y)[0, 1]), "contestants": int(x.size)}
