"""Fused projections: one layer's q/k/v and gate/up weights stacked so each is a single matmul.

A launch-bound decode step (batch 1, a small or mid-sized model) pays per kernel, not per byte: three
q/k/v matmuls and two gate/up matmuls become two. The stacked tensors are the storage: the model's own
weights are re-pointed at views of them, so nothing is copied twice and the Hugging Face forward keeps working.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch


class Fused(NamedTuple):
    """One layer's projections as single matmuls: q/k/v rows stacked (`qkv`, `qkv_bias` or None) and
    gate/up rows stacked (`gate_up`). The model's own q/k/v and gate/up weights are views of them."""
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor


def _plain_linears(*modules: Any) -> bool:
    """Whether every module is a plain `nn.Linear` whose weight is an ordinary float tensor on one device."""
    weights = [getattr(module, "weight", None) for module in modules]
    return (all(type(module) is torch.nn.Linear for module in modules)
            and all(type(weight.data) is torch.Tensor and weight.is_floating_point() for weight in weights)
            and len({(weight.dtype, weight.device, weight.shape[1]) for weight in weights}) == 1
            and len({module.bias is None for module in modules}) == 1)


def _stack_in_place(linears: tuple[torch.nn.Linear, ...], name: str) -> torch.Tensor:
    """`cat` of the modules' `name` tensors along rows; each module's tensor becomes a view of it (same
    values, the old storage freed: no extra memory once done)."""
    stacked = torch.cat([getattr(linear, name).detach() for linear in linears])
    start = 0
    for linear in linears:
        tensor = getattr(linear, name)
        rows = tensor.shape[0]
        tensor.data = stacked[start:start + rows]
        start += rows
    return stacked


@torch.no_grad()
def fuse_layer(layer: torch.nn.Module) -> Fused | None:
    """Stack `layer`'s q/k/v and gate/up weights into one tensor each (`Fused`), re-pointing the
    model's weights at views of them; None when they are not plain float `nn.Linear`s (quantized,
    sharded) or the MLP is not gate/up/down. Fewer, larger matmuls: what a launch-bound decode step needs."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return None
    gate_up = (mlp.gate_proj, mlp.up_proj)
    if not (_plain_linears(*qkv) and _plain_linears(*gate_up)) or mlp.gate_proj.bias is not None:
        return None
    bias = _stack_in_place(qkv, "bias") if attn.q_proj.bias is not None else None
    return Fused(_stack_in_place(qkv, "weight"), bias, _stack_in_place(gate_up, "weight"))
