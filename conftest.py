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

from flashspec import models  # noqa: E402

# The suite runs thousands of tiny tensor ops; on a 2-core CI machine intra-op threads only add
# contention (one small matmul measured 37 ms with 2 threads against 0.4 ms with 1).
torch.set_num_threads(1)
# the same for the subprocesses tests start (the CLI, torchrun ranks, notebooks): each would take every core
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")


def pytest_report_header(config: pytest.Config) -> str:
    mode = "interpreter (CPU)" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled (GPU)"
    return f"flashspec: Triton runs in {mode}"


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    """A tiny random Llama target (vocabulary 16, 64 positions) with peaked distributions."""
    return models.tiny_llama(vocab_size=16, hidden_size=16, num_layers=2, initializer_range=0.3, seed=1, max_positions=64)


@pytest.fixture(scope="module")
def draft() -> torch.nn.Module:
    """A smaller tiny Llama over the target's vocabulary."""
    return models.tiny_llama(vocab_size=16, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2, max_positions=64)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make `--dist loadgroup` group again under pytest >= 9.2: nodes there keep their id in `_id`, while
    pytest-xdist 3.8 writes the `@group` suffix into `_nodeid`, so tests marked `xdist_group` would be spread over
    the workers and each would build the group's expensive fixture. Runs on the workers only (where xdist sets
    `option.loadgroup`); a no-op where xdist's own suffix took effect."""
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest < 9.2: xdist's suffix works as written
        return
    for item in items:
        names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                 for mark in item.iter_markers("xdist_group")}
        if names and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(names))}")
