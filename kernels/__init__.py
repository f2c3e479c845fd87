"""Triton kernels for FlashSpec, installed as `flashspec.kernels` (DESIGN §4).

`verify_triton` is the backend behind `flashspec.verify(..., backend="triton")`;
`flashspec.kernels.rng` is the uint32 Triton twin of `flashspec.rng`'s hash.
"""
from flashspec.kernels.verify import LaunchPlan, PreparedVerify, make_plan, prepare_verify, verify_triton

__all__ = ["LaunchPlan", "PreparedVerify", "make_plan", "prepare_verify", "verify_triton"]
