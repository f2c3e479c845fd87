"""Hooks for every test session of the repository (tests/, lab/tests/)."""
from __future__ import annotations

import pytest


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
