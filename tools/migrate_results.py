"""Move every committed results file into the one shape ``{"provenance", "settings", "results"}``.

    python tools/migrate_results.py            # rewrite results/**/*.json that are not in the shape yet
    python tools/migrate_results.py --check    # only say which files would change; exit 1 if any

Fields are moved, never recomputed: each file's numbers and strings are compared before and after
(`leaves`), and the only differences allowed are the documented renames -- ``date`` -> ``date_utc``,
``uncommitted_library_files`` -> ``uncommitted_files``, ``wall_s`` -> ``wall_seconds``, the "cpu: " label
of the old bandit files' hardware string -- and the zoo files' one-line hardware summary, which is dropped
only after checking that it is exactly what their recorded environment gives.  ``git_sha_note`` is kept.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
KEYS = ["provenance", "settings", "results"]
PROVENANCE_KEYS = ("command", "git_sha", "git_sha_note", "uncommitted_files", "date_utc", "hardware", "versions")
VERSION_KEYS = ("python", "flashspec", "numpy", "matplotlib", "scipy", "torch", "triton", "transformers", "tokenizers")


def leaves(value: Any, key: str = "") -> Counter:
    """Every scalar of a JSON value with the key it sits under: Counter of (key, repr(value))."""
    found: Counter = Counter()
    if isinstance(value, dict):
        for name, item in value.items():
            found += leaves(item, name)
    elif isinstance(value, list):
        for item in value:
            found += leaves(item, key)
    else:
        shown = "nan" if isinstance(value, float) and math.isnan(value) else repr(value)
        found[(key, shown)] += 1
    return found


def numbers(value: Any) -> Counter:
    """The numbers of a JSON value (booleans excluded), as a Counter of repr."""
    return Counter(shown for (_, shown) in leaves(value) if _is_number(shown))


def _is_number(shown: str) -> bool:
    try:
        float(shown)
    except ValueError:
        return shown in ("inf", "-inf")
    return shown not in ("True", "False")


def zoo_hardware_line(environment: dict[str, Any]) -> str:
    """The one-line hardware summary the zoo report wrote next to its environment."""
    if environment.get("gpu"):
        return f"{environment['gpu']}, torch {environment['torch']}"
    return (f"CPU {environment.get('processor') or environment.get('platform')} x{environment.get('cpu_count')}, "
            f"torch {environment['torch']}")


def split_environment(environment: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hardware, versions) of an environment dict that mixes both."""
    versions = {key: environment[key] for key in VERSION_KEYS if key in environment}
    hardware = {key: value for key, value in environment.items() if key not in versions}
    return hardware, versions


def provenance_of(old: dict[str, Any]) -> dict[str, Any]:
    """The provenance fields of an old record, in the order `flashspec_lab.provenance.record` writes them."""
    found = {key: old.pop(key) for key in PROVENANCE_KEYS if key in old}
    return {key: found[key] for key in PROVENANCE_KEYS if key in found}


def move_device(provenance: dict[str, Any], settings: dict[str, Any]) -> None:
    """The device a run used is a setting of the run, not a property of the machine."""
    if "device" in provenance.get("hardware", {}):
        settings["device"] = provenance["hardware"].pop("device")


def migrate(name: str, old: dict[str, Any]) -> dict[str, Any]:
    """The record `old` (file `name`) in the one shape (`old` itself is left as it is)."""
    old = copy.deepcopy(old)
    if name.startswith("bandits_"):
        if "date" in old:
            old["date_utc"] = old.pop("date")
        if "uncommitted_library_files" in old:
            old["uncommitted_files"] = old.pop("uncommitted_library_files")
        label = old["hardware"]
        old["hardware"] = {"cpu": label[len("cpu: "):]} if label.startswith("cpu: ") else {"description": label}
        settings = dict(old.pop("settings"))
        provenance = provenance_of(old)
        if "wall_seconds" in settings:
            provenance["wall_seconds"] = settings.pop("wall_seconds")
        results = old.pop("results")
    elif name.startswith("zoo_design/"):
        old["hardware"] = {"description": old["hardware"]}
        provenance = provenance_of(old)
        settings = {key: old.pop(key) for key in ("zoo", "config") if key in old}
        results = {key: old.pop(key) for key in ("target_ppl", "variants") if key in old}
    elif name.startswith("zoo_"):
        environment = old.pop("environment")
        line = old.pop("hardware")
        if line != zoo_hardware_line(environment):
            raise ValueError(f"{name}: hardware {line!r} is not what its environment gives; not dropping it")
        old["hardware"], old["versions"] = split_environment(environment)
        provenance = provenance_of(old)
        if "stage_seconds" in old:
            provenance["stage_seconds"] = old.pop("stage_seconds")
        settings = dict(old.pop("settings"))
        settings.update({key: old.pop(key) for key in ("bandits", "oracle_arms") if key in old})
        results = old.pop("results")
    elif name.startswith("verify_"):
        environment = dict(old.pop("environment"))
        moved = {key: environment.pop(key) for key in ("command", "git_sha", "date_utc")}
        hardware, versions = split_environment(environment)
        provenance = {**moved, "hardware": hardware, "versions": versions}
        provenance = {key: provenance[key] for key in PROVENANCE_KEYS if key in provenance}
        settings = {key: old.pop(key) for key in ("benchmark", "targets", "notes")}
        results = {key: old.pop(key) for key in ("floors", "correctness", "points", "table", "plan_sweep")}
    elif name.startswith("bench_fast_"):
        provenance = provenance_of(dict(old.pop("metadata")))
        settings = dict(old.pop("settings"))
        results = {key: old.pop(key) for key in ("cells", "copy_bandwidth_bytes_per_s")}
    elif name.startswith("bench_runner_"):
        provenance = provenance_of(old)
        provenance["wall_seconds"] = old.pop("wall_s")
        settings = {"dtype": old.pop("dtype")}
        results = {key: old.pop(key) for key in ("cells", "copy_bandwidth_bytes_per_s")}
    elif name.startswith(("bench_engine_", "exactness_")):
        provenance = provenance_of(old)
        settings = dict(old.pop("settings"))
        results = old.pop("results")
    elif name.startswith("public_code_"):
        provenance = provenance_of(old)
        settings = {key: old.pop(key) for key in ("public_package", "alpha_each")}
        results = {**old.pop("results"), "source_reading": old.pop("source_reading")}
    else:
        raise ValueError(f"{name}: no rule for this file")
    move_device(provenance, settings)
    provenance.setdefault("versions", {})  # not recorded by the oldest files
    if old:
        raise ValueError(f"{name}: fields left unplaced: {sorted(old)}")
    return {"provenance": provenance, "settings": settings, "results": results}


RENAMED_STRINGS = {"date": "date_utc", "uncommitted_library_files": "uncommitted_files"}


def check_same(name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise unless `new` holds `old`'s numbers unchanged, and its strings up to the documented changes."""
    if numbers(old) != numbers(new):
        raise ValueError(f"{name}: numbers differ: {numbers(old) - numbers(new)} / {numbers(new) - numbers(old)}")
    before = Counter({(RENAMED_STRINGS.get(key, key), shown): count for (key, shown), count in leaves(old).items()
                      if not _is_number(shown)})
    after = Counter({key: count for key, count in leaves(new).items() if not _is_number(key[1])})
    lost, gained = before - after, after - before
    allowed_lost = {("hardware", repr(old.get("hardware")))} if isinstance(old.get("hardware"), str) else set()
    if set(lost) - allowed_lost:
        raise ValueError(f"{name}: strings lost: {sorted(set(lost) - allowed_lost)[:5]}")
    allowed_gained = {key for key in gained if key[0] in ("cpu", "description")}
    if set(gained) - allowed_gained:
        raise ValueError(f"{name}: strings gained: {sorted(set(gained) - allowed_gained)[:5]}")


def result_files(root: Path = RESULTS) -> list[Path]:
    return sorted(root.glob("*.json")) + sorted(root.glob("*/*.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list the files to migrate; write nothing")
    parser.add_argument("--root", type=Path, default=RESULTS, help="results folder (default: the checkout's)")
    args = parser.parse_args(argv)
    pending = []
    for path in result_files(args.root):
        old = json.loads(path.read_text())
        if isinstance(old, dict) and list(old) == KEYS:
            continue
        name = path.relative_to(args.root).as_posix()
        new = migrate(name, old)
        check_same(name, old, new)
        pending.append(name)
        if not args.check:
            path.write_text(json.dumps(new, indent=1) + "\n")
    print(("to migrate: " if args.check else "migrated: ") + (", ".join(pending) or "nothing"))
    return 1 if args.check and pending else 0


if __name__ == "__main__":
    sys.exit(main())
