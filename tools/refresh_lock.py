"""Rewrite constraints.txt from the current environment (`pip freeze`), after a green CI run in it.

    python -m venv /tmp/v && . /tmp/v/bin/activate
    pip install "torch==<newest>" -e ".[dev]"     # no -c: let pip pick the newest allowed versions
    python -m pytest && bash .ci/run              # must be green first
    python tools/refresh_lock.py                  # then raise pyproject's upper bounds to match

Local version labels (torch's `+cpu`) are dropped, so the same lock installs the CPU wheel on a
CPU-only index and the CUDA wheel from PyPI.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "constraints.txt"
HEADER = """\
# The exact versions CI ran (Python {python}, Linux x86-64, CPU): `pip install -c constraints.txt -e ".[dev]"`.
# Refresh: in a fresh venv run `pip install "torch==<newest>" -e ".[dev]"` (no -c), then `python -m pytest -n auto`
# and `bash .ci/run`; when green, `python tools/refresh_lock.py` rewrites this file from that venv and
# raise the upper bounds in pyproject.toml to what was tested.
"""


def frozen() -> list[str]:
    """`pip freeze` of this interpreter's environment without editable installs or local labels."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                         capture_output=True, text=True, check=True).stdout
    return [re.sub(r"\+[A-Za-z0-9.]+$", "", line) for line in out.splitlines() if "==" in line]


def main() -> int:
    lines = frozen()
    if not any(line.startswith("torch==") for line in lines):
        print("refresh_lock: torch is not installed in this environment; install the project first", file=sys.stderr)
        return 2
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    LOCK.write_text(HEADER.format(python=python) + "\n".join(lines) + "\n")
    print(f"wrote {LOCK} ({len(lines)} packages)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
