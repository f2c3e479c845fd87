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
# # Throughput: what a run measures, and taking the host out of the step
#
# A speculative decoder is sold on tokens per second. This chapter derives what that number is made of, uses
# the derivation to check a set of published numbers, and then shows how FlashSpec's fast path removes the cost
# that dominates a small model's step on a GPU: the Python host launching kernels. The FlashSpec paper
# {cite}`flashspec_paper` reports, for TinyLlama-1.1B-Chat on an NVIDIA T4 with $\gamma=4$, **44.2 tokens/s**, a
# **22.1 ms** step and an acceptance rate **α = 0.75**; we start there. Every number below is computed in a cell
# or read from a committed results file under `results/`, and says which.

# %% tags=["hide-input"]
import os
import sys
import textwrap
import warnings

# the Colab copy of this chapter installs the package first
ON_COLAB = "google.colab" in sys.modules

import torch

# %matplotlib inline

if not torch.cuda.is_available():
    # Triton's CPU interpreter; must be set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import flashspec as fs
from flashspec import stats
from flashspec_lab import provenance

# tqdm's notebook bars need ipywidgets, which the book does not install
warnings.filterwarnings("ignore", message="IProgress not found")

from flashspec_lab.pages import glue, print_wrapped  # glue: numbers in the prose

device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
print(f"flashspec {fs.__version__}, torch {torch.__version__}, running on "
      f"{device_name}{' (Colab)' if ON_COLAB else ''}")


# %% [markdown]
# ## Tokens per second is tokens per step over time per step
#
# A speculative step drafts $\gamma$ tokens, verifies them in one target forward and emits the accepted prefix
# plus one token of the target's own (a correction, or the bonus token when all $\gamma$ pass). So every step emits
# between $1$ and $\gamma+1$ tokens, and over the decode steps of a run
#
# $$ \text{tokens/s} = \frac{\text{tokens per step}}{\text{seconds per step}}. $$
#
# The prefill and the host's bookkeeping between steps add time but no steps, so for a whole run tokens/s ×
# mean step time can only fall short of tokens per step, never exceed it. How many tokens a step brings depends
# on the acceptance, and "acceptance rate α" names two different quantities. This book keeps them apart under
# two names, each defined once in `flashspec.stats`:
#
# * the **acceptance rate** is accepted draft tokens over drafted tokens. A step that drafts $\gamma$ tokens and
#   accepts $n$ of them emits $n+1$, so tokens per step $= 1 + \gamma \times$ acceptance rate, exactly;
# * the **token acceptance** α is the per-token probability in the model where each drafted token is accepted with
#   probability α once the earlier ones were {cite}`leviathan2023fast`. Then $\Pr(n \ge j) = \alpha^j$, and
#
# $$ \mathbb E[\text{tokens per step}] = \sum_{j=0}^{\gamma} \Pr(n \ge j)
#    = \sum_{j=0}^{\gamma} \alpha^j = \frac{1-\alpha^{\gamma+1}}{1-\alpha}. $$
#
# So $\gamma\alpha + 1$ is right when α is the acceptance rate and wrong when it is the token acceptance: a chain
# stops at its first rejection, so a later position is reached less often than an earlier one. The gap grows with
# γ, as the cell shows.

# %%
for name, definition in stats.ACCEPTANCE.items():
    print_wrapped(f"{name}: {definition}")
gamma = 4
print(f"\n{'α':>5} {'(1-α^(γ+1))/(1-α)':>19} {'1+γα':>6}   (γ = {gamma})")
for alpha in (0.5, 0.75, 0.9):
    geometric = stats.tokens_per_step_from_token_acceptance(alpha, gamma)
    print(f"{alpha:>5} {geometric:>19.2f} {1 + gamma * alpha:>6.2f}")

# %% [markdown]
# ## The paper's three numbers cannot describe one run
#
# Multiplying the paper's throughput by its step latency gives the tokens one step brought, and the acceptance
# predicts the same quantity. The paper's values are quoted; everything else is computed from them.

# %%
# quoted from the paper
PAPER_T4 = {"tokens_per_s": 44.2, "step_latency_s": 22.1e-3,
            "alpha": 0.75, "gamma": 4}

alpha = PAPER_T4["alpha"]
measured_per_step = PAPER_T4["tokens_per_s"] * PAPER_T4["step_latency_s"]
if_token_acceptance = stats.tokens_per_step_from_token_acceptance(
    alpha, PAPER_T4["gamma"])
if_acceptance_rate = 1 + PAPER_T4["gamma"] * alpha
per_token_ms = 1e3 / PAPER_T4["tokens_per_s"]
step_ms = PAPER_T4["step_latency_s"] * 1e3
print(f"tokens/s x step latency = {measured_per_step:.3f} tokens per step")
print(f"α as token acceptance:  {if_token_acceptance:.3f} tokens per step")
print(f"α as acceptance rate:   {if_acceptance_rate:.3f} tokens per step")
print(f"1 / tokens/s = {per_token_ms:.1f} ms per token (quoted step: {step_ms:.1f} ms)")
glue("paper_per_step", measured_per_step, display=False)
glue("paper_if_token", if_token_acceptance, display=False)
glue("paper_if_rate", if_acceptance_rate, display=False)
glue("paper_per_token_ms", per_token_ms, display=False)
glue("paper_step_ms", step_ms, display=False)

# %% [markdown]
# Whichever α the paper meant, its throughput times its step latency is {glue:text}`paper_per_step:.3f` tokens
# per step — fewer than the one token every step emits — while α = 0.75 at γ = 4 means
# {glue:text}`paper_if_token:.2f` tokens per step as a token acceptance or {glue:text}`paper_if_rate:.2f` as an
# acceptance rate. So the three numbers cannot all describe one run with a per-step latency. One reading fits two
# of them: 1 / 44.2 tokens/s is {glue:text}`paper_per_token_ms:.1f` ms per token, close to the quoted
# {glue:text}`paper_step_ms:.1f` ms, so the quoted latency may be the time per *generated token*; then throughput
# and latency agree with each other and say nothing about α. Other readings — a median over a long-tailed step
# distribution, steps timed without synchronising the GPU, numbers from different runs — cannot be excluded: the
# paper does not say how it measured. A benchmark that reports all three should take them from one run and say
# which acceptance it means; `flashspec`'s `GenerationStats.summary()` reports both, with tokens per step and the
# step-time percentiles of the same run.

# %% [markdown]
# ## The T4 table, measured on your GPU
#
# One command measures what the paper's T4 table reports, on whatever GPU runs it: `flashspec reproduce t4` loads
# TinyLlama-1.1B-Chat in 4-bit NF4 (fp16 compute on a T4, which has no bf16 units) with llama-68m as its draft,
# decodes four chat prompts at $\gamma = 4$ on the fast path, and prints tokens/s, both acceptance measures and the
# p50 step beside the paper's numbers, with the same target decoding plainly for the speed-up. It also times the
# verify step against the PyTorch a user would write (`flashspec_lab.baseline.verify_pytorch`) at $B = 1$ and 8,
# the paper's kernel claim. The record it writes under `results/` names its GPU. On Colab (Runtime → GPU), run
# the next cell; the book's build has neither a GPU nor the hub, so it skips it (tags `skip-execution` and
# `nbval-skip`). Where there is no hub, `--source random` measures the same shapes with random weights (every
# cost real, the acceptance meaningless), and `--source smollm2` the offline SmolLM2 with prompt lookup. A first
# run spends minutes compiling the Triton kernels (the command says on stderr what finished and how long it took);
# Triton keeps them in its cache (`~/.triton`), so a second run in the same runtime starts in seconds.

# %% tags=["skip-execution", "nbval-skip"]
import subprocess

subprocess.run([sys.executable, "-m", "flashspec", "reproduce", "t4"], check=True)

# %% [markdown]
# What the command prints, from the committed run on the GPU its record names (with random weights where that
# machine had no hub: there its acceptance says nothing and its timings are that GPU's, not a T4's):

# %%
from flashspec_lab import reproduce

t4_records = [path for path
              in sorted(provenance.results_dir().glob("reproduce_t4_*.json"))
              if "smoke" not in path.name]
if t4_records:
    t4_record = provenance.load_result(t4_records[-1].name)
    print(f"results/{t4_records[-1].name}")
    print(textwrap.fill(t4_record["results"]["models"], 88))
    print(reproduce.table(t4_record["results"]))
    print(textwrap.fill(provenance.caption(t4_record), 88))
else:
    print("no committed run of `flashspec reproduce t4` yet")


# %% [markdown]
# ## Taking the host out of the step
#
# FlashSpec's eager engine (`fs.SpeculativeDecoder`) calls Hugging Face forwards from Python, one model call at a
# time, and reads each step's outcome before it launches the next. For a small target on a fast GPU that host
# work, not the GPU, sets the step time. The committed runner benchmark measured one forward of a random-weight
# TinyLlama-1.1B-shaped target (bf16, one query token, 256 tokens of context) on an NVIDIA H200: Hugging Face's
# eager forward takes {glue:text}`runner_hf_ms:.1f` ms, the same forward replayed from a CUDA graph
# {glue:text}`runner_graph_ms:.2f` ms, and reading the weights once at the measured copy bandwidth — the floor
# for any implementation — {glue:text}`runner_floor_ms:.2f` ms (`results/bench_runner_h200.json`). The fast path,
# `fs.FastSpeculativeDecoder`, closes most of that gap with three pieces:
#
# 1. **Static caches.** Each model runs through `flashspec.runner.LlamaRunner`, a preallocated KV cache where slot
#    $=$ position. A rejected draft token's slot needs no rollback: the next step writes that slot again.
# 2. **CUDA graphs.** The whole step — the chosen draft's forwards and γ samples, the target's (γ+1)-token forward,
#    `verify`, the commit — works on fixed buffers, so it is captured once per (arm, attention bucket) and
#    replayed. Attention reads a bucket of the cache, not its exact fill, so few graphs are needed
#    (`flashspec.runner.bucket_for`, printed below).
# 3. **A host that reads outcomes late.** The host only picks the arm and launches. It copies step $t$'s outcome
#    (accepted counts, finished rows) to pinned memory and reads it `lag` steps later (default 2), so the GPU
#    always has queued work. The policy therefore chooses step $t$'s draft from steps up to $t - \text{lag}$ only.
#    That choice is still a function of the past, which is all Theorem 1 asks: the output distribution stays
#    exactly the target's, whatever the lag.
#
# The host loop, as `flashspec.fast` writes it (the lines that launch, copy and read; line numbers from the
# module):

# %% tags=["remove-input"]
runner_record = provenance.load_result("bench_runner_h200.json")
rows = runner_record["results"]["cells"]["tinyllama-1b"]["results"]
one_token = next(row for row in rows if row["batch"] == 1 and row["q"] == 1)
glue("runner_hf_ms", one_token["hf_eager"]["median_ms"], display=False)
glue("runner_graph_ms", one_token["runner_graph"]["median_ms"], display=False)
glue("runner_floor_ms", one_token["floor_ms"], display=False)

# %%
import inspect

from flashspec import fast_session, runner

lines, first = inspect.getsourcelines(fast_session.Session.run)
shown = ("while not finished", "if step - read >= lag", "finished = consume()",
         "arm = decoder.choose_arm()", "captured = self.launch(",
         "pinned[slot].copy_(b.outcome", "events[slot].record()",
         "events[slot].synchronize()", "outcome = pinned[slot].tolist()",
         "update_policy(decoder.policy")
for number, line in enumerate(lines, first):
    if any(key in line for key in shown):
        text = line.rstrip()[4:]
        print(f"{number:4d} {text if len(text) <= 80 else text[:79] + '…'}")
print("\nattention bucket by filled slots (a cache of 1024 slots):")
print({fill: runner.bucket_for(fill, 1024) for fill in (40, 100, 300, 700, 1000)})

# %% [markdown]
# Read bottom-up: each iteration selects an arm, launches its graph, queues the outcome copy and records an event;
# only once `lag` steps are in flight does `consume()` wait on the oldest step's event, read its outcome and update
# the policy. On a CPU there are no graphs and the launch runs synchronously, but the loop and its lag are the same.
#
# ## A live run on this machine
#
# A tiny random Llama target and a draft cut from it (its first and last decoder layers, with the target's
# embedding and head: `flashspec.models.draft_from_teacher`), run through the fast engine. The CPU times here say
# nothing about a GPU; the step counts and acceptances are what to read. The exactness check is greedy decoding:
# a greedy speculative run must emit exactly the target's own greedy tokens.

# %%
from flashspec import models

torch.set_num_threads(1)  # 64-wide matrices: more threads only add overhead
target = models.tiny_llama(vocab_size=64, hidden_size=64, num_layers=3, num_heads=4,
                           initializer_range=0.3, seed=0)
draft = models.draft_from_teacher(target, (0, 2))
prompts = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
decoder = fs.FastSpeculativeDecoder(target, [draft], policy="fixed", gamma=4, lag=2)

sampled = decoder.generate(prompts, max_new_tokens=16, seed=0, ignore_eos=True,
                           sampling=fs.SamplingParams(temperature=1.0))
summary = sampled.stats.summary()
predicted = stats.tokens_per_step_from_token_acceptance(summary["token_acceptance"], 4)
print(f"T = 1, B = 2: {summary['steps']} steps, {summary['generated_tokens']} tokens; "
      f"token acceptance {summary['token_acceptance']:.2f}")
print(f"  tokens per step {summary['mean_tokens_per_step']:.2f}; "
      f"(1-α^(γ+1))/(1-α) = {predicted:.2f} at that α")

greedy = decoder.generate(prompts, max_new_tokens=16, seed=0, ignore_eos=True,
                          sampling=fs.SamplingParams(temperature=0.0))
reference = target.generate(prompts, do_sample=False, max_new_tokens=16,
                            min_new_tokens=16, pad_token_id=0,
                            attention_mask=torch.ones_like(prompts))
width = prompts.shape[1]
same = torch.equal(greedy.sequences[:, width:], reference[:, width:])
print(f"greedy: {greedy.stats.summary()['steps']} steps; "
      f"equal to target.generate's greedy tokens: {same}")
assert same, "greedy speculative decoding must reproduce the target's greedy tokens"

# %% [markdown]
# Compare the measured tokens per step with the geometric model's prediction from the same run's token
# acceptance: they part where the budget of 16 tokens trims the last step, and where positions do not accept
# alike. Change `lag` to 1 or 4 and rerun: with `policy="fixed"` nothing the host reads feeds back into the step, so the tokens are the
# same; with a bandit, a longer lag only makes the policy learn from older steps.

# %% [markdown]
# ## Measured on an H200: the fast path against Hugging Face
#
# `experiments/bench_fast.py` runs, side by side in one process, Hugging Face `generate` (plain decoding) and the
# fast path: plain decoding on the same runner and graphs, speculative decoding with one draft, and with a pool
# (the draft plus prompt lookup) under Thompson sampling, once with drafts caught up lazily and once kept in sync.
# The models are a TinyLlama-1.1B-shaped target and a llama-68m-shaped draft with random weights in bf16, so the
# acceptance is an artefact of random weights while every cost is real; γ = 4, T = 1, 256 new tokens, one warm-up
# request, then three timed repeats per method, with the layers' dense regions compiled (`--compile default`).

# %% tags=["remove-input"]
record = provenance.load_result("bench_fast_b1_b8_compile_h200.json")
meta = record["provenance"]
print(f"results/bench_fast_b1_b8_compile_h200.json: {meta['hardware']['gpu']}, "
      f"torch {meta['versions']['torch']}, {meta['date_utc'][:10]}")
cells = {cell["batch"]: cell["methods"] for cell in record["results"]["cells"]}
labels = {"hf_plain": "HF generate", "fast_plain": "fast plain",
          "fast_speculative_one_draft": "fast speculative, one draft",
          "fast_speculative": "fast spec., pool, lazy catch-up",
          "fast_speculative_sync_all": "fast spec., pool, drafts synced"}
header = "".join(f"{f'B = {batch} tok/s':>14}{'× HF':>7}" for batch in cells)
print(f"\n{'method':<32}{header}")
for method, label in labels.items():
    speeds = [(methods[method]["tok_s_median"], methods["hf_plain"]["tok_s_median"])
              for methods in cells.values()]
    row = "".join(f"{speed:>14.0f}{speed / hf:>7.1f}" for speed, hf in speeds)
    print(f"{label:<32}{row}")
print("median of 3 timed repeats; × HF: over HF generate in the same run")

for batch, methods in cells.items():
    over_plain = stats.compare_runs(methods["fast_plain"]["seconds"],
                                    methods["fast_speculative_one_draft"]["seconds"])
    glue(f"spec_over_plain_b{batch}", over_plain.ratio, display=False)
    glue(f"spec_over_plain_low_b{batch}", over_plain.low, display=False)
    glue(f"spec_over_plain_high_b{batch}", over_plain.high, display=False)
    glue(f"fast_over_hf_b{batch}", methods["fast_plain"]["tok_s_median"]
         / methods["hf_plain"]["tok_s_median"], display=False)
    glue(f"one_draft_tokens_b{batch}",
         methods["fast_speculative_one_draft"]["mean_tokens_per_step"], display=False)
graphs_only = provenance.load_result("bench_fast_b1_h200.json")
assisted = graphs_only["results"]["cells"][0]["methods"]
glue("graphs_over_assisted", assisted["fast_speculative"]["tok_s_median"]
     / assisted["hf_assisted"]["tok_s_median"], display=False)

# %% [markdown]
# Read the table in two steps. Taking the host out of the step is most of the gain: fast *plain* decoding is
# {glue:text}`fast_over_hf_b1:.1f`× Hugging Face's `generate` at B = 1 and {glue:text}`fast_over_hf_b8:.1f`× at
# B = 8, with no speculation at all. Speculation then multiplies what is left: one draft makes
# {glue:text}`spec_over_plain_b1:.2f`× fast plain decoding at B = 1 (over the repeats
# {glue:text}`spec_over_plain_low_b1:.2f`–{glue:text}`spec_over_plain_high_b1:.2f`×) and
# {glue:text}`spec_over_plain_b8:.2f`× at B = 8 ({glue:text}`spec_over_plain_low_b8:.2f`–{glue:text}`spec_over_plain_high_b8:.2f`×),
# at {glue:text}`one_draft_tokens_b1:.2f` tokens per step from a random-weight draft. The identity of the first
# section says why the gain is modest: a speculative step costs a (γ+1)-token target forward plus γ draft forwards,
# so it must bring more tokens than it costs plain steps. Against Hugging Face's assisted generation
# (`generate(assistant_model=...)`, which cannot batch), a graphs-only run of the same benchmark measured fast
# speculative decoding at {glue:text}`graphs_over_assisted:.1f`× (B = 1, `results/bench_fast_b1_h200.json`).
#
# The pool rows cost more than one draft here: prompt lookup rarely helps on random text, and a policy still
# exploring meets new (arm, bucket) graphs mid-request. Every other fast-path measurement — the runner alone,
# graphs without compiling, max-autotune, B = 32, an NF4 target, a trained pair, the step's anatomy and the eager
# engine's benchmark — is in the lab notebook's {doc}`fast-path records </book/lab/fast_path>`.
#
# ## Against the fastest plain decoder: gpt-fast
#
# Hugging Face `generate` is what a user has at hand; gpt-fast {cite}`gptfast2023` is what a user picks for speed
# without a serving engine: a static KV cache and the whole decode step compiled into one graph. With `--compile`
# the fast path does the same (`compile_scope="forward"`, the default scope): each model's decode and verify
# forwards become one graph each, every layer's q/k/v and gate/up projections one matmul each, attention over the
# whole cache. `flashspec bench peers` runs both on the same random bf16 weights (converted into gpt-fast's layout,
# logits checked against Hugging Face's first), each system in its own process: a 32-token prompt, T = 1, B = 1,
# 256 new tokens, three timed requests after one that compiles.

# %% tags=["remove-input"]
peers_table, peer_meta = {}, None
for name in ("peers_h200_flashspec_plain.json", "peers_h200_gptfast_plain.json",
             "peers_h200_7b_plain.json"):
    peer_record = provenance.load_result(name)
    peer_meta = peer_record["provenance"]
    for shape, systems in peer_record["results"]["cells"].items():
        for system, methods in systems.items():
            peers_table[(shape, system)] = methods["plain"]
print(f"results/peers_h200_*.json: {peer_meta['hardware']['gpu']}, "
      f"torch {peer_meta['versions']['torch']}, {peer_meta['date_utc'][:10]}")
print(f"\n{'shape':<16}{'FlashSpec tok/s':>16}{'gpt-fast tok/s':>16}"
      f"{'ratio':>7}{'compile s':>12}")
for shape in ("smollm2-135m", "tinyllama-1.1b", "llama-2-7b"):
    ours = peers_table[(shape, "flashspec")]
    theirs = peers_table[(shape, "gpt-fast")]
    spreads = [f"{run['tok_s_min']:.0f}–{run['tok_s_max']:.0f}"
               for run in (ours, theirs)]
    speedup = ours["tok_s_median"] / theirs["tok_s_median"]
    compiles = f"{ours['first_request_s']:.0f} / {theirs['first_request_s']:.0f}"
    print(f"{shape:<16}{spreads[0]:>16}{spreads[1]:>16}{speedup:>7.2f}{compiles:>12}")
    glue(f"peer_ratio_{shape.split('-')[0]}", speedup, display=False)
print("min–max of 3 timed requests; ratio of the medians;")
print("compile s: the first request's seconds, FlashSpec / gpt-fast")
floor_ms = provenance.load_result("peers_h200_7b_plain.json")["results"]["hbm_floor_ms"]
step_7b_ms = 1e3 / peers_table[("llama-2-7b", "flashspec")]["tok_s_median"]
glue("peer_7b_ms", step_7b_ms, display=False)
glue("peer_7b_floor_ms", floor_ms["llama-2-7b"], display=False)
glue("peer_7b_over_floor", step_7b_ms / floor_ms["llama-2-7b"], display=False)

# %% [markdown]
# The fast path's plain step runs {glue:text}`peer_ratio_smollm2:.2f`× gpt-fast's on SmolLM2-135M's shape (30 thin
# layers: a step that is almost all kernel launches) and {glue:text}`peer_ratio_llama:.2f`× on Llama-2-7B's, but
# {glue:text}`peer_ratio_tinyllama:.2f`× on TinyLlama-1.1B's. One difference is visible in the code: gpt-fast
# compiles sampling into its decode graph, while the fast path compiles its sampler and its commit as graphs of
# their own beside the forward's (all replayed inside one CUDA graph), which is more kernels per token; how much
# of the gap that is has not been measured. The 7B step takes {glue:text}`peer_7b_ms:.2f` ms per token (the prefill
# included) against a floor of {glue:text}`peer_7b_floor_ms:.2f` ms to read its weights once at the measured copy
# bandwidth: {glue:text}`peer_7b_over_floor:.2f`× the floor.
#
# Speculation against speculation: the same benchmark runs gpt-fast's speculative decoder (TinyLlama-1.1B with a
# llama-68m draft, γ = 4; gpt-fast reads the accepted count back to the host every step) beside the fast path's,
# both exact and with the same draft, in one run on one machine, an H100 here.

# %% tags=["remove-input"]
spec_record = provenance.load_result("peers_h100_81934c9.json")
spec_meta = spec_record["provenance"]
spec_cells = spec_record["results"]["cells"]["tinyllama-1.1b"]
print(f"results/peers_h100_81934c9.json: {spec_meta['hardware']['gpu']}, "
      f"torch {spec_meta['versions']['torch']}, {spec_meta['date_utc'][:10]}")
print(f"\n{'TinyLlama-1.1B':<16}{'FlashSpec tok/s':>16}{'gpt-fast tok/s':>16}"
      f"{'ratio':>7}{'tok/step':>12}")
for method in ("plain", "speculative"):
    ours, theirs = (spec_cells[system][method]
                    for system in ("flashspec", "gpt-fast"))
    spreads = [f"{run['tok_s_min']:.0f}–{run['tok_s_max']:.0f}"
               for run in (ours, theirs)]
    speedup = ours["tok_s_median"] / theirs["tok_s_median"]
    steps = " / ".join(f"{run.get('tokens_per_step', 1.0):.2f}"
                       for run in (ours, theirs))
    print(f"{method:<16}{spreads[0]:>16}{spreads[1]:>16}"
          f"{speedup:>7.2f}{steps:>12}")
    glue(f"h100_{method}_ratio", speedup, display=False)
for system, label in (("flashspec", "ours"), ("gpt-fast", "theirs")):
    glue(f"h100_spec_{label}", spec_cells[system]["speculative"]["tok_s_median"],
         display=False)
print("min–max of 3 timed requests; ratio of the medians;")
print("tok/step: tokens per target step, FlashSpec / gpt-fast")

# %% [markdown]
# The fast path's speculative decoder makes {glue:text}`h100_spec_ours:.0f` tok/s against gpt-fast's
# {glue:text}`h100_spec_theirs:.0f`: {glue:text}`h100_speculative_ratio:.2f`× at about the same tokens per step.
# gpt-fast's speculation is slower than its own plain decoding on this pair, because every step waits for the
# host; the fast path's never does. On this machine the plain steps compare as
# {glue:text}`h100_plain_ratio:.2f`×; the H100 machines lent for these runs disagree with one another by more than
# that ratio's distance from 1 (the lab notebook's {doc}`fast-path records </book/lab/fast_path>` list each run).
#
# ## Past one GPU
#
# A target too large for one GPU runs tensor-parallel: `flashspec.tp` shards its decoder layers over the ranks of a
# `torchrun` job with PyTorch's DTensor plan (each rank holds 1/N of every layer's weights and KV cache; two
# all-reduces per layer rebuild the hidden state), while the drafts, the policy and `verify` run replicated. No
# token is broadcast: every rank computes bitwise the same logits after each all-reduce and draws the same
# counter-based uniforms, so every rank emits the same tokens and Theorem 1 holds rank by rank; the ranks compare
# hashes of the emitted tokens every 16 steps and stop with an error naming the step if they ever differ.
# `torchrun --nproc-per-node 2 -m flashspec generate --tp --prompt "..."` runs it; the H200 measurements and why
# two GPUs do not halve the step are in the {doc}`tensor-parallel records </book/lab/tensor_parallel>`.
#
# ## Summary
#
# * Tokens/s is tokens per step over time per step. With a per-token acceptance α the expected tokens per step
#   is $(1-\alpha^{\gamma+1})/(1-\alpha)$, not $\gamma\alpha+1$; a throughput, a step latency and an acceptance
#   reported together must come from one run to satisfy that identity.
# * On a GPU, a small model's step is bound by the host, not by the bytes it reads. The fast path keeps the
#   caches static, replays each step from a CUDA graph and reads outcomes `lag` steps late; the policy still
#   chooses from the past, so the output stays exactly the target's.
# * Speculation pays only when a step brings more tokens than it costs plain steps.
#
# **Exercises.** (1) With γ = 4, what token acceptance makes a speculative step that costs 1.5 plain steps break
# even? (`stats.token_acceptance_from_tokens_per_step` inverts the formula.) (2) Rerun the live cell with
# `gamma=2` and `gamma=8`: how do the steps and the token acceptance move? (3) Time the live cell's two runs with
# `lag=1` and `lag=4`, and check that the fixed policy's tokens do not change.
