"""The lab's tests run the library's shared kernel checks (`tests/kernel_cases.py`) on the lab's launch structures:
the library's test folder is importable from here, as it is from its own test modules."""
from __future__ import annotations

import sys
from pathlib import Path

LIBRARY_TESTS = str(Path(__file__).resolve().parents[2] / "tests")
if LIBRARY_TESTS not in sys.path:
    sys.path.append(LIBRARY_TESTS)
