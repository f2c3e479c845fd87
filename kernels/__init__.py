"""Triton kernels for FlashSpec, installed as `flashspec.kernels` (book/design.md §4).

`verify_triton` is the backend behind `flashspec.verify(..., backend="triton")`;
`flashspec.kernels.rng` is the uint32 Triton twin of `flashspec.rng`'s hash.
"""
import sys

if __name__ != "flashspec.kernels":  # `import kernels` from the repository root (transformers probes that name)
    import importlib

    sys.modules[__name__] = importlib.import_module("flashspec.kernels")  # the one copy, not a second
else:
    from flashspec.kernels.verify import LaunchPlan, PreparedVerify, make_plan, prepare_verify, verify_triton  # noqa: F401

__all__ = ["LaunchPlan", "PreparedVerify", "make_plan", "prepare_verify", "verify_triton"]
