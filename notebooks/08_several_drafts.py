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
# # Several drafts verified together
#
# One drafted chain is a single guess: once its first token is rejected, the step ends, however good the other
# drafts' guesses were. A pool already drafts several chains each step (model drafts, prompt lookup, several
# samples of one draft); **multi-path verification** judges them all against one target forward over the tree
# they form, and keeps the longest prefix any of them shares with an exact sample of the target. The method is
# recursive rejection sampling down the tree, in the line of SpecInfer {cite}`miao2024specinfer`: at every node
# the siblings are tried in turn, and each rejection leaves a residual for the next.
#
# This chapter states the algorithm, proves that the output law is the target's (and names the choices that break
# it), checks the proof by exact enumeration and by sampling through both backends of
# `flashspec.paths.verify_paths`, and reads what it keeps on a real model from a committed record.

# %% tags=["hide-input"]
import itertools
import os
import random
import sys
from collections import defaultdict
from fractions import Fraction
from math import prod

# the Colab copy of this chapter installs the package first
ON_COLAB = "google.colab" in sys.modules

import torch

import flashspec as fs
from flashspec_lab import exactness, exactness_paths, provenance
from flashspec_lab.pages import glue  # glue: numbers in the prose

device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
print(
    f"flashspec {fs.__version__}, torch {torch.__version__}, running on "
    f"{device_name}{' (Colab)' if ON_COLAB else ''}"
)

# %% [markdown]
# ## The algorithm
#
# Each of $K$ paths is a chain of $\gamma$ tokens; path $k$ was drafted from its own distributions $q^k$ (one per
# prefix), independently of the other paths given the step's prefix. Paths that agree on their first $d$ tokens
# share a node at depth $d$ of a tree, and the target scores every node once: $p(\cdot \mid s)$ for each node $s$.
# Verification walks down the tree from the root:
#
# 1. At node $s$ (depth $d$), the **active** paths are those whose first $d$ tokens spell $s$. The residual starts as
#    $r = p(\cdot\mid s)$.
# 2. The active paths are tried in a fixed order. Path $k$'s token $x = x^k_d$ is accepted with probability
#    $\min\!\big(1,\ r(x)/q^k(x\mid s)\big)$; the step moves to node $s x$, keeping the paths that drafted $x$.
# 3. After each rejection the residual becomes $r \leftarrow (r - q^k(\cdot\mid s))^+ / \rho_k$, where
#    $\rho_k = \sum_v (r - q^k)^+(v)$ is the probability that the test rejects.
# 4. If every active path is rejected, the step emits one token drawn from the last residual and ends; at depth
#    $\gamma$ it emits the bonus token, drawn from $p(\cdot\mid s)$.
#
# With $K = 1$ this is token verification (chapter 1). A deterministic proposal (prompt lookup) is a sample from
# the one-hot law at its token, so it enters with $q^k = \delta_x$: it is accepted with probability $r(x)$.

# %% [markdown]
# ## Why the output law is the target's
#
# **Lemma (one node).** Let the proposals $x^1,\dots,x^m$ at node $s$ be independent, $x^k \sim q^k$, and
# independent of everything that decided which paths are tried and in which order. Then the token that leaves the
# node (the accepted one, or the residual draw) has law $p(\cdot\mid s)$.
#
# *Proof.* By induction on the number of siblings left, for any starting residual $r$: the procedure emits $y$
# with probability $r(y)$. With none left it draws from $r$. With sibling $k$ next, it emits $y$ by accepting $y$,
# probability $q^k(y)\min(1, r(y)/q^k(y)) = \min(q^k(y), r(y))$, or by rejecting, probability $\rho_k$, and then
# (the induction hypothesis, which applies because $x^{k+1},\dots$ are independent of $x^k$ and of its test)
# emitting $y$ from the new residual:
# $\min(q^k(y), r(y)) + \rho_k \cdot (r(y) - q^k(y))^+/\rho_k = r(y)$. Starting from $r = p(\cdot \mid s)$ gives the
# lemma. $\square$
#
# **Theorem (the step).** The tokens a step emits, completed to $\gamma+1$ tokens by sampling the target, have the
# target's law.
#
# *Proof.* By induction on the depth. The first token has law $p(\cdot\mid\text{prefix})$ by the lemma at the root.
# Given that the step moved to node $s x$, the paths that stay active drafted $x$; for each of them, the next token
# given its first $d+1$ tokens is a fresh draw from $q^k(\cdot\mid s x)$ by the chain rule of its own sampling, and
# what happened at node $s$ (the tests, the order) depended on the paths' tokens up to depth $d$ and on the
# accept uniforms only. So the lemma applies again at $s x$. If the step ended at $s$ with a residual draw, the
# completion samples the target from there. Either way each next token has law $p(\cdot\mid\text{what came
# before})$, which is the target's law of the whole sequence. $\square$
#
# **What it rests on**, and the ways of getting it almost right:
# - *The residual.* Each rejection must leave $(r - q^k)^+$; testing every sibling against $p$ unchanged
#   over-emits tokens that several drafts like.
# - *Order and choice fixed before the tokens are seen.* Trying the paths in the order of the target's liking for
#   their tokens, or verifying only the path the target likes best, makes the order depend on the proposals
#   themselves, and the lemma's independence fails.
# - *Not needed:* that a path's $q^k$ is its true sampling law. Verifying a sampled path as if it were certain
#   ($q^k = \delta_{x}$) is exact too, since the lemma holds for any $q^k$ the token was drawn from, and a token is
#   a draw from its own one-hot law given itself. It only accepts less often: with probability $r(x)$ instead of
#   $\min(1, r(x)/q^k(x))$.

# %% [markdown]
# ## Checking it exactly
#
# The cell below enumerates one step with rational arithmetic: a target and two drafts as random tables over
# $V = 3$ tokens (one distribution per prefix), $\gamma = 2$, two paths. For every pair of drafted paths it follows
# the algorithm's branches with their probabilities, completes each output with the target, and compares the
# law with the target's. Beside it stand the two broken variants above that can be enumerated: the unchanged
# residual, and the paths tried in the order of the target's liking for their first token.

# %%
V, GAMMA, K = 3, 2, 2
draw = random.Random(8)


def random_law() -> tuple[Fraction, ...]:
    weights = [Fraction(draw.randint(1, 9)) for _ in range(V)]
    return tuple(weight / sum(weights) for weight in weights)


prefixes = [
    c for n in range(GAMMA + 1) for c in itertools.product(range(V), repeat=n)
]
P = {prefix: random_law() for prefix in prefixes}  # the target
Q = [
    {prefix: random_law() for prefix in prefixes if len(prefix) < GAMMA}
    for _ in range(K)
]  # two drafts
VARIANTS = (
    "one path",
    "two paths",
    "two paths, unchanged residual",
    "two paths, liked first",
)


def node(
    variant: str,
    paths: list[tuple[int, ...]],
    order: list[int],
    s: tuple[int, ...],
    active: list[int],
    mass: Fraction,
    out: dict,
) -> None:
    """Follow the algorithm from node s with probability `mass`; add each emitted
    sequence's mass to `out`."""
    depth = len(s)
    if depth == GAMMA:
        for y in range(V):
            out[s + (y,)] += mass * P[s][y]
        return
    r = list(P[s])
    for k in (k for k in order if k in active):
        x, q = paths[k][depth], Q[k][s]
        accept = min(Fraction(1), r[x] / q[x])
        if accept > 0:
            node(
                variant,
                paths,
                order,
                s + (x,),
                [j for j in active if paths[j][depth] == x],
                mass * accept,
                out,
            )
        mass *= 1 - accept
        if variant != "two paths, unchanged residual":
            left = [max(r[v] - q[v], Fraction(0)) for v in range(V)]
            r = [v / sum(left) for v in left] if sum(left) > 0 else r
    for y in range(V):
        out[s + (y,)] += mass * r[y]


def step_law(variant: str) -> tuple[dict, Fraction]:
    """The completed law of one step's output (GAMMA + 1 tokens) and its expected
    emitted tokens."""
    law, emitted = defaultdict(Fraction), Fraction(0)
    used = [0] if variant == "one path" else list(range(K))
    for paths in itertools.product(
        itertools.product(range(V), repeat=GAMMA), repeat=len(used)
    ):
        chance = prod(
            Q[k][paths[k][:n]][x] for k in used for n, x in enumerate(paths[k])
        )
        order = used
        if (
            variant == "two paths, liked first"
        ):  # the order depends on the drafted tokens: broken
            order = sorted(used, key=lambda k: -P[()][paths[k][0]])
        out = defaultdict(Fraction)
        node(variant, list(paths), order, (), used, chance, out)
        for sequence, mass in out.items():
            emitted += mass * len(sequence)
            for tail in itertools.product(range(V), repeat=GAMMA + 1 - len(sequence)):
                full = sequence + tail
                law[full] += mass * prod(
                    P[full[:n]][full[n]] for n in range(len(sequence), GAMMA + 1)
                )
    return law, emitted


def target_law(sequence: tuple[int, ...]) -> Fraction:
    return prod(P[sequence[:n]][s] for n, s in enumerate(sequence))


sequences = list(itertools.product(range(V), repeat=GAMMA + 1))
exact_emitted = {}
print(f"{'verifier':30s} {'max |law - target|':>19s} {'E[tokens]':>10s}")
for variant in VARIANTS:
    law, emitted = step_law(variant)
    gap = max(abs(law[s] - target_law(s)) for s in sequences)
    exact_emitted[variant] = emitted
    print(f"{variant:30s} {float(gap):19.3g} {float(emitted):10.4f}")
glue("exact_one_path", float(exact_emitted["one path"]), display=False)
glue("exact_two_paths", float(exact_emitted["two paths"]), display=False)

# %% [markdown]
# One path and two paths give the target's law with no error at all; the second path raises the expected tokens
# per step from {glue:text}`exact_one_path:.3f` to {glue:text}`exact_two_paths:.3f`. Both broken variants move the
# law away from the target's.
#
# ## Checking `verify_paths` by sampling
#
# The same test through the library, on the exactness suite's toy models (chapter 1): 20,000 sequences of three
# tokens decoded by multi-path speculation, several drafts' chains (or several samples of one draft) verified
# together each step, then a $\chi^2$ test of the sequences' frequencies against exact enumeration of the target.
# It runs on the PyTorch reference, and on the Triton kernel where Triton can run (a GPU, or its CPU interpreter
# with `TRITON_INTERPRET=1`); the kernel draws the same numbers as the reference from one key. The three broken
# variants (the two above and "verify only the path the target likes best") must fail the same test.

# %%
TOY_VOCAB, LENGTH, ROWS = 4, 3, 20_000
target = exactness.make_toy(TOY_VOCAB, seed=1)
drafts = [
    exactness.make_toy(TOY_VOCAB, seed=2),
    exactness.make_toy(TOY_VOCAB, seed=3, scale=0.8),
]
truth = exactness.exact_sequence_probs(target, fs.SamplingParams(1.0), LENGTH)
backends = ["torch"] + (
    ["triton"]
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    else []
)
checks = [
    (f"two drafts, {backend}", exactness_paths.library_paths_verifier(backend))
    for backend in backends
]
checks += [
    (f"broken: {name}", control)
    for name, control in exactness_paths.PATHS_NEGATIVE_CONTROLS.items()
]
print(f"{'verifier':34s} {'chi2':>9s} {'dof':>4s} {'p':>8s}")
fits = {}
for name, verifier in checks:
    sequences = exactness_paths.sample_sequences_paths(
        target,
        drafts,
        fs.SamplingParams(1.0),
        2,
        ROWS,
        LENGTH,
        seed=11,
        verifier=verifier,
    )
    fits[name] = exactness.chi_square_test(sequences, truth, TOY_VOCAB)
    print(
        f"{name:34s} {fits[name].statistic:9.1f} {fits[name].dof:4d} "
        f"{fits[name].p_value:8.3g}"
    )
ALPHA = 1e-3  # each test's level
assert all(
    fit.passes(ALPHA) != name.startswith("broken") for name, fit in fits.items()
)
glue("chi_backends", " and ".join(backends), display=False)

# %% [markdown]
# The library passes on {glue:text}`chi_backends` and every broken variant is rejected by a wide margin. The test
# suite runs the same check on more configurations (several samples of one draft, top-$k$ and top-$p$ sampling,
# deterministic proposals, and sampled paths verified as certain, which must pass), on both backends.
#
# ## One target forward over the tree
#
# The $K$ paths are scored by one forward of the target. Node $i$ of the tree (node 0 is the root, the pending
# token) is written at cache slot root $+\,i$, sits at position root $+$ depth$(i)$, and sees the slots before the
# root and those of its ancestors and itself: siblings never see each other, so every node's logits are those a
# chain forward of its own path would give. The rotary embedding is applied to a key before it is stored, so once
# a path is kept its keys and values can be copied to the slots of their positions (`keep_path`), and the static
# cache holds slot = position again. `flashspec.runner.TokenTree` is the shape of the tree (shared by the rows),
# `LlamaRunner.tree_forward` scores it; here two paths that share their first drafted token, on a tiny random
# Llama, against a chain forward of each path:

# %%
from flashspec import models
from flashspec.runner import LlamaRunner, TokenTree

tiny = models.tiny_llama(vocab_size=32, hidden_size=32, num_layers=2, num_heads=4,
                         num_kv_heads=2, initializer_range=0.3, seed=0)
tree = TokenTree([-1, 0, 1, 2, 1, 4])        # paths 0-1-2-3 and 0-1-4-5
prompt = torch.tensor([[5, 9, 2, 7, 11, 3]])
nodes = torch.tensor([[4, 8, 1, 6, 13, 10]])  # node i's token; node 0 the pending one
root = torch.tensor([prompt.shape[1]])         # its position

def fresh_runner() -> LlamaRunner:
    runner = LlamaRunner(tiny, max_batch=1, max_len=32)
    runner.prefill(prompt, torch.ones_like(prompt))
    return runner

scored = fresh_runner()
tree_logits = scored.tree_forward(nodes, root, tree, bucket=16)
gap = 0.0
for leaf in (3, 5):
    path = tree.path(leaf)
    chain = fresh_runner().forward(nodes[:, path], root[:, None] + torch.arange(4),
                                   bucket=16)
    gap = max(gap, float((tree_logits[:, path] - chain).abs().max()))
print(f"largest |tree - chain| logit difference over both paths: {gap:.1e}")
glue("tree_gap", f"{gap:.1e}", display=False)

# %% [markdown]
# The logits agree to {glue:text}`tree_gap` (float32 rounding). The test suite goes on from here: after
# `keep_path` the cache and the next token's logits equal the chain's, and decoding three tokens over several
# steps with `tree_forward`, `verify_paths` and `keep_path` passes the $\chi^2$ test of the target's joint law,
# while a run that keeps the other path's keys and values fails it (`tests/test_runner.py`).
# `flashspec.FastPathsDecoder` is that step on the fast path: each step every draft drafts a chain, the
# target scores their tree, the chains are verified together and the kept path is moved into place; its
# $\chi^2$ test and the control that skips `keep_path` are in `tests/test_fast.py`. A feature draft (chapter 5)
# can be one of the drafts: the tree forward writes each node's target hidden states at the node's slot, and
# `keep_path` moves the kept path's states with its keys and values, so the next step's feature draft reads
# what a chain forward would have left (`tests/test_features.py`, with a control that leaves them behind).
#
# ## On a real model
#
# The record below verifies, at each step of a decode of SmolLM2-135M-Instruct {cite}`smollm2` on the chat prompt
# set (chapter 7's workload and draft), $K$ chains sampled from the draft, and reports the expected tokens per step
# of token and block verification of one chain (chapter 7) and of multi-path verification of $K = 1, 2, 3$
# chains, each estimated on the same contexts (`experiments/paths_gain.py`,
# `results/paths_gain_smollm2_cpu.json`).

# %%
record = provenance.load_result("paths_gain_smollm2_cpu.json")
settings, summary = record["settings"], record["results"]["summary"]["T=1"]
glue("pg_gamma", settings["gamma"], display=False)
glue("pg_prompts", settings["prompts_per_category"], display=False)
print(
    f"{'category':14s} {'token':>6s} {'block':>6s} {'K=1':>6s} {'K=2':>6s} "
    f"{'K=3':>6s} {'K=3/block':>10s}"
)
for category, row in summary.items():
    print(
        f"{category:14s} {row['token']:6.3f} {row['block']:6.3f} "
        f"{row['paths1']:6.3f} {row['paths2']:6.3f} "
        f"{row['paths3']:6.3f} {row['paths_over_block']:10.3f}"
    )
print("tokens per step at T = 1; K chains of one draft verified together")
mixed = summary["mixed"]
glue("pg_block", mixed["block"], display=False)
glue("pg_paths3", mixed["paths3"], display=False)
glue("pg_ratio", mixed["paths_over_block"], display=False)
glue("pg_gain", mixed["paths_minus_block"], display=False)
glue("pg_gain_se", mixed["paths_minus_block_standard_error"], display=False)
made = record["provenance"]
print(
    f"measured on {made['hardware'].get('cpu') or 'a CPU'} "
    f"({made['hardware'].get('cpu_count')} cores), {made['date_utc'][:10]}"
)

# %% [markdown]
# Over the mixed prompt set, three chains verified together make {glue:text}`pg_paths3:.3f` tokens per step
# against {glue:text}`pg_block:.3f` for one chain with block verification: {glue:text}`pg_ratio:.2f`× (a gain of
# {glue:text}`pg_gain:.3f` ± {glue:text}`pg_gain_se:.3f`), with $\gamma=$ {glue:text}`pg_gamma` and
# {glue:text}`pg_prompts` prompts per category. The chains here are samples of one weak two-layer draft, so they
# often agree with each other and are rejected together; paths from different drafts (a model draft and prompt
# lookup) err differently, which is where the gain should grow. `FastPathsDecoder` realises it with different
# drafts (`experiments/paths_decoder_cpu.py`, this CPU, {glue:text}`pd_prompts` prompts per category, 64 new
# tokens each, γ = 4, T = 1): the two-layer draft above, a feature draft distilled on the same CPU that reads
# the target's hidden states (chapter 5), and prompt lookup. Each paths decoder is set against the best single
# block-verified chain of its own drafts, the best chosen per category:

# %%
realised = provenance.load_result("paths_decoder_features_smollm2_cpu.json")
by_category = realised["results"]["summary"]["T=1"]
mixed_run = by_category["mixed"]
glue("pd_prompts", realised["settings"]["prompts_per_category"], display=False)
LABELS = {"chain_block": "chain: token draft",
          "chain_block_features": "chain: feature draft",
          "chain_block_lookup": "chain: prompt lookup",
          "paths_draft_x2_lookup": "paths: 2 token drafts + lookup",
          "paths_features_lookup": "paths: feature + lookup",
          "paths_features_draft_lookup": "paths: feature + token + lookup",
          "paths_features_x2_lookup": "paths: 2 feature + lookup"}
print(f"{'mixed set':32s} {'tokens/step':>14s} {'× best chain':>13s}")
for name, label in LABELS.items():
    ratio = mixed_run.get(f"{name}_over_best_chain")
    cell = f"{mixed_run[name]:.3f} ± {mixed_run[f'{name}_standard_error']:.3f}"
    print(f"{label:32s} {cell:>14s} {'' if ratio is None else f'{ratio:.2f}×':>13s}")
paths_names = [name for name in LABELS if name.startswith("paths")]
best = max(paths_names, key=lambda name: mixed_run[f"{name}_over_best_chain"])
print(f"\n{LABELS[best]}, per category (× the best chain of its drafts):")
for category, row in by_category.items():
    if category != "mixed":
        ratio, chain = row[f"{best}_over_best_chain"], row[f"{best}_best_chain"]
        print(f"  {category:14s} {row[best]:.3f}  {ratio:.2f}× ({LABELS[chain]})")
made = realised["provenance"]
print(f"measured on {made['hardware'].get('cpu') or 'a CPU'} "
      f"({made['hardware'].get('cpu_count')} cores), {made['date_utc'][:10]}")
glue("pd_best", LABELS[best].removeprefix("paths: "), display=False)
glue("pd_best_ratio", mixed_run[f"{best}_over_best_chain"], display=False)
glue("pd_best_chain", LABELS[mixed_run[f"{best}_best_chain"]].removeprefix("chain: "),
     display=False)
for name in ("paths_draft_x2", "paths_draft_lookup", "paths_features_draft_lookup"):
    glue(f"{name}_ratio", mixed_run[f"{name}_over_best_chain"], display=False)
for name in ("paths_features_draft_lookup", "chain_block_features"):
    glue(f"{name}_tokens", mixed_run[name], display=False)
    glue(f"{name}_se", mixed_run[f"{name}_standard_error"], display=False)

# %% [markdown]
# Over the mixed set the best of these against its own chains, {glue:text}`pd_best`, makes
# {glue:text}`pd_best_ratio:.2f`× the tokens per step of the best single chain of its drafts (the
# {glue:text}`pd_best_chain`). A second path from another kind of draft gains more than a second sample of the
# same one: the token draft with prompt lookup makes {glue:text}`paths_draft_lookup_ratio:.2f`× its chain, two
# samples of it {glue:text}`paths_draft_x2_ratio:.2f`×, since samples of one draft often agree and are rejected
# together. The feature draft, the strongest single chain here
# ({glue:text}`chain_block_features_tokens:.3f` ± {glue:text}`chain_block_features_se:.3f`), raises the bar it is
# measured against: the three different drafts together make
# {glue:text}`paths_features_draft_lookup_tokens:.3f` ± {glue:text}`paths_features_draft_lookup_se:.3f` tokens
# per step, {glue:text}`paths_features_draft_lookup_ratio:.2f`× that chain. These drafts were distilled for
# minutes on a CPU; how the gain moves with stronger drafts is a measurement of its own. In time, $K$ paths cost
# one target forward over up to $K\gamma$ tree tokens instead of $\gamma$, and one chain per model draft (prompt
# lookup's is free): whether the extra tokens per step pay for that is a question for the step anatomy on the
# GPU (chapters 2 and 4).
#
# ## Summary
#
# - Multi-path verification tries the active paths at each node in a fixed order, accepting token $x$ of path $k$
#   with probability $\min(1, r(x)/q^k(x))$ and leaving the residual $(r - q^k)^+$ after each rejection.
# - Its output law is the target's (the lemma and theorem above; exact enumeration; a $\chi^2$ test through
#   `verify_paths` on both backends); changing the residual, or choosing or ordering the paths by their tokens,
#   breaks it and is caught.
# - Paths may be samples of their drafts or fixed proposals verified as certain; both are exact.
# - One target forward scores the whole tree (`LlamaRunner.tree_forward`: each node sees its ancestors only), and
#   `keep_path` moves the kept path's keys and values to the slots of their positions; `FastPathsDecoder` runs
#   the whole multi-path step on the fast path.
# - On SmolLM2 with three samples of a small draft it keeps {glue:text}`pg_ratio:.2f`× the tokens per step of one
#   block-verified chain.
# - Realised on SmolLM2 with different drafts, {glue:text}`pd_best` makes {glue:text}`pd_best_ratio:.2f`× the
#   tokens per step of the best single block-verified chain of its drafts.
