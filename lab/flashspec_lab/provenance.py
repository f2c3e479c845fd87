"""Where a result came from, and the one shape of every results file.

Every JSON file under ``results/`` is ``{"provenance": ..., "settings": ..., "results": ...}``:

- ``provenance`` (`record`): the command, the hardware (CPU, GPU name and driver), the versions of
  python / torch / triton / transformers (and the other packages the numbers depend on), the git SHA
  of the code measured, the UTC date; optional extras a writer adds, such as ``wall_seconds``, and a
  ``git_sha_note`` where the recorded SHA needs explaining;
- ``settings``: the parameters of the run (what to change to rerun it differently);
- ``results``: what it measured.

`write_result` writes that shape, `load_result` reads a file back from a checkout's ``results/``, and
`caption` turns a record into the one line a figure or table cites.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

_CHECKOUT = Path(__file__).resolve().parents[2]
RESULT_KEYS = ("provenance", "settings", "results")
# The code whose state a result depends on: `uncommitted_files` lists what differs from the recorded commit.
CODE_FOLDERS = ("flashspec", "lab", "experiments")
VERSIONED = ("flashspec", "numpy", "torch", "triton", "transformers", "tokenizers", "scipy")


def git_sha(explicit: str | None = None) -> str | None:
    """The commit being measured: `explicit`, else $FLASHSPEC_GIT_SHA, else `git rev-parse HEAD`,
    else the ref read straight from .git (a machine without git), else None."""
    if explicit:
        return explicit
    if os.environ.get("FLASHSPEC_GIT_SHA"):
        return os.environ["FLASHSPEC_GIT_SHA"]
    return checkout_head()


def checkout_head() -> str | None:
    """The commit this checkout's git metadata says it is at (`git rev-parse HEAD`, else read from .git)."""
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


def uncommitted_files(folders: Sequence[str] = CODE_FOLDERS) -> list[str]:
    """Files under `folders` that differ from the checkout's commit (a committed result lists none)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", *folders], cwd=_CHECKOUT, capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in out.splitlines()]


def nvidia_smi() -> list[dict[str, str]]:
    """Name, driver and memory of every NVIDIA GPU `nvidia-smi` sees ([] without one)."""
    fields = ("name", "driver_version", "memory.total")
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [dict(zip(fields, (part.strip() for part in line.split(",")))) for line in out.splitlines() if line.strip()]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    """The machine: CPU model and cores, platform, torch's CPU threads, and the GPU (name, count, memory,
    driver, CUDA version of torch) when there is one."""
    info: dict[str, Any] = {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform()}
    torch = sys.modules.get("torch")  # only when the run imported it: a numpy-only run stays light
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    gpus = nvidia_smi()
    info["gpu"] = gpus[0]["name"] if gpus else None
    if gpus:
        info.update(gpu_count=len(gpus), gpu_memory=gpus[0]["memory.total"], driver=gpus[0]["driver_version"],
                    cuda=getattr(getattr(torch, "version", None), "cuda", None))
    return info


def versions(packages: Sequence[str] = VERSIONED) -> dict[str, str | None]:
    """Python and each package's installed version (None when it is not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def record(command: str | Sequence[str] | None = None, git_sha: str | None = None) -> dict[str, Any]:
    """The provenance of a run starting now: command (default: this process's argv), git SHA (default:
    `git_sha()`), UTC date, hardware, versions, and the code files that differ from that commit: None, with the
    checkout's own commit as `checkout_git_sha`, where the SHA given is not the commit the checkout's git is at."""
    if command is None:
        command = [Path(sys.argv[0]).name, *sys.argv[1:]]
    sha, head = _git_sha(git_sha), checkout_head()
    # a SHA given for a tree whose git metadata sits at another commit (a copied working tree): what differs
    # from the checkout's commit says nothing about the recorded one, so it is not recorded
    elsewhere = bool(sha and head and not (sha.startswith(head) or head.startswith(sha)))
    return {
        "command": command if isinstance(command, str) else " ".join(command),
        "git_sha": sha,
        "uncommitted_files": None if elsewhere else uncommitted_files(),
        **({"checkout_git_sha": head} if elsewhere else {}),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware(),
        "versions": versions(),
    }


_git_sha = git_sha  # `record` takes a parameter of the same name


def result(provenance: dict[str, Any], settings: dict[str, Any], results: Any) -> dict[str, Any]:
    """A results file's content, in the one shape."""
    return {"provenance": provenance, "settings": settings, "results": results}


def write_result(path: str | Path, provenance: dict[str, Any], settings: dict[str, Any], results: Any) -> Path:
    """Write `result(...)` as indented JSON to `path` (folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result(provenance, settings, results), indent=1, default=float) + "\n")
    return path


def results_dir(start: str | Path | None = None) -> Path:
    """The ``results/`` folder: the checkout's that holds this package, else the first one found from
    `start` (default: the working directory) upwards.  FileNotFoundError when there is none."""
    candidates = [_CHECKOUT / "results"]
    here = Path.cwd() if start is None else Path(start)
    candidates += [folder / "results" for folder in (here.resolve(), *here.resolve().parents)]
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise FileNotFoundError(f"no results/ folder in this checkout or above {here}")


def load_result(name: str, folder: str | Path | None = None) -> dict[str, Any]:
    """The results file `name` (".json" optional, subfolders allowed: "zoo_design/h200_finetuned"),
    read from `folder` (default: `results_dir()`)."""
    base = Path(folder) if folder is not None else results_dir()
    path = base / (name if name.endswith(".json") else f"{name}.json")
    return json.loads(path.read_text())


def caption(record: dict[str, Any]) -> str:
    """"hardware; versions; git SHA; date" of a results file (or of its provenance alone)."""
    provenance = record.get("provenance", record)
    machine = provenance.get("hardware", {})
    if machine.get("gpu"):
        details = [f"driver {machine['driver']}" if machine.get("driver") else "",
                   f"CUDA {machine['cuda']}" if machine.get("cuda") else ""]
        where = machine["gpu"] + (f" ({', '.join(d for d in details if d)})" if any(details) else "")
    elif machine.get("description"):  # files older than this record kept their one-line description
        where = machine["description"]
    else:
        cores = f" ×{machine['cpu_count']}" if machine.get("cpu_count") else ""
        where = f"CPU {machine.get('cpu') or machine.get('processor') or machine.get('platform') or 'unknown'}{cores}"
    found = provenance.get("versions", {})
    shown = [name for name in ("torch", "triton", "transformers") if found.get(name)] or \
            [name for name in ("python", "numpy") if found.get(name)]
    stack = [", ".join(f"{name} {found[name]}" for name in shown)] if shown else []
    sha = provenance.get("git_sha")
    date = str(provenance["date_utc"])[:10] if provenance.get("date_utc") else "date not recorded"
    return "; ".join([where, *stack, f"git {sha[:8] if sha else 'unknown'}", date])
