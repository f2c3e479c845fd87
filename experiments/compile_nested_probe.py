"""Whether hierarchical compilation can cut the whole-forward compile: `torch.compiler.nested_compile_region`.

The fast path's default compile scope traces the target's forward as one graph, every layer unrolled, so its
compile time grows with depth. `nested_compile_region` asks torch.compile to compile a repeated block once and
stamp it out per layer. This probe times the first compiled call of `LlamaRunner`'s whole forward (random
weights, one shape, the inductor caches off) with the layer halves as they are and wrapped as nested regions
(the layer modules as the regions' inputs; their weights as plain tensors; the same with the residual stream
cloned before the second half, in case the regions' buffers alias across layers), and compares each
one's logits with the eager forward's. A variant is only worth a GPU measurement if its logits agree.

    python experiments/compile_nested_probe.py --out results/compile_nested_smollm2_cpu.json
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = ("eager", "whole", "nested_modules", "nested_tensors", "nested_tensors_cloned")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from flashspec_lab import cli_checks, peers  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(peers.SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--git-sha", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one variant, in its own process
    args = parser.parse_args(argv)
    if args.child is None and args.out is None:
        parser.error("--out: required (the JSON file to write)")
    if args.out:
        cli_checks.output_file(parser, "--out", args.out)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers {args.layers}: must be at least 1")
    return args


def nest(variant: str, eps: float) -> None:
    """Replace the runner's layer halves by nested compile regions (what the forward's loop calls)."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812

    from flashspec import runner  # noqa: PLC0415

    if variant == "nested_modules":
        runner.project_qkv = torch.compiler.nested_compile_region(runner.project_qkv)
        runner.finish_layer = torch.compiler.nested_compile_region(runner.finish_layer)
        return

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # LlamaRMSNorm's arithmetic
        dtype = x.dtype
        x = x.float()
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)

    @torch.compiler.nested_compile_region
    def before(x: Any, norm: Any, qkv: Any, cos: Any, sin: Any, heads: int, kv_heads: int, dim: int) -> Any:
        batch, length = x.shape[:2]
        q, k, v = F.linear(rms(x, norm), qkv).split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        return (runner.rotate(q.reshape(batch, length, heads, dim), cos, sin),
                runner.rotate(k.reshape(batch, length, kv_heads, dim), cos, sin),
                v.reshape(batch, length, kv_heads, dim))

    @torch.compiler.nested_compile_region
    def after(x: Any, attended: Any, out: Any, norm: Any, gate_up: Any, down: Any) -> Any:
        x = x + F.linear(attended, out)
        gate, up = F.linear(rms(x, norm), gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, down)

    runner.project_qkv = lambda layer, x, cos, sin, heads, fused: before(
        x, layer.input_layernorm.weight, fused.qkv, cos, sin, *heads)
    cloned = variant == "nested_tensors_cloned"
    runner.finish_layer = lambda layer, x, attended, fused: after(
        x.clone() if cloned else x, attended, layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight,
        fused.gate_up, layer.mlp.down_proj.weight)


def child(args: argparse.Namespace) -> int:
    """One variant: the first compiled call's seconds and the logits, saved beside `--child`'s path."""
    import torch  # noqa: PLC0415
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    from flashspec import runner  # noqa: PLC0415
    from flashspec_lab import peers  # noqa: PLC0415

    variant, path = args.child.split(":", 1)
    config = peers.SHAPES[args.shape][0]()
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    if variant.startswith("nested"):
        nest(variant, config.rms_norm_eps)
    forward = runner.LlamaRunner(model, 1, 64, compile=False if variant == "eager" else "default",
                                 compile_lengths=(5,))
    with torch.no_grad():
        forward.forward(torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None], 8)  # the prompt, eager (q = 4)
        start = time.perf_counter()
        logits = forward.forward(torch.tensor([[3, 5, 7, 11, 13]]), torch.arange(4, 9)[None], 16)
        seconds = time.perf_counter() - start
    torch.save({"seconds": seconds, "logits": logits}, path)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child(args)
    import tempfile  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from flashspec_lab import provenance  # noqa: PLC0415

    record = provenance.record(git_sha=args.git_sha)
    env = {**os.environ, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    runs: dict[str, dict[str, Any]] = {}
    logits: dict[str, torch.Tensor] = {}
    forwarded = list(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory() as folder:
        for variant in ("eager", *[v for v in args.variants if v != "eager"]):
            path = Path(folder) / f"{variant}.pt"
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *forwarded, "--child",
                                   f"{variant}:{path}"], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                runs[variant] = {"error": done.stderr.strip().splitlines()[-1][:500] if done.stderr else "failed"}
                continue
            saved = torch.load(path)
            logits[variant] = saved["logits"]
            runs[variant] = {"first_compiled_call_s": saved["seconds"]}
    for variant, value in logits.items():
        if variant != "eager" and "eager" in logits:
            difference = (value - logits["eager"]).abs()
            runs[variant]["max_abs_logit_difference_vs_eager"] = float(difference.nan_to_num(float("inf")).max())
            runs[variant]["logits_finite"] = bool(torch.isfinite(value).all())
        print(f"compile_nested_probe: {variant}: {runs[variant]}", flush=True)
    settings = {"shape": args.shape, "layers": args.layers, "device": "cpu", "query_length": 5,
                "inductor_caches": "off"}
    provenance.write_result(args.out, record, settings, {"variants": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
