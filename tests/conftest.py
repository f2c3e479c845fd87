"""Test configuration: run Triton kernels through the interpreter when there is no GPU.

`TRITON_INTERPRET` must be set before `triton` is imported anywhere, so this happens at
conftest import time, before any test module (or flashspec.kernels) imports triton.
"""
from __future__ import annotations

import os


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return torch.cuda.is_available()


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# The suite runs thousands of tiny tensor ops; on a 2-core CI machine intra-op threads only add
# contention (one small matmul measured 37 ms with 2 threads against 0.4 ms with 1).
torch.set_num_threads(1)


def pytest_report_header(config: pytest.Config) -> str:
    mode = "interpreter (CPU)" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled (GPU)"
    return f"flashspec: Triton runs in {mode}"
