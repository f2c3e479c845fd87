"""Zoo cache faults: each ends in a `ZooCacheError` naming the problem and the fix, or in a repaired cache.

Everything runs on the seconds-long "micro" config in a temporary FLASHSPEC_CACHE: one micro zoo is built
per module and copied wherever a test needs a cached zoo.  The suite runs as root, which file modes do not
stop, so a read-only cache is simulated by making folder creation and writes under it fail with EROFS
(`read_only`); where the machine allows it, `test_read_only_mount_ends_in_message` also mounts the cache
read-only for real in a private mount namespace (`unshare`) and runs the command line (`experiments/zoo.py`)
on it.
"""
from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import zoo as zoo_experiments
from flashspec_lab import corpora, zoo
from flashspec_lab.zoo import cache as zoo_cache
from flashspec_lab.zoo import training as zoo_training

MICRO = zoo.SIZES["micro"]


@pytest.fixture(scope="module")
def micro_corpora() -> dict[str, corpora.DomainCorpus]:
    return corpora.assemble(MICRO.train_chars_per_domain, MICRO.domains)


@pytest.fixture(scope="module")
def micro_key(micro_corpora: dict[str, corpora.DomainCorpus]) -> str:
    return MICRO.key(corpora.corpora_sha256(micro_corpora))


@pytest.fixture(scope="module")
def micro_build(tmp_path_factory: pytest.TempPathFactory, micro_corpora: dict[str, corpora.DomainCorpus]) -> Path:
    """A complete micro zoo outside any cache, to copy from."""
    out = tmp_path_factory.mktemp("micro") / "zoo"
    return zoo.build_zoo(MICRO, out, device="cpu", progress=False, domain_corpora=micro_corpora)


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """FLASHSPEC_CACHE pointing at an empty (not yet created) folder."""
    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def install(micro_build: Path, cache: Path, key: str) -> Path:
    """Copy the micro zoo into `cache` where `zoo_dir("micro")` looks for it."""
    path = cache / "zoo" / key
    shutil.copytree(micro_build, path)
    return path


def forbid_expensive_work(monkeypatch: pytest.MonkeyPatch, corpus: bool = True) -> None:
    """Fail the test if the corpora are assembled (when `corpus`) or the tokenizer is trained."""

    def expensive(*args: object, **kwargs: object) -> None:
        raise AssertionError("expensive work started before the cache folder was checked")

    if corpus:
        monkeypatch.setattr(corpora, "assemble", expensive)
    monkeypatch.setattr(zoo_training, "train_tokenizer", expensive)


def read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make creating folders and opening files for writing under `folder` fail with EROFS, as a read-only mount does."""
    folder = folder.absolute()
    real_mkdir, real_open, real_io_open = os.mkdir, os.open, io.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return False
        return Path(os.fsdecode(path)).absolute().is_relative_to(folder)  # type: ignore[arg-type]

    def refuse(path: object) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))  # type: ignore[arg-type]

    def mkdir(path: object, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if dir_fd is None and inside(path):
            raise refuse(path)
        real_mkdir(path, mode, dir_fd=dir_fd)  # type: ignore[arg-type]

    def os_open(path: object, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is None and flags & write_flags and inside(path):
            raise refuse(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)  # type: ignore[arg-type]

    def file_open(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if any(flag in mode for flag in "wax+") and inside(file):
            raise refuse(file)
        return real_io_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", file_open)
    monkeypatch.setattr(builtins, "open", file_open)


def assert_clean_exit(capsys: pytest.CaptureFixture[str], *phrases: str) -> None:
    """`flashspec zoo build` ended with exit code 2 and a message holding `phrases`, no traceback."""
    assert zoo_experiments.main(["build", "--size", "micro", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in err, err


# ----------------------------------------------------------------------------------------------- 1: a file

@pytest.mark.parametrize("below", ["", "sub/dir"])
def test_cache_env_naming_a_file_fails_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], below: str) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("FLASHSPEC_CACHE", str(blocker / below) if below else str(blocker))
    forbid_expensive_work(monkeypatch)
    with pytest.raises(zoo.ZooCacheError, match="FLASHSPEC_CACHE") as caught:
        zoo.zoo_dir("micro", device="cpu", progress=False)
    assert isinstance(caught.value, ValueError)
    assert str(blocker) in str(caught.value) and "not a folder" in str(caught.value)
    assert_clean_exit(capsys, "FLASHSPEC_CACHE", "not a folder")
    assert zoo_experiments.main(["info", "--size", "micro"]) == 2
    assert "FLASHSPEC_CACHE" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- 2: read-only

def test_read_only_empty_cache_ends_in_message(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cache.mkdir()
    read_only(monkeypatch, cache)
    forbid_expensive_work(monkeypatch, corpus=False)
    with pytest.raises(zoo.ZooCacheError, match="not writable") as caught:
        zoo.zoo_dir("micro", device="cpu", progress=False)
    assert "FLASHSPEC_CACHE" in str(caught.value)
    assert_clean_exit(capsys, "not writable", "FLASHSPEC_CACHE")


def test_read_only_corrupt_cache_ends_in_message(cache: Path, micro_build: Path, micro_key: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = install(micro_build, cache, micro_key)
    (path / "draft-python" / "model.safetensors").write_bytes(b"corrupt")
    read_only(monkeypatch, cache)
    forbid_expensive_work(monkeypatch, corpus=False)
    with pytest.raises(zoo.ZooCacheError, match="not writable"), pytest.warns(zoo.ZooCacheWarning):
        zoo.zoo_dir("micro", device="cpu", progress=False)
    with pytest.warns(zoo.ZooCacheWarning):
        assert_clean_exit(capsys, "not writable", "FLASHSPEC_CACHE")


def test_read_only_cache_with_a_valid_zoo_still_loads(cache: Path, micro_build: Path, micro_key: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = install(micro_build, cache, micro_key)
    read_only(monkeypatch, cache)
    assert zoo.zoo_dir("micro", device="cpu", progress=False) == path
    assert zoo.load_zoo("micro", device="cpu", progress=False).path == path


def _unshare_works() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` (user + mount namespaces)")
@pytest.mark.parametrize("content", ["empty", "corrupt"])
def test_read_only_mount_ends_in_message(cache: Path, micro_build: Path, micro_key: str, content: str) -> None:
    """The real thing: the cache folder bind-mounted read-only, `python -m experiments.zoo build` run on it."""
    cache.mkdir()
    if content == "corrupt":
        path = install(micro_build, cache, micro_key)
        (path / zoo.MANIFEST).write_text("{")
    script = ('mount --bind "$CACHE" "$CACHE" && mount -o remount,ro,bind "$CACHE" || exit 77; '
              'touch "$CACHE/probe" 2>/dev/null && exit 77; '
              'exec "$PYTHON" -m experiments.zoo build --size micro --device cpu')
    env = {**os.environ, "CACHE": str(cache), "PYTHON": sys.executable, "FLASHSPEC_CACHE": str(cache)}
    run = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, capture_output=True, text=True,
                         timeout=600, cwd=Path(__file__).resolve().parents[2])
    if run.returncode == 77:
        pytest.skip("cannot mount the cache read-only here")
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "not writable" in run.stderr and "FLASHSPEC_CACHE" in run.stderr


# ----------------------------------------------------------------------------------------------- 3: manifest

@pytest.mark.parametrize("text", ["[]", "null", '"zoo"', '{"format": 2, "files": []}',
                                  '{"format": 2, "files": {"../../outside": "00"}}',
                                  '{"format": 2, "files": {}}'])
def test_check_zoo_dir_rejects_malformed_manifests(tmp_path: Path, text: str) -> None:
    (tmp_path / zoo.MANIFEST).write_text(text)
    with pytest.raises(ValueError, match=zoo.MANIFEST):
        zoo.check_zoo_dir(tmp_path)


def test_manifest_that_is_not_an_object_is_rebuilt(cache: Path, micro_build: Path, micro_key: str) -> None:
    path = install(micro_build, cache, micro_key)
    (path / zoo.MANIFEST).write_text("[]")
    with pytest.warns(zoo.ZooCacheWarning, match="not a JSON object"):
        assert zoo.zoo_dir("micro", device="cpu", progress=False) == path
    assert zoo.check_zoo_dir(path)["key"] == micro_key


# ----------------------------------------------------------------------------------------------- 4: key is a file

def test_zoo_key_that_is_a_file_is_replaced(cache: Path, micro_key: str) -> None:
    path = cache / "zoo" / micro_key
    path.parent.mkdir(parents=True)
    path.write_text("not a zoo")
    with pytest.warns(zoo.ZooCacheWarning, match="not a folder"):
        assert zoo.zoo_dir("micro", device="cpu", progress=False) == path
    assert path.is_dir() and zoo.check_zoo_dir(path)["key"] == micro_key
    assert not list(path.parent.glob("*.building-*"))


# ----------------------------------------------------------------------------------------------- 5: stale builds

def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _age(folder: Path, seconds: float) -> None:
    past = time.time() - seconds
    for item in [*folder.rglob("*"), folder]:
        os.utime(item, (past, past))


def test_stale_build_folders_are_removed_and_live_ones_kept(cache: Path, micro_key: str) -> None:
    root = cache / "zoo"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        folders = {
            "dead": root / f"{micro_key}.building-{_dead_pid()}",
            "dead_elsewhere_named": root / f"0123456789abcdef.building-{zoo_cache._host()}-{_dead_pid()}",
            "live": root / f"fedcba9876543210.building-{sleeper.pid}",
            "live_but_ancient": root / f"00000000000000ff.building-{sleeper.pid}",
            "other_host_recent": root / f"0000000000000aaa.building-elsewhere-{_dead_pid()}",
            "other_host_ancient": root / f"0000000000000bbb.building-elsewhere-{sleeper.pid}",
        }
        for folder in folders.values():
            (folder / "target").mkdir(parents=True)
            (folder / "target" / "config.json").write_text("{}")
        _age(folders["live_but_ancient"], 3 * zoo.STALE_BUILD_SECONDS)
        _age(folders["other_host_ancient"], 3 * zoo.STALE_BUILD_SECONDS)
        path = zoo.zoo_dir("micro", device="cpu", progress=False)
        assert zoo.check_zoo_dir(path)
        left = {name for name, folder in folders.items() if folder.exists()}
        assert left == {"live", "other_host_recent"}
        assert not list(root.glob(f"{micro_key}.building-*"))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_cleanup_outside_the_cache_touches_only_the_targets_folders(tmp_path: Path) -> None:
    dead = _dead_pid()
    ours, users = tmp_path / f"zoo_x.building-{dead}", tmp_path / f"notes.building-{dead}"
    for folder in (ours, users):
        folder.mkdir()
    zoo_cache._remove_stale_builds(tmp_path / "zoo_x", in_cache=False, progress=False)
    assert not ours.exists() and users.exists()


def test_failed_build_removes_its_work_folder(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> list[float]:
        raise KeyboardInterrupt

    monkeypatch.setattr(zoo_training, "train_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        zoo.zoo_dir("micro", device="cpu", progress=False)
    assert not list((cache / "zoo").glob("*.building-*"))


# ----------------------------------------------------------------------------------------------- 6: expansion

def test_cache_env_expands_home_and_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLASHSPEC_CACHE", "~/x")
    assert zoo.cache_root() == tmp_path / "x" / "zoo"
    monkeypatch.setenv("FLASHSPEC_TEST_CACHE_DIR", str(tmp_path / "y"))
    monkeypatch.setenv("FLASHSPEC_CACHE", "$FLASHSPEC_TEST_CACHE_DIR/z")
    assert zoo.cache_root() == tmp_path / "y" / "z" / "zoo"
    monkeypatch.delenv("FLASHSPEC_TEST_UNSET_DIR", raising=False)
    monkeypatch.setenv("FLASHSPEC_CACHE", "${FLASHSPEC_TEST_UNSET_DIR}/z")
    with pytest.raises(zoo.ZooCacheError, match="FLASHSPEC_TEST_UNSET_DIR"):
        zoo.cache_root()
