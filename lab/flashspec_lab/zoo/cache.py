"""The zoo's cache folder and the safe way a build enters it.

A zoo lives in ``$FLASHSPEC_CACHE/zoo/<key>`` (default ``~/.cache/flashspec/zoo/<key>``).  A build writes
into ``<key>.building-<host>-<pid>`` next to it and renames that folder when it is complete, so an interrupted
build never looks finished; folders left by dead builds are removed by the next build.  A folder that cannot
take a zoo (a file in the way, read-only, full) ends in a `ZooCacheError` that names the fix.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from flashspec_lab import corpora
from flashspec_lab.zoo.config import ZooConfig, get_config

CACHE_ENV = "FLASHSPEC_CACHE"
BUILDING = ".building-"  # a build writes into <key>.building-<host>-<pid> and renames it to <key> when done
BUILD_NAME = re.compile(re.escape(BUILDING) + r"(.+-)?\d+$")  # a name without a host is taken as this host's
# A live build writes a model folder every few minutes (the gpu target, the longest silence, trains in ~2
# minutes on an H200), so a build folder untouched for a day belongs to a dead build even if its pid is reused.
STALE_BUILD_SECONDS = 24 * 3600
# OSError numbers that mean "this folder cannot take the zoo": answered with a ZooCacheError, not a traceback.
STORAGE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


class ZooCacheWarning(UserWarning):
    """A cached zoo was missing or corrupt and is being rebuilt."""


class ZooCacheError(ValueError):
    """The zoo cache folder cannot be used (a file in the way, not writable, full); the message says the fix.

    A ValueError, so callers that report bad arguments (`flashspec generate --zoo`) report this one too.
    """


def cache_root() -> Path:
    """$FLASHSPEC_CACHE/zoo (``~`` and ``$VARS`` expanded, made absolute), or ~/.cache/flashspec/zoo.

    Reads nothing on disk; `check_cache_root` says whether the folder can be used.
    """
    base = os.environ.get(CACHE_ENV)
    if not base:
        return Path.home() / ".cache" / "flashspec" / "zoo"
    expanded = os.path.expanduser(os.path.expandvars(base))
    unset = re.search(r"\$(\w+|\{[^}]*\})", expanded)  # expandvars leaves unset variables as they are
    if unset:
        raise ZooCacheError(f"{CACHE_ENV}={base!r} names the environment variable {unset.group(0)}, which is "
                            f"not set; set it, or set {CACHE_ENV} to a folder path")
    return Path(expanded).absolute() / "zoo"


def _cache_fix() -> str:
    """What to do about an unusable cache folder, with the current FLASHSPEC_CACHE value."""
    value = os.environ.get(CACHE_ENV)
    now = f"now {CACHE_ENV}={value!r}" if value else f"{CACHE_ENV} is unset, so ~/.cache/flashspec is used"
    return (f"set {CACHE_ENV} to a writable folder (created if missing), e.g. "
            f"{CACHE_ENV}=/tmp/flashspec ({now})")


def check_cache_root(root: Path | None = None) -> Path:
    """The zoo cache root (default `cache_root()`) after checking that no file stands on its path.

    Only reads, so a read-only cache holding a built zoo still loads; the build checks writability when it
    creates its work folder.  Called before the corpora are assembled, so a wrong FLASHSPEC_CACHE fails at once.
    """
    root = cache_root() if root is None else root
    try:
        for folder in (root, *root.parents):
            if folder.is_dir():
                break
            if folder.exists() or folder.is_symlink():
                raise ZooCacheError(f"the zoo cache folder {root} cannot be created: {folder} exists and is not "
                                    f"a folder; {_cache_fix()}, or move {folder} away")
    except OSError as error:
        raise ZooCacheError(f"the zoo cache folder {root} cannot be read ({error}); {_cache_fix()}") from error
    return root


def cache_path(size: str | ZooConfig = "cpu", domain_corpora: dict[str, corpora.DomainCorpus] | None = None) -> Path:
    """The cache folder of a size's zoo, built or not: the root joined with the key of its config and corpora.

    Assembles the corpora unless `domain_corpora` is given (a few seconds).
    """
    config = get_config(size)
    root = check_cache_root()
    if domain_corpora is None:
        domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    return root / config.key(corpora.corpora_sha256(domain_corpora))


def say(message: str, progress: bool) -> None:
    """A progress line on stderr (nothing when `progress` is off)."""
    if progress:
        print(message, file=sys.stderr, flush=True)


def _host() -> str:
    """This machine's name, recorded in build folder names: a pid is only meaningful on its own host."""
    return socket.gethostname() or "localhost"


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (True when that cannot be told, to keep its folder)."""
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there; the age rule decides instead
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists but belongs to someone else
        return True
    return True


def _newest_change(folder: Path) -> float:
    """The latest modification time of `folder` or anything in it."""
    return max(item.lstat().st_mtime for item in [folder, *folder.rglob("*")])


def _build_is_stale(folder: Path) -> bool:
    """Whether a ``<key>.building-[<host>-]<pid>`` folder was left by a build that is no longer running.

    Stale: untouched for STALE_BUILD_SECONDS, or its pid is gone on this host.  A folder from another host
    (a shared cache) is judged by age alone, and one that changes while we look is taken as alive.
    """
    host, _, pid_text = folder.name.rpartition(BUILDING)[2].rpartition("-")
    try:
        if time.time() - _newest_change(folder) > STALE_BUILD_SECONDS:
            return True
    except OSError:
        return False
    if host and host != _host():
        return False
    return pid_text.isdigit() and not _pid_alive(int(pid_text))


def _remove(path: Path) -> None:
    """Delete whatever is at `path`: a folder with its contents, a file or a link (nothing if absent)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _remove_stale_builds(final_dir: Path, in_cache: bool, progress: bool) -> None:
    """Delete build folders left by interrupted builds next to `final_dir`; a live concurrent build's is kept.

    In the cache every zoo's build folders are candidates; elsewhere only those of `final_dir` itself, so
    that nothing of the user's next to an explicit out_dir is touched.
    """
    pattern = f"*{BUILDING}*" if in_cache else f"{glob.escape(final_dir.name)}{BUILDING}*"
    for folder in sorted(final_dir.parent.glob(pattern)):
        is_build = folder.is_dir() and not folder.is_symlink() and BUILD_NAME.search(folder.name)
        if is_build and _build_is_stale(folder):
            say(f"flashspec zoo: removing {folder} (left by an interrupted build)", progress)
            shutil.rmtree(folder, ignore_errors=True)  # junk that cannot be removed must not stop the build


def _write_error(error: OSError, folder: Path, in_cache: bool) -> ZooCacheError:
    """The ZooCacheError for a failed write into `folder`: what went wrong and what to do."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        problem = "is full"
    elif error.errno in (errno.ENOTDIR, errno.EEXIST):
        problem = "cannot be created: a file stands on its path"
    elif error.errno in STORAGE_ERRNOS:
        problem = "is not writable"
    else:
        problem = "cannot be written"
    fix = _cache_fix() if in_cache else "pass a writable out_dir"
    return ZooCacheError(f"the zoo folder {folder} {problem} ({error.strerror or error}); {fix}")


def is_in_cache(folder: Path) -> bool:
    """Whether `folder` lies in the zoo cache (its errors then point at FLASHSPEC_CACHE)."""
    try:
        return folder.absolute().is_relative_to(cache_root())
    except ZooCacheError:
        return False


def _start_work_dir(final_dir: Path, in_cache: bool, progress: bool) -> Path:
    """Create the folder a build writes into, next to `final_dir`, after removing stale ones.

    Called before any training, so that a folder that cannot be written fails in seconds.
    """
    parent = final_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_builds(final_dir, in_cache, progress)
        work_dir = final_dir.with_name(f"{final_dir.name}{BUILDING}{_host()}-{os.getpid()}")
        _remove(work_dir)
        work_dir.mkdir()
    except OSError as error:
        raise _write_error(error, parent, in_cache) from error
    return work_dir


@contextlib.contextmanager
def building_dir(final_dir: Path, in_cache: bool, progress: bool) -> Iterator[Path]:
    """A fresh build folder for `final_dir`, deleted if the build fails (storage errors become ZooCacheError)."""
    work_dir = _start_work_dir(final_dir, in_cache, progress)
    try:
        yield work_dir
    except BaseException as error:
        shutil.rmtree(work_dir, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            raise _write_error(error, final_dir.parent, in_cache) from error
        raise


def install(work_dir: Path, final_dir: Path) -> None:
    """Move a finished build to `final_dir`, replacing what is there (an old zoo, a file, a link)."""
    _remove(final_dir)
    os.replace(work_dir, final_dir)

