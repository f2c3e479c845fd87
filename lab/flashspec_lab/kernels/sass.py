"""The verify kernels compiled for an SM90 GPU on any machine, and their machine code counted.

Triton's wheel carries `ptxas` and `cuobjdump`, so a launch the GPU plans make can be compiled to SM90 SASS
without a GPU. Counting the instructions of each loop says what one tile costs a thread before any device time
is spent: the stats pass's loop and the sampling races are instruction-bound at large B (Nsight Compute on the
H200: `experiments/verify_ncu.py`), so fewer instructions per logit is what moves them.

`bound_launches` binds one step as a GPU would launch it (the GPU branch of `make_plan`, on CPU tensors of the
GPU dtypes), `describe` turns a launch into argument types and constexprs, `compile_sass` compiles one (run it
with TRITON_INTERPRET unset: interpreted, the kernels' helpers are plain Python), `loops` finds its loops.
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import os
import re
import subprocess
import tempfile
from typing import Iterator

import torch

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64", torch.int32: "i32"}
COMPILER_OPTIONS = ("num_warps", "num_ctas", "enable_fp_fusion", "launch_cooperative_grid", "launch_pdl")
SM90_SMS = 132  # an H200's (and an H100 SXM's) multiprocessors


def type_of(value) -> str:
    """The Triton type of a launch argument (pointers by their tensor's dtype)."""
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def kernel_launches(prepared) -> list[tuple]:
    """(kernel, args, meta) of each launch of a prepared step, in order."""
    return [(launch.launcher.kernel, launch.args, launch.meta) for launch in prepared.launches]


def describe(kernel, args: tuple, meta: dict, precise: bool) -> dict:
    """A launch as the compiler needs it: the kernel's name, each runtime argument's Triton type, the constexprs
    (PRECISE as the GPU runs it: the interpreter always turns it off), the warp count and the compile options."""
    names = list(inspect.signature(kernel.fn).parameters)
    constexprs = {name: value for name, value in meta.items() if name not in COMPILER_OPTIONS}
    if "PRECISE" in constexprs:
        constexprs["PRECISE"] = precise
    unspecialised = set(getattr(kernel, "do_not_specialize", ()) or ())
    # what a GPU launch specialises as a multiple of 16: 16-byte aligned pointers, integers divisible by 16
    divisible = [name for name, value in zip(names, args) if name not in unspecialised and (
        (isinstance(value, torch.Tensor) and value.data_ptr() % 16 == 0)
        or (isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0))]
    return {"kernel": kernel.fn.__name__, "signature": {name: type_of(value) for name, value in zip(names, args)},
            "constexprs": constexprs, "num_warps": meta.get("num_warps", 4),
            "enable_fp_fusion": meta.get("enable_fp_fusion", True), "divisible_by_16": divisible}


@contextlib.contextmanager
def sm90_planner(sms: int = SM90_SMS) -> Iterator:
    """`make_plan`'s GPU branch on any machine, for the duration of the block: a `sms`-multiprocessor SM90 GPU
    with compiled Triton, programmatic dependent launch and clusters (plans only; nothing runs)."""
    from flashspec.kernels import plan as plan_module

    saved = {name: getattr(plan_module, name) for name in ("interpreting", "_num_sms", "_has_pdl", "_has_clusters")}
    plan_module.interpreting = lambda: False
    plan_module._num_sms = lambda index: sms
    plan_module._has_pdl = plan_module._has_clusters = lambda index: True
    plan_module.make_plan.cache_clear()
    try:
        yield plan_module
    finally:
        for name, value in saved.items():
            setattr(plan_module, name, value)
        plan_module.make_plan.cache_clear()


def bind_step(plan, batch: int, gamma: int, vocab: int, params, with_draft: bool = True,
              device_key: bool = False, dtype: torch.dtype = torch.bfloat16, draft_is_log_probs: bool = False) -> tuple:
    """(prepared step, target) of one verify step under `plan`, bound to tiny CPU tensors of the GPU dtypes: a
    launch's types and constexprs do not depend on the sizes, which the plan and the shape carry. Nothing runs.
    `dtype`: the logits' (the fast path verifies float32 logits); `draft_is_log_probs`: the draft's warped log-probs
    in place of its logits (what the fast path passes)."""
    from flashspec import rng
    from flashspec.kernels import structures
    from flashspec.kernels import verify as kernels
    from flashspec.kernels.shims import SCALE_MULTIPLY, SCALE_NONE
    from flashspec.kernels.step import _work_layout

    target = torch.zeros(1, gamma + 1, 8, dtype=dtype)
    draft = torch.zeros(1, gamma, 8, dtype=dtype) if with_draft else target
    tokens = torch.zeros(1, gamma, dtype=torch.int64)
    layout = _work_layout(batch, gamma, plan, params.greedy, vocab)
    memory = torch.empty(layout.words // 2, dtype=torch.int64)
    outputs = (memory[:batch * (gamma + 1)].view(batch, gamma + 1), memory[:batch])
    key = rng.Key.from_seed(1)
    if device_key:
        prefixes = kernels.device_prefixes(rng.key_tensor(key, "cpu"))
        prefix = (prefixes[0:1], prefixes[1:2], True)
    else:
        prefix = (*kernels._prefixes(key), False)
    scale_mode = SCALE_NONE if params.temperature in (0.0, 1.0) else SCALE_MULTIPLY
    has_draft = with_draft and not params.greedy  # HAS_DRAFT: 0 none, 1 logits, 2 warped log-probs
    flags = dict(SCALE_MODE=scale_mode, HAS_DRAFT=(2 if draft_is_log_probs else 1) if has_draft else 0,
                 GREEDY=params.greedy)
    scale = 1.0 if params.temperature in (0.0, 1.0) else 1.0 / params.temperature
    launches = structures.get(plan.structure).bind(plan, (target, draft, tokens), outputs, layout.views(memory),
                                                   (batch, gamma, vocab), scale, flags, prefix, memory.device, False)
    return kernels.PreparedVerify(plan=plan, tokens=outputs[0], num_accepted=outputs[1], launches=launches), target


def bound_launches(batch: int, gamma: int, vocab: int, params, with_draft: bool = True,
                   tuning: tuple[tuple[str, int], ...] | None = None, device_key: bool = False,
                   sampler: str = "race", dtype: torch.dtype = torch.bfloat16,
                   draft_is_log_probs: bool = False) -> tuple:
    """(plan, [described launch, ...]) of one verify step as an SM90 GPU would launch it: the plan `make_plan`
    makes there (`tuning` as the benchmark's variants give it; None: the shape's `SHAPE_PLANS` entry; `sampler`:
    its structures' key, "race", "rejection" or block verification's `block_pass.SAMPLER`), bound by `bind_step`."""
    with sm90_planner() as plan_module:
        plan = plan_module.make_plan(batch, gamma, vocab, torch.device("cuda", 0), params.greedy, tuning=tuning,
                                     residual=sampler)
    prepared, _ = bind_step(plan, batch, gamma, vocab, params, with_draft, device_key, dtype, draft_is_log_probs)
    return plan, [describe(kernel, args, meta, plan.precise) for kernel, args, meta in kernel_launches(prepared)]


def compile_sass(launch: dict, capability: int = 90) -> str:
    """The SASS of one described launch compiled for `capability` (cuobjdump's listing)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flashspec.kernels import block_pass, one_pass, sample_pass, stats_pass
    from flashspec_lab.kernels import chain_probe, cluster_pass, coop_pass, fused_pass

    modules = (block_pass, chain_probe, cluster_pass, coop_pass, fused_pass, one_pass, sample_pass, stats_pass)
    kernel = next(getattr(module, launch["kernel"]) for module in modules if hasattr(module, launch["kernel"]))
    if not hasattr(kernel, "fn"):
        raise RuntimeError("the kernels are interpreted here: compile with TRITON_INTERPRET unset")
    names = list(launch["signature"]) + list(launch["constexprs"])
    signature = dict(launch["signature"], **{name: "constexpr" for name in launch["constexprs"]})
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in launch.get("divisible_by_16", ())}
    source = ASTSource(kernel, signature, {(names.index(k),): v for k, v in launch["constexprs"].items()}, attrs)
    options = {"num_warps": launch["num_warps"], "enable_fp_fusion": launch["enable_fp_fusion"]}
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as handle:
            handle.write(compiled.asm["cubin"])
        listing = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                                 check=True)
    return listing.stdout


_INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every instruction in a cuobjdump listing."""
    return [(int(m.group(1), 16), m.group(2), m.group(3)) for m in map(_INSTRUCTION.match, sass.splitlines()) if m]


def loops(sass: str) -> list[dict]:
    """Each loop (a backward branch) of a listing: its address range, instruction count and opcodes (the
    mnemonic before its first dot), outermost and innermost alike. Not a loop: the jump back from the out-of-line
    code a `BRA.DIV` sends divergent warps to (placed after the kernel's exits) into the code after that branch."""
    listing = instructions(sass)
    divergent = [(address, int(m.group(1), 16)) for address, opcode, operands in listing
                 if opcode.startswith("BRA.DIV") and (m := re.search(r"0x([0-9a-f]+)", operands))]
    found = []
    for address, opcode, operands in listing:
        target = re.search(r"0x([0-9a-f]+)", operands)
        if target and any(out_of_line <= address and branch < int(target.group(1), 16) < out_of_line
                          for branch, out_of_line in divergent):
            continue  # the out-of-line path rejoining its warp's code
        if opcode.startswith("BRA") and target and int(target.group(1), 16) < address:
            body = [op.split(".")[0] for at, op, _ in listing if int(target.group(1), 16) <= at <= address]
            found.append({"start": int(target.group(1), 16), "end": address, "instructions": len(body),
                          "opcodes": dict(collections.Counter(body).most_common())})
    return found
