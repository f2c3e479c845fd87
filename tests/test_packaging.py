"""The install is reproducible: README, CI and conda install the same thing, and the lock
(constraints.txt) satisfies every bound in pyproject.toml."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parent.parent
INSTALL = 'pip install -c constraints.txt -e ".[dev]" -e lab'


def locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_readme_and_ci_run_the_same_install_command():
    assert INSTALL in (ROOT / "README.md").read_text()
    assert INSTALL in (ROOT / ".ci" / "run").read_text()


def test_environment_yml_installs_through_the_lock():
    text = (ROOT / "environment.yml").read_text()
    assert "- -c constraints.txt" in text and "- -e .[dev]" in text


def test_lock_pins_the_stack_and_satisfies_pyproject():
    pins = locked()
    for name in ("torch", "triton", "transformers", "numpy", "jupyter-book", "scipy"):
        assert name in pins, f"constraints.txt does not pin {name}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    for text in requirements:
        requirement = Requirement(text)
        name = requirement.name.lower()
        assert name in pins, f"{name} (pyproject) is not in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement.specifier}")
        assert any(spec.operator in ("<", "<=", "==") for spec in requirement.specifier), (
            f"{name} has no upper bound in pyproject.toml (bound it at the newest version tested)")


def test_lock_has_no_local_version_labels():
    """`torch==2.13.0+cpu` would not install from PyPI; the lock drops local labels."""
    assert not re.search(r"==[^\s]*\+", (ROOT / "constraints.txt").read_text())


def test_wheel_ships_the_library_and_every_subpackage_but_not_the_experiments():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    subpackages = {f"flashspec.{folder.name}" for folder in (ROOT / "flashspec").iterdir()
                   if (folder / "__init__.py").is_file()}
    assert set(packages) == {"flashspec", *subpackages}, "a subpackage missing here is missing from the wheel"
    assert (ROOT / "experiments" / "__init__.py").is_file() and "experiments" not in packages


def test_the_library_imports_without_scipy_matplotlib_or_the_lab():
    """scipy is a [dev] extra: only the statistics of the exactness harness need it, imported when they run; the
    lab (and its matplotlib) imports the library, never the reverse: every library module imports without them."""
    code = ("import sys\n"
            "for name in ('scipy', 'matplotlib', 'flashspec_lab'):\n"
            "    sys.modules[name] = None\n"
            "import importlib, pkgutil, flashspec\n"
            "for module in pkgutil.walk_packages(flashspec.__path__, 'flashspec.'):\n"
            "    importlib.import_module(module.name)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")})
    assert run.returncode == 0, run.stderr[-2000:]
