"""``flashspec bandits``: the bandit experiments behind results/bandits_*.json and their figures.

Four experiments on the regret simulator (`flashspec_lab.simulate`): the paper's Bernoulli toy reproduced
(``reproduce``), domain switches every 200 / 2000 steps (``nonstationary``), the sensitivity of the windowed,
discounted and re-prior parameters (``sensitivity``), and a cost-aware draft choice (``cost``).

    flashspec bandits                      # every experiment at the committed size (10,000 rounds, 200 seeds)
    flashspec bandits --quick              # smoke run: 1,000 rounds, 20 seeds
    python -m experiments.bandits --experiments cost --out /tmp/x
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from flashspec import rewards
from flashspec_lab import cli_checks, provenance
from flashspec_lab.simulate import (
    Environment,
    SimulationResult,
    auer_ucb1_bound,
    bernoulli_environment,
    mean_confidence_interval,
    piecewise_environment,
    simulate,
    sqrt_kt_log_t,
)

# Numbers reported in the FlashSpec paper's text (cited for comparison, not produced here).
PAPER_REPORTED = {"ucb1_regret": 100.2, "thompson_regret": 18.9, "claimed_bound": 526.0}

PAPER_ARMS = (0.3, 0.7, 0.5)
LEVELS = (0.85, 0.70, 0.55)


@dataclass(frozen=True)
class PolicySetup:
    """One policy with one kind of information, as it appears in tables and figures."""

    label: str
    policy: str
    observation: str = "bit"
    feedback: str = "bandit"
    request_boundaries: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self, env: Environment, n_rounds: int, seeds: Sequence[int]) -> SimulationResult:
        return simulate(self.policy, env, n_rounds, seeds, observation=self.observation, feedback=self.feedback,
                        request_boundaries=self.request_boundaries, policy_kwargs=self.kwargs)

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "policy": self.policy, "observation": self.observation,
                "feedback": self.feedback, "request_boundaries": self.request_boundaries, "kwargs": self.kwargs}


def _progress(items: Sequence[Any], desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, mininterval=1.0)


def experiment_reproduce(n_rounds: int, n_seeds: int) -> dict[str, Any]:
    """The paper's toy: Bernoulli arms [0.3, 0.7, 0.5]; UCB1 and Thompson, seeds 0-4 and n_seeds seeds."""
    env = bernoulli_environment(PAPER_ARMS)
    seeds = list(range(n_seeds))
    out: dict[str, Any] = {"arms": list(PAPER_ARMS), "policies": {}}
    for name in _progress(["ucb1", "thompson"], "reproduce"):
        start = time.perf_counter()
        result = simulate(name, env, n_rounds, seeds)
        seconds = time.perf_counter() - start
        first_five = result.final_regret[:5]
        out["policies"][name] = {
            **result.summary(),
            "simulate_wall_seconds": seconds,
            "seeds_0_4_regret": first_five.tolist(),
            "seeds_0_4_mean": float(first_five.mean()),
            "paper_reported": PAPER_REPORTED[f"{name}_regret"],
            "curve": result.curve(),
        }
    out["sqrt_kt_log_t"] = sqrt_kt_log_t(len(PAPER_ARMS), n_rounds)
    out["auer_bound"] = auer_ucb1_bound(PAPER_ARMS, n_rounds)
    out["paper_claimed_bound"] = PAPER_REPORTED["claimed_bound"]
    out["regret_definition"] = "pseudo-regret: sum over steps of (best mean - mean of played arm)"
    if len(seeds) >= 5:  # The Thompson row for seeds 0-4 depends on the batch; rerun those five alone.
        out["policies"]["thompson"]["seeds_0_4_alone_mean"] = float(simulate("thompson", env, n_rounds, seeds[:5]).final_regret.mean())
    return out


def nonstationary_configs(n_rounds: int) -> list[PolicySetup]:
    """Policies × information for the domain-switch study (fixed parameters, the same in both regimes)."""
    return [
        PolicySetup("UCB1 (1 bit)", "ucb1"),
        PolicySetup("Thompson (1 bit)", "thompson"),
        PolicySetup("EXP3 (1 bit)", "exp3", kwargs={"horizon": n_rounds}),
        PolicySetup("SW-UCB W=500 (1 bit)", "sw-ucb", kwargs={"window": 500}),
        PolicySetup("D-UCB δ=0.98 (1 bit)", "d-ucb", kwargs={"discount": 0.98}),
        PolicySetup("D-TS δ=0.98 (1 bit)", "d-ts", kwargs={"discount": 0.98}),
        PolicySetup("Thompson (step n of γ)", "thompson", observation="step"),
        PolicySetup("D-TS δ=0.98 (step)", "d-ts", observation="step", kwargs={"discount": 0.98}),
        PolicySetup("Thompson (1 bit + request re-prior ρ=0.1)", "thompson", request_boundaries=True,
               kwargs={"request_decay": 0.1}),
        PolicySetup("Thompson (step + request re-prior ρ=0.1)", "thompson", observation="step",
               request_boundaries=True, kwargs={"request_decay": 0.1}),
        PolicySetup("D-TS δ=0.99 (step + request re-prior ρ=0.1)", "d-ts", observation="step",
               request_boundaries=True, kwargs={"discount": 0.99, "request_decay": 0.1}),
        PolicySetup("D-UCB δ=0.995, exploration 0.25 (step)", "d-ucb", observation="step",
               kwargs={"discount": 0.995, "exploration": 0.25}),
        PolicySetup("D-UCB δ=0.95 (full feedback, steps)", "d-ucb", observation="step", feedback="full",
               kwargs={"discount": 0.95}),
        PolicySetup("D-TS δ=0.95 (full feedback, steps)", "d-ts", observation="step", feedback="full",
               kwargs={"discount": 0.95}),
        PolicySetup("UCB1 (full feedback, steps + request re-prior ρ=0.1)", "ucb1", observation="step",
               feedback="full", request_boundaries=True, kwargs={"request_decay": 0.1}),
        PolicySetup("Oracle", "oracle"),
    ]


NONSTATIONARY_FIRST_SEED = 10_000  # held-out seeds: the sensitivity sweep (seeds 0..) chose the parameters


def experiment_nonstationary(n_rounds: int, n_seeds: int, switches: Sequence[int] = (200, 2000)) -> dict[str, Any]:
    """Domain switches every 200 / 2000 steps, γ = 4, levels 0.55-0.85; regret ratio to UCB1 (1 bit)."""
    seeds = list(range(NONSTATIONARY_FIRST_SEED, NONSTATIONARY_FIRST_SEED + n_seeds))
    configs = nonstationary_configs(n_rounds)
    out: dict[str, Any] = {"levels": list(LEVELS), "gamma": 4, "request_length": 100, "regimes": {}}
    for switch_every in switches:
        env = piecewise_environment(switch_every, n_rounds, LEVELS, gamma=4, request_length=100, seed=switch_every)
        regime: dict[str, Any] = {"switch_every": switch_every, "schedule": env.levels.tolist(), "configs": {}}
        for config in _progress(configs, f"switch every {switch_every}"):
            result = config.run(env, n_rounds, seeds)
            regime["configs"][config.label] = {**config.describe(), **result.summary(), "curve": result.curve(60)}
        baseline = regime["configs"]["UCB1 (1 bit)"]["final_regret_mean"]
        for entry in regime["configs"].values():
            entry["ratio_to_ucb1"] = entry["final_regret_mean"] / baseline
        out["regimes"][str(switch_every)] = regime
    worst_ratio = {
        label: max(regime["configs"][label]["ratio_to_ucb1"] for regime in out["regimes"].values())
        for label in out["regimes"][str(switches[0])]["configs"]
        if label != "Oracle"
    }
    best = min(worst_ratio, key=worst_ratio.__getitem__)
    out["best_in_all_regimes"] = {"label": best, "worst_ratio_to_ucb1": worst_ratio[best]}
    configs_by_label = {config.label: config for config in configs}
    bandit_only = [label for label in worst_ratio if configs_by_label[label].feedback == "bandit"]
    best_bandit = min(bandit_only, key=worst_ratio.__getitem__)
    out["best_with_bandit_feedback"] = {"label": best_bandit, "worst_ratio_to_ucb1": worst_ratio[best_bandit]}
    out["worst_ratio_to_ucb1"] = worst_ratio
    out["first_seed"] = NONSTATIONARY_FIRST_SEED
    return out


def experiment_sensitivity(n_rounds: int, n_seeds: int, switches: Sequence[int] = (200, 2000)) -> dict[str, Any]:
    """Regret ratio to UCB1 as a function of D-TS's discount, SW-UCB's window and the request re-prior ρ."""
    seeds = list(range(n_seeds))
    discounts = [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]
    windows = [50, 100, 200, 500, 1000, 2000]
    decays = [0.0, 0.1, 0.3, 0.5, 1.0]
    information = {
        "1 bit": {"observation": "bit"},
        "step": {"observation": "step"},
        "step + request re-prior ρ=0.1": {"observation": "step", "request_boundaries": True},
        "full feedback, steps": {"observation": "step", "feedback": "full"},
    }
    out: dict[str, Any] = {"discounts": discounts, "windows": windows, "request_decays": decays, "regimes": {}}
    for switch_every in switches:
        env = piecewise_environment(switch_every, n_rounds, LEVELS, gamma=4, request_length=100, seed=switch_every)
        baseline = PolicySetup("UCB1 (1 bit)", "ucb1").run(env, n_rounds, seeds).final_regret.mean()
        runs: list[tuple[str, str, float, PolicySetup]] = []
        for info, options in information.items():
            extra = {"request_decay": 0.1} if options.get("request_boundaries") else {}
            for discount in discounts:
                runs.append(("d-ucb discount", info, discount,
                             PolicySetup(info, "d-ucb", kwargs={"discount": discount, **extra}, **options)))
            for window in windows:
                runs.append(("sw-ucb window", info, window,
                             PolicySetup(info, "sw-ucb", kwargs={"window": window, **extra}, **options)))
        for decay in decays:
            runs.append(("request_decay", "Thompson, step", decay,
                         PolicySetup("Thompson, step", "thompson", observation="step", request_boundaries=True,
                                kwargs={"request_decay": decay})))
            runs.append(("request_decay", "UCB1, full feedback, steps", decay,
                         PolicySetup("UCB1, full feedback, steps", "ucb1", observation="step", feedback="full",
                                request_boundaries=True, kwargs={"request_decay": decay})))
        regime: dict[str, Any] = {"ucb1_regret": float(baseline), "sweeps": {}}
        for sweep, info, value, config in _progress(runs, f"sensitivity, switch every {switch_every}"):
            mean, half = mean_confidence_interval(config.run(env, n_rounds, seeds).final_regret)
            series = regime["sweeps"].setdefault(sweep, {}).setdefault(info, {"x": [], "ratio": [], "ci95": []})
            series["x"].append(value)
            series["ratio"].append(mean / baseline)
            series["ci95"].append(half / baseline)
        out["regimes"][str(switch_every)] = regime
    return out


def experiment_cost(n_rounds: int, n_seeds: int) -> dict[str, Any]:
    """Highest acceptance is not fastest: acceptance [0.80, 0.70, 0.50], draft cost [0.30, 0.05, 0.02] × target."""
    levels = (0.80, 0.70, 0.50)
    costs = (0.30, 0.05, 0.02)
    gamma = 4
    env = Environment(levels=np.asarray([levels]), gamma=gamma, draft_costs=np.asarray(costs), objective="throughput")
    seeds = list(range(n_seeds))
    out: dict[str, Any] = {
        "acceptance": list(levels),
        "draft_costs": list(costs),
        "gamma": gamma,
        "expected_tokens_per_step": np.asarray(rewards.expected_tokens_per_step(levels, gamma)).tolist(),
        "expected_throughput_reward": env.values()[0].tolist(),
        "policies": {},
    }
    configs = [
        PolicySetup("Thompson, acceptance-fraction reward", "thompson", observation="acceptance_fraction"),
        PolicySetup("Thompson, throughput reward", "thompson", observation="throughput"),
        PolicySetup("UCB1, acceptance-fraction reward", "ucb1", observation="acceptance_fraction"),
        PolicySetup("UCB1, throughput reward", "ucb1", observation="throughput"),
    ]
    for config in _progress(configs, "cost-aware"):
        result = config.run(env, n_rounds, seeds)
        out["policies"][config.label] = {**config.describe(), **result.summary()}
    return out


EXPERIMENTS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "reproduce": experiment_reproduce,
    "nonstationary": experiment_nonstationary,
    "sensitivity": experiment_sensitivity,
    "cost": experiment_cost,
}


def _save_figure(name: str, data: dict[str, Any], path: Path) -> None:
    from flashspec_lab import plots

    if name == "reproduce":
        plots.plot_reproduced_regret(data, path)
    elif name == "nonstationary":
        plots.plot_nonstationary_regret(data, path)
    elif name == "sensitivity":
        plots.plot_bandit_sensitivity(data, path)
    elif name == "cost":
        plots.plot_cost_aware_shares(data, path)


def main(argv: list[str] | None = None) -> int:
    """Regenerate results/bandits_<experiment>.json and .png (flashspec bandits --help)."""
    parser = argparse.ArgumentParser(prog="flashspec bandits", description=main.__doc__)
    parser.add_argument("--experiments", nargs="+", choices=sorted(EXPERIMENTS), default=list(EXPERIMENTS),
                        help="which experiments to run (default: all)")
    parser.add_argument("--rounds", type=int, default=10_000, help="steps per run (default 10000)")
    parser.add_argument("--seeds", type=int, default=200, help="seeds per configuration (default 200)")
    parser.add_argument("--sweep-seeds", type=int, default=50, help="seeds per point of the sensitivity sweep")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output folder (default results/)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1000 rounds, 20 seeds")
    args = parser.parse_args(argv)
    cli_checks.output_folder(parser, "--out", args.out)
    if args.quick:
        args.rounds, args.seeds, args.sweep_seeds = 1000, 20, 20
    if args.rounds < 10 or args.seeds < 5 or args.sweep_seeds < 2:
        parser.error("--rounds must be >= 10, --seeds >= 5, --sweep-seeds >= 2")
    command = ["flashspec", "bandits", *(sys.argv[1:] if argv is None else argv)]
    started = provenance.record(command)  # the code as it was when the run started
    for name in args.experiments:
        seeds = args.sweep_seeds if name == "sensitivity" else args.seeds
        start = time.perf_counter()
        data = EXPERIMENTS[name](args.rounds, seeds)
        run = {**started, "wall_seconds": round(time.perf_counter() - start, 2)}
        settings = {"experiment": name, "n_rounds": args.rounds, "n_seeds": seeds}
        json_path = provenance.write_result(args.out / f"bandits_{name}.json", run, settings, data)
        _save_figure(name, provenance.result(run, settings, data), args.out / f"bandits_{name}.png")
        print(f"wrote {json_path} and {json_path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
