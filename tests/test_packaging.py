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


def test_colab_setup_leaves_a_newer_preinstalled_torch_alone(tmp_path):
    """A runtime whose torch is newer than pyproject's upper bound (Colab moves on): tools/colab_setup.py installs
    the library and the lab without their dependencies and only what the runtime lacks, so pip never plans to
    replace its torch, Triton or numpy (`pip install -e .` would plan a torch inside the bound)."""
    venv = tmp_path / "runtime"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    bound = Requirement(next(line for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"] if line.startswith("torch"))).specifier
    newer = {"torch": "2.14.1", "triton": "3.99.0", "numpy": "2.99.0", "transformers": "5.99.0",
             "tokenizers": "0.99.0", "safetensors": "0.99.0", "tqdm": "4.99.0", "matplotlib": "3.99.0",
             "scipy": "1.99.0"}
    assert not bound.contains(newer["torch"]), "the stand-in torch must lie past pyproject's bound"
    for name, version in newer.items():  # stand-ins: installed distributions as pip sees them
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    run = subprocess.run([str(python), str(ROOT / "tools" / "colab_setup.py"), "--dry-run", "--nf4"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    planned = " ".join(line for line in run.stdout.splitlines() if line.startswith("Would install"))
    assert "flashspec-lab" in planned and "bitsandbytes" in planned
    for name in ("torch", "triton", "numpy"):
        assert not re.search(rf"\b{name}-\d", planned), f"pip would replace the runtime's {name}: {planned}"
    assert "torch 2.14.1" in run.stdout
