"""Checks an experiment's command line makes before any work: output paths it can write, and the torchrun
environment a command that runs one process per rank needs.

A failed check ends the command the way argparse ends one with a bad argument, minus the usage text: one
``<prog>: error: <option> ...: <what is wrong>; <the fix>`` line on stderr and exit status 2, instead of a
traceback after minutes of measuring. An output file that already exists is rewritten (reruns regenerate
results); one that is a folder, or that sits where no file can be written, is refused.
"""
from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

# What torch.distributed's env:// rendezvous reads; torchrun sets them for every rank.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """Print ``<prog>: error: <message>`` on stderr and exit with status 2."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _unwritable_folder(path: Path) -> str | None:
    """Why no file can be created at `path` (its folder, or the folders that would be made for it), or None."""
    folder = path.parent
    while not (folder.exists() or folder.is_symlink()) and folder != folder.parent:
        folder = folder.parent  # the nearest folder that exists: the writers create the rest below it
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    return None


def output_file(parser: argparse.ArgumentParser, option: str, path: str | Path | None) -> None:
    """Exit with an error unless `path` (the value of `option`; None: not given) can be written as a file."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        fail(parser, f"{option} {path}: is a folder, but {option} names the file to write; pass a file path, "
                     f"e.g. {option} {path / 'result.json'}")
    problem = _unwritable_folder(path)
    if problem is None and path.exists() and not os.access(path, os.W_OK):
        problem = "the file exists and is not writable"
    if problem is not None:
        fail(parser, f"{option} {path}: cannot be written ({problem}); pass a path in a writable folder")


def output_folder(parser: argparse.ArgumentParser, option: str, path: str | Path | None) -> None:
    """Exit with an error unless `path` (the value of `option`; None: not given) is a folder files can be
    written into, or can be created as one."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        fail(parser, f"{option} {path}: is a file, but {option} names the folder the outputs go into; pass a "
                     f"folder (created if missing), not a file")
    problem = _unwritable_folder(path / "file")  # as for a file the command writes into it
    if problem is not None:
        fail(parser, f"{option} {path}: cannot be written ({problem}); pass a writable folder (created if missing)")


def under_torchrun(parser: argparse.ArgumentParser, command: str, argv: Sequence[str], ranks: int) -> None:
    """Exit with an error naming the launch command unless torchrun's environment is set: `command` (e.g.
    "flashspec bench tp") runs one process per rank; `ranks` is the --nproc-per-node the fix suggests."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        launch = shlex.join(["torchrun", "--nproc-per-node", str(ranks), "-m", *command.split(), *argv])
        fail(parser, f"not started by torchrun ({', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                     f"set): this command runs one process per rank; launch it as `{launch}`")
