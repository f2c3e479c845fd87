"""Triton kernels for FlashSpec, installed as `flashspec.kernels` (book/design.md §4).

`verify_triton` is the backend behind `flashspec.verify(..., backend="triton")`;
`flashspec.kernels.rng` is the uint32 Triton twin of `flashspec.rng`'s hash.
"""
if __name__ != "flashspec.kernels":  # e.g. `import kernels` from the repository root: a second copy
    raise ImportError(f"import the kernels as flashspec.kernels, not as {__name__!r}")

from flashspec.kernels.verify import LaunchPlan, PreparedVerify, make_plan, prepare_verify, verify_triton

__all__ = ["LaunchPlan", "PreparedVerify", "make_plan", "prepare_verify", "verify_triton"]
