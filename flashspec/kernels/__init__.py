"""Triton kernels of `flashspec.verify(..., backend="triton")` (book/design.md §4).

`verify_triton` is the backend; `flashspec.kernels.rng` is the uint32 Triton twin of `flashspec.rng`'s hash;
`flashspec.kernels.structures` is the registry of launch structures a plan may name (the two launches, the one
pass and block verification's three launches, registered here; other structures register themselves from the lab:
`import flashspec_lab.kernels`). `flashspec.kernels.paths` is the Triton backend of `flashspec.paths.verify_paths`
(several drafted paths verified together), imported when that backend is asked for.
"""
from flashspec.kernels import block_pass, one_pass, structures, two_launch

structures.register(two_launch.STRUCTURE)
structures.register(one_pass.STRUCTURE)
structures.register(block_pass.STRUCTURE)

from flashspec.kernels.verify import LaunchPlan, PreparedVerify, make_plan, prepare_verify, verify_triton  # noqa: E402

__all__ = ["LaunchPlan", "PreparedVerify", "make_plan", "prepare_verify", "verify_triton"]
