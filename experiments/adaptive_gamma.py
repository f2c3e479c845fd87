"""Adaptive γ on the CPU zoo: fixed γ against a bandit over (draft, γ) arms, per domain.

Per domain of the CPU zoo (`flashspec_lab.zoo.load_zoo("cpu")`), single requests (B = 1) of that domain's
held-out prompts run through the eager engine with

* ``fixed γ=g``: the domain's best draft at each γ in ``--gammas`` (policy "fixed");
* ``adaptive γ``: the best draft at every γ, a bandit choosing γ per step (`gammas=`);
* ``adaptive (draft, γ)``: every zoo draft at every γ, a bandit choosing both;

each adaptive method once per policy in ``--policies``, named with it (``adaptive γ [gamma-ts]``).
Independent-arm policies (``thompson``) learn from the throughput reward on measured step times
(`flashspec.rewards.StepCosts`); ``gamma-ts`` keeps one acceptance posterior per draft and reads the
measured costs. Every bandit keeps what it learned across the domain's requests (one decoder per
method per round), as a server would. The methods take turns request by request, so load from other processes on the
machine falls on all of them alike. tok/s is generated tokens over the summed wall time of the
requests (prefill included). The domain's best draft is the one with the highest engine token
acceptance in ``results/zoo_cpu_acceptance.json`` (the specialist when that file is missing).

    python -m experiments.adaptive_gamma --out results/adaptive_gamma_cpu.json
    python -m experiments.adaptive_gamma --smoke          # one short request per method, nothing written
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashspec as fs  # noqa: E402
from flashspec_lab import cli_checks, provenance  # noqa: E402
from flashspec.drafters import ModelDrafter  # noqa: E402
from flashspec_lab.zoo import load_zoo  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--gammas", default="1,2,4,8", help="γ values, comma-separated")
    parser.add_argument("--prompts", type=int, default=12, help="requests per domain and round")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each with fresh decoders")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--policies", default="thompson,gamma-ts",
                        help="bandit policies, comma-separated: each runs both adaptive methods")
    parser.add_argument("--engine", choices=("eager", "fast"), default="eager")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the driver end to end")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    args.gammas = tuple(int(value) for value in args.gammas.split(","))
    args.policies = tuple(name.strip() for name in args.policies.split(",") if name.strip())
    if args.smoke:
        args.prompts, args.new_tokens, args.rounds, args.gammas = 1, 12, 1, args.gammas[:2]
    return args


def best_drafts(zoo: Any) -> tuple[dict[str, str], str]:
    """Per domain, the draft with the highest engine token acceptance in the zoo's acceptance results."""
    try:
        matrix = provenance.load_result("zoo_cpu_acceptance")["results"]["engine"]
    except (FileNotFoundError, KeyError):
        return {domain: domain for domain in zoo.domains}, "the domain's specialist (no zoo_cpu_acceptance.json)"
    best = {domain: max(matrix[domain], key=lambda draft: matrix[domain][draft]["token_acceptance"])
            for domain in zoo.domains}
    return best, "highest engine token acceptance in results/zoo_cpu_acceptance.json"


def make_decoders(zoo: Any, best: str, args: argparse.Namespace) -> dict[str, Any]:
    """The methods of one domain and round: a fresh decoder each (bandits learn over the round)."""
    decoder_class = fs.SpeculativeDecoder if args.engine == "eager" else fs.FastSpeculativeDecoder

    def draft(name: str) -> Any:
        model = zoo.drafts[name]
        return ModelDrafter(model, name=name) if args.engine == "eager" else model

    methods = {f"fixed γ={g}": decoder_class(zoo.target, [draft(best)], policy="fixed", gamma=g)
               for g in args.gammas}
    for policy in args.policies:
        methods[f"adaptive γ [{policy}]"] = decoder_class(zoo.target, [draft(best)], policy=policy,
                                                          gammas=args.gammas)
        methods[f"adaptive (draft, γ) [{policy}]"] = decoder_class(
            zoo.target, [draft(name) for name in zoo.drafts], policy=policy, gammas=args.gammas)
    return methods


def run_domain(zoo: Any, domain: str, best: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every method on the domain's prompts, `args.rounds` times; tok/s, accepted length, choices."""
    prompts = zoo.prompts[domain][: args.prompts]
    sampling = fs.SamplingParams(temperature=args.temperature)
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_index in range(args.rounds):
        decoders = make_decoders(zoo, best, args)
        totals = {name: {"tokens": 0, "seconds": 0.0, "accepted": [], "arms": []} for name in decoders}
        for index, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], dtype=torch.long)
            for name, decoder in decoders.items():
                start = time.perf_counter()
                result = decoder.generate(ids, max_new_tokens=args.new_tokens, sampling=sampling,
                                          seed=1000 * round_index + index, ignore_eos=True)
                totals[name]["seconds"] += time.perf_counter() - start
                totals[name]["tokens"] += int(result.num_generated.sum())
                totals[name]["accepted"] += [n for step in result.stats.steps for n in step.num_accepted]
                totals[name]["arms"] += [decoder.arms[step.arm] if hasattr(decoder, "arms") else (0, step.gamma)
                                         for step in result.stats.steps]
        for name, total in totals.items():
            runs.setdefault(name, []).append(summarise(total, decoders[name]))
    return {name: reduce_rounds(rounds) for name, rounds in runs.items()}


def summarise(total: dict[str, Any], decoder: Any) -> dict[str, Any]:
    """One round of one method: tok/s, mean accepted length, and the γ / draft chosen per step."""
    arms = total["arms"]
    late = arms[len(arms) * 2 // 3:]  # the last third of the steps: what the bandit settled on
    names = [getattr(draft, "name", None) or f"draft{index}" for index, draft in enumerate(decoder.drafts)]
    return {
        "tok_per_s": total["tokens"] / total["seconds"],
        "mean_accepted_length": statistics.fmean(total["accepted"]),
        "steps": len(arms),
        "gamma_share": share(Counter(gamma for _, gamma in arms)),
        "gamma_share_last_third": share(Counter(gamma for _, gamma in late)),
        "draft_share_last_third": share(Counter(names[draft] for draft, _ in late)),
    }


def share(counts: Counter) -> dict[str, float]:
    total = sum(counts.values())
    return {str(key): count / total for key, count in counts.most_common()}


def reduce_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tok/s over rounds (with every round's), the rest from the rounds pooled by steps."""
    rates = [run["tok_per_s"] for run in rounds]
    steps = sum(run["steps"] for run in rounds)
    pooled: dict[str, Counter] = {key: Counter() for key in ("gamma_share", "gamma_share_last_third",
                                                             "draft_share_last_third")}
    for run in rounds:
        for key, counter in pooled.items():
            counter.update({value: fraction * run["steps"] for value, fraction in run[key].items()})
    result = {"tok_per_s": statistics.median(rates), "tok_per_s_rounds": rates,
              "mean_accepted_length": sum(r["mean_accepted_length"] * r["steps"] for r in rounds) / steps,
              "steps": steps, **{key: share(counter) for key, counter in pooled.items()}}
    result["chosen_gamma"] = int(next(iter(result["gamma_share_last_third"])))
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = provenance.record(["python", "-m", "experiments.adaptive_gamma", *(sys.argv[1:] if argv is None
                                                                                 else argv)])
    wall = time.perf_counter()
    zoo = load_zoo("cpu", device="cpu", progress=False)  # builds and caches it on first use
    best, best_source = best_drafts(zoo)
    # a short untimed request first: the process's first forwards pay one-off costs
    warm = fs.SpeculativeDecoder(zoo.target, [zoo.drafts[best[zoo.domains[0]]]], policy="fixed", gamma=2)
    warm.generate(torch.tensor(zoo.prompts[zoo.domains[0]][:1]), max_new_tokens=8, ignore_eos=True)
    results: dict[str, Any] = {}
    for domain in zoo.domains:
        methods = run_domain(zoo, domain, best[domain], args)
        fixed = {name: run for name, run in methods.items() if name.startswith("fixed")}
        best_fixed = max(fixed, key=lambda name: fixed[name]["tok_per_s"])
        results[domain] = {
            "best_draft": best[domain], "methods": methods, "best_fixed": best_fixed,
            "vs_best_fixed": {name: run["tok_per_s"] / fixed[best_fixed]["tok_per_s"]
                              for name, run in methods.items() if name.startswith("adaptive")},
        }
        print(f"{domain} (best draft {best[domain]}):", flush=True)
        for name, run in methods.items():
            print(f"  {name:32s} {run['tok_per_s']:7.1f} tok/s  accepted length {run['mean_accepted_length']:.2f}  "
                  f"γ chosen (last third) {run['chosen_gamma']}  {run['gamma_share_last_third']}", flush=True)
    settings = {"zoo": "cpu", "zoo_path": str(zoo.path), "engine": args.engine, "gammas": list(args.gammas),
                "prompts_per_domain": args.prompts, "new_tokens": args.new_tokens, "rounds": args.rounds,
                "temperature": args.temperature, "policies": list(args.policies), "batch_size": 1, "threads": args.threads,
                "best_draft_source": best_source, "reward": "thompson & co: throughput on measured step wall times (StepCosts EMA); gamma-ts: "
                          "step outcomes (per-draft acceptance posterior) with the same measured costs",
                "tok_per_s": "generated tokens / summed wall seconds of the requests (prefill included), "
                             "median over rounds",
                "chosen_gamma": "the γ of most steps in the last third of each round's steps",
                "wall_seconds": None}
    settings["wall_seconds"] = time.perf_counter() - wall
    if args.smoke:
        print(json.dumps({"settings": settings}, indent=1, default=str)[:400])
        return 0
    if args.out:
        path = provenance.write_result(args.out, started, settings, results)
        print(f"written {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
