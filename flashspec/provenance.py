"""Where a result came from: the commit measured, for every results file the project writes."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def git_sha(explicit: str | None = None) -> str | None:
    """The commit being measured: `explicit`, else $FLASHSPEC_GIT_SHA, else `git rev-parse HEAD`,
    else the ref read straight from .git (a machine without git), else None."""
    if explicit:
        return explicit
    if os.environ.get("FLASHSPEC_GIT_SHA"):
        return os.environ["FLASHSPEC_GIT_SHA"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=_CHECKOUT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return _sha_from_git_folder(_CHECKOUT / ".git")


def _sha_from_git_folder(git_dir: Path) -> str | None:
    try:
        head = (git_dir / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head or None
        ref = head[len("ref: "):]
        if (git_dir / ref).is_file():
            return (git_dir / ref).read_text().strip()
        for line in (git_dir / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None
