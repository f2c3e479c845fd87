"""Install FlashSpec into a runtime that already has its own torch, Triton and Jupyter (Colab), touching none of them.

    python tools/colab_setup.py            # from the repository root: the library and the lab, editable
    python tools/colab_setup.py --nf4      # with bitsandbytes for NF4 targets (a GPU runtime)
    python tools/colab_setup.py --dry-run  # say what pip would install, install nothing

`pip install -e .` would resolve `torch<2.14` against the runtime's torch and, once the runtime moves past the
bound, download and install another torch (gigabytes, a torchvision mismatch, a restart). So this installs the
library and the lab with `--no-deps`, then only the requirements the runtime lacks, found by asking the
installed distributions; torch and Triton are never installed here, and a runtime without them stops with the
fix. The Colab copies of the chapters (tools/colab_notebooks.py) run it in their first cell.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("torch", "triton")  # the runtime's own: never installed or replaced here


def requirement_name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement ("torch>=2.8,<2.14" -> "torch")."""
    for stop in "<>=!~[;( ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower().replace("_", "-")


def requirements(nf4: bool) -> list[str]:
    """What the library and the lab need (and bitsandbytes with `nf4`), from their pyproject files."""
    needed: list[str] = []
    for path, extras in ((ROOT / "pyproject.toml", ("nf4",) if nf4 else ()), (ROOT / "lab" / "pyproject.toml", ())):
        project = tomllib.loads(path.read_text())["project"]
        needed += project.get("dependencies", [])
        for extra in extras:
            needed += project.get("optional-dependencies", {}).get(extra, [])
    return [line for line in needed if requirement_name(line) != "flashspec"]


def installed(name: str) -> str | None:
    """The installed version of distribution `name`, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan(nf4: bool) -> tuple[list[str], dict[str, str]]:
    """(requirements to install, {name: version} of those the runtime has already, kept as they are)."""
    missing, present = [], {}
    for line in requirements(nf4):
        name = requirement_name(line)
        version = installed(name)
        if version is not None:
            present[name] = version
        elif name not in KEEP:
            missing.append(line)
    return missing, present


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nf4", action="store_true", help="also bitsandbytes, for NF4 targets (GPU runtimes)")
    parser.add_argument("--dry-run", action="store_true", help="run pip with --dry-run: report, install nothing")
    args = parser.parse_args(argv)
    absent = [name for name in KEEP if installed(name) is None]
    if absent:
        print(f"colab_setup: this runtime has no {', '.join(absent)}; FlashSpec uses the runtime's own. Install "
              "them first (a CUDA build of torch for your GPU: https://pytorch.org), then run this again",
              file=sys.stderr)
        return 2
    missing, present = plan(args.nf4)
    pip = [sys.executable, "-m", "pip", "install", *(["--dry-run"] if args.dry_run else ["-q"])]
    steps = [pip + ["--no-deps", "-e", str(ROOT), "-e", str(ROOT / "lab")]]
    if missing:
        steps.append(pip + missing)
    for step in steps:
        print("colab_setup:", " ".join(step[2:]), flush=True)
        subprocess.run(step, check=True)
    kept = ", ".join(f"{name} {version}" for name, version in sorted(present.items()) if name in KEEP + (
        "transformers", "numpy"))
    done = "would install" if args.dry_run else "installed"
    print(f"colab_setup: using this runtime's {kept}; {done} {len(missing)} missing requirement(s)")
    print("colab_setup: the first call of a Triton kernel compiles it (seconds to a minute per kernel on a T4); "
          "later calls reuse the compiled binary")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
