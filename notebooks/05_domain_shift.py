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
# runs on can download any. So `flashspec.zoo` trains its own small family offline: a tokenizer, a target on a
# mixture of local corpora, one specialist draft per domain and one generalist, through the same
# `save_pretrained`/`from_pretrained` path that loads TinyLlama from the hub on Colab.
#
# This chapter shows the zoo's evidence from the committed result files: the acceptance matrix (is each
# specialist really best on its own domain?) and the switching workload (does a bandit follow the domain, and what
# does that buy in tokens/s against a per-domain oracle and the best single draft?). The bandit theory is in the
# previous chapter; Theorem 1 (chapter 1) is why the choice of draft, made from past steps only, cannot change the
# output distribution — only its speed.

# %%
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ON_COLAB = "google.colab" in sys.modules  # Colab imports it into every kernel at start-up
if ON_COLAB:  # fetch the repository (code and committed results) and install the package into this runtime
    if not Path("flashspec").exists():
        subprocess.run(["git", "clone", "--depth", "1", "https://github.com/flashspec/flashspec"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "./flashspec"], check=True)
    os.chdir("flashspec/notebooks")
    importlib.invalidate_caches()

import torch

# %matplotlib inline
from IPython.display import Markdown, display

import flashspec as fs
from flashspec import plots, zoo

RESULTS = next(path / "results" for path in (Path.cwd(), *Path.cwd().parents) if (path / "_toc.yml").exists())
print(f"flashspec {fs.__version__}, torch {torch.__version__}, running on "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}{' (Colab)' if ON_COLAB else ''}")


def caption(record: dict, what: str) -> Markdown:
    """A figure caption naming the hardware, the date and the command that regenerates the file."""
    return Markdown(f"**{what}** Measured on {record['hardware']}, {record['date_utc']} (git "
                    f"`{(record.get('git_sha') or 'unknown')[:8]}`). Regenerate: `{record['command']}`.")


SIZES = [size for size in ("gpu", "cpu") if (RESULTS / f"zoo_{size}_acceptance.json").exists()]
print("committed zoo results:", ", ".join(SIZES) if SIZES else "none yet")

# %% [markdown]
# ## What the zoo is
#
# The build record lists the corpora (with their licences and SHA-256), the models and their sizes.

# %%
for size in SIZES:
    build = json.loads((RESULTS / f"zoo_{size}_build.json").read_text())
    models = build["results"]["models"]
    print(f"zoo size '{size}' built on {build['hardware']} ({build['date_utc']}):")
    for name, model in models.items():
        print(f"  {name:<14} {model['parameters']:>12,} parameters, trained on {'+'.join(model['domains'])}")
    for domain, corpus in build["results"]["corpora"].items():
        licence = corpus.get("licence", "") if isinstance(corpus, dict) else ""
        print(f"  corpus {domain:<8} {licence}")
if not SIZES:
    print("The zoo's result files (results/zoo_<size>_*.json) are not committed yet; "
          "`flashspec zoo report --size cpu` produces them.")

# %% [markdown]
# ## Specialists, measured with the engine
#
# Each matrix crosses the drafts with the domains of held-out prompts ($\gamma=4$, $T=1$). The first two are measured
# by running `flashspec.SpeculativeDecoder` with that draft alone: the per-token acceptance α, which is accepted
# tokens over accepted tokens plus rejections (the quantity the bandits' conjugate update estimates), and the
# fraction of drafted tokens accepted;
# the third is the exact expected acceptance $\sum_v \min(p,q)$ along held-out text. The zoo's target: each
# specialist beats every other draft on its own domain by at least 0.10 in per-token α.

# %%
for size in SIZES:
    record = json.loads((RESULTS / f"zoo_{size}_acceptance.json").read_text())
    display(plots.plot_acceptance_matrix(record))
    display(caption(record, f"Acceptance matrix, zoo size '{size}'."))
    margins = record["results"]["engine_margins"]
    print("specialist margins:", ", ".join(f"{domain} {margin:+.3f}" for domain, margin in margins["margins"].items()),
          f"(target >= {margins['required']}: {'met' if margins['passed'] else 'NOT met'})")

# %% [markdown]
# ## The switching workload
#
# Requests arrive in blocks of one domain, then switch; a second stream mixes requests. Contestants: each draft
# alone, a per-domain oracle that always uses the best draft for the current request's domain (it knows the
# domain; no policy can), and the shipped bandit policies, with and without a reset at request boundaries. The
# trace shows which draft each policy chose at every step.

# %%
for size in SIZES:
    path = RESULTS / f"zoo_{size}_switching.json"
    if not path.exists():
        print(f"zoo size '{size}': the switching experiment is not committed yet")
        continue
    record = json.loads(path.read_text())
    display(plots.plot_arm_trace(record))
    display(caption(record, f"Arm choice over the switching workload, zoo size '{size}'."))
    print(zoo.format_report(RESULTS, size))
    for kind, block in record["results"].items():
        per_step = block["summary"]["tokens_per_step"]
        print(f"[{kind}] tokens per step (independent of machine load): best bandit "
              f"{per_step['best_bandit_vs_oracle']:.3f}x oracle, {per_step['best_bandit_vs_best_fixed']:.3f}x best fixed")

# %% [markdown]
# Tokens per second on the CPU zoo were measured on a 2-core machine that other jobs shared, so they carry that
# noise; tokens per step do not depend on the machine and are the fairer comparison between policies there. The
# GPU-size zoo (built and measured on the H200 by `flashspec zoo report --size gpu`) is where the throughput targets
# apply; when its files are committed, this page shows them above the CPU ones.
