"""Measured verdicts on the FlashSpec paper's public package (PyPI `flashspec`, audited version 0.1.4).

The paper's package has the same import name as this one, so it is downloaded into a cache folder and run in a
child interpreter (`python -I`, its folder first on `sys.path`, this repository's editable finder removed) that
cannot see our code.  The child answers requests over a pipe:

* ``verify``: one call of the public ``flashspec.sampling.rejection.rejection_sample`` on a batch of rows, with
  log-probs formed as its ``TargetModel.score_draft`` forms them, and the emitted tokens collected as its
  ``SpeculativeEngine.generate`` collects them (every entry that is not -1, in order);
* ``paper_tests``: the paper's own pytest tests, taken from the sdist, on the public code;
* ``thompson_engine``: the public ``SpeculativeEngine.generate`` with its ``ThompsonSelector`` and toy models.

This process drives the first through the χ² harness of `flashspec_lab.exactness` (same loop, same toy models,
same exact enumeration, same test) and runs `flashspec.verify` through it as the positive control.

`python -m experiments.public_code` writes results/public_code_<version>.json.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments import exactness as grid
from flashspec_lab import cli_checks, exactness, provenance
from flashspec.sampling import SamplingParams
from flashspec.verify import VerifyOutput

AUDITED_VERSION = "0.1.4"
# PyPI files never change once uploaded; pinning their digests makes the audit refer to one artifact.
PINNED_SHA256 = {
    "0.1.4": {
        "wheel": "8ff135af2a398f97cfae84db8acdc8e1a1855e3e4cf5bc5a8c1ba2681d1355ba",
        "sdist": "3dacfc39501621622d27392c077800dd939670d302a51f36f6baa6f93fd36ca1",
    }
}
_REPO_ROOT = Path(__file__).resolve().parent.parent

# The χ² configurations of `experiments.exactness.CONFIGS` run on the public verifier, and what each exercises
# (from reading sampling/rejection.py and engine/speculative.py of 0.1.4).
EXERCISED = {
    # γ = 1 has no position after a first rejection, so nothing can leak; every all-accepted step emits a
    # residual sample from (p - q)+ in place of the accepted draft, and no bonus token.
    "two-g1-T1.0": ("bonus_from_residual",),
    # γ >= 2: drafts individually accepted after the first rejection are emitted too, and every all-accepted
    # step replaces the last draft by a residual sample and draws no bonus.
    "two-g2-T1.0": ("post_rejection_leak", "bonus_from_residual"),
    "two-g4-T0.5": ("post_rejection_leak", "bonus_from_residual"),
    "two-g2-T1.7": ("post_rejection_leak", "bonus_from_residual"),
}
PAPER_GATE_TEST = ("tests/integration/test_e2e_sampling.py::TestDistributionEquivalence"
                   "::test_ks_gate_n10000_gamma1_p_equals_q")
PAPER_TEST_FILES = ("tests/integration/test_e2e_sampling.py", "tests/unit/test_sampling.py")
THOMPSON_GAMMA = 4  # the paper's default speculation length (SamplingConfig.gamma)


class PyPIUnreachable(RuntimeError):
    """pip could not reach the package index (no network): callers skip rather than fail."""


class PublicCodeError(RuntimeError):
    """An exception raised by the public code in the child, with where it was raised."""

    def __init__(self, type_name: str, message: str, where: list[str]) -> None:
        super().__init__(f"{type_name}: {message} (at {where[-1] if where else 'unknown'})")
        self.type_name, self.message, self.where = type_name, message, where

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "message": self.message, "where": self.where}


# ----------------------------------------------------------------------------------------------
# Download and unpack


@dataclass(frozen=True)
class PublicPackage:
    """One downloaded release: the unpacked wheel (the code pip installs) and sdist (which also holds its tests)."""

    version: str
    code_root: Path  # contains flashspec/ from the wheel
    source_root: Path  # the sdist's top folder: flashspec/, tests/, paper/ ...
    archives: dict[str, Path]
    sha256: dict[str, str]

    def code_identical(self) -> bool:
        """Whether the wheel's and the sdist's flashspec/ folders hold the same files, byte for byte."""
        return _tree_digest(self.code_root / "flashspec") == _tree_digest(self.source_root / "flashspec")


def cache_dir() -> Path:
    """Where downloads are kept between runs: $FLASHSPEC_CACHE, else ~/.cache/flashspec/public."""
    return Path(os.environ.get("FLASHSPEC_CACHE") or Path.home() / ".cache" / "flashspec" / "public")


_NETWORK_MARKERS = (
    "NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution", "Network is unreachable",
    "Name or service not known", "ConnectionError", "ConnectTimeout", "ReadTimeout", "ProxyError", "timed out",
    "Connection refused",
)


def _pip_download(version: str, dest: Path, kind: str) -> Path:
    """`pip download --no-deps` of one archive kind ("wheel" or "sdist") into `dest`; returns its path."""
    # the sdist: only flashspec from source (":all:" would build its build backend from source too, for minutes)
    binary = ["--only-binary", ":all:"] if kind == "wheel" else ["--no-binary", "flashspec"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *binary, "--retries", "1", "--timeout", "30",
               f"flashspec=={version}", "-d", str(dest)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        reasons = [line.strip() for line in output.splitlines() if any(m in line for m in _NETWORK_MARKERS)]
        if reasons:
            raise PyPIUnreachable(f"pip download flashspec=={version} failed: {reasons[0][:300]}")
        raise RuntimeError(f"pip download flashspec=={version} ({kind}) failed:\n{output}")
    pattern = f"flashspec-{version}-*.whl" if kind == "wheel" else f"flashspec-{version}.tar.gz"
    found = sorted(dest.glob(pattern))
    if not found:
        raise RuntimeError(f"pip download left no {pattern} in {dest}")
    return found[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree_digest(folder: Path) -> str:
    """One digest over every file's relative path and bytes (byte-compiled caches left out)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _unpack(archive: Path, dest: Path) -> None:
    """Extract a wheel or an sdist into `dest` (written to a temporary folder first, then renamed)."""
    staging = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            wheel.extractall(staging)
    else:
        with tarfile.open(archive) as sdist:
            sdist.extractall(staging, filter="data")
    try:
        os.replace(staging, dest)
    except OSError:  # another process unpacked it meanwhile
        shutil.rmtree(staging, ignore_errors=True)


def fetch(version: str = AUDITED_VERSION, cache: Path | None = None) -> PublicPackage:
    """Download (once; later calls reuse the cache) and unpack the wheel and sdist of `flashspec==version`.

    Raises PyPIUnreachable when pip cannot reach the index, ValueError when a pinned digest does not match.
    """
    folder = (cache or cache_dir()) / f"flashspec-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    archives: dict[str, Path] = {}
    for kind, pattern in (("wheel", f"flashspec-{version}-*.whl"), ("sdist", f"flashspec-{version}.tar.gz")):
        found = sorted(folder.glob(pattern))
        if not found:
            staging = Path(tempfile.mkdtemp(prefix="download.", dir=folder))
            try:
                downloaded = _pip_download(version, staging, kind)
                os.replace(downloaded, folder / downloaded.name)
                found = [folder / downloaded.name]
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        archives[kind] = found[0]
    sha256 = {kind: _sha256(path) for kind, path in archives.items()}
    for kind, expected in PINNED_SHA256.get(version, {}).items():
        if sha256[kind] != expected:
            raise ValueError(f"{archives[kind].name}: SHA-256 {sha256[kind]} is not the audited {expected}")
    if not (folder / "wheel").is_dir():
        _unpack(archives["wheel"], folder / "wheel")
    if not (folder / "sdist").is_dir():
        _unpack(archives["sdist"], folder / "sdist")
    return PublicPackage(version, folder / "wheel", folder / "sdist" / f"flashspec-{version}", archives, sha256)


# ----------------------------------------------------------------------------------------------
# The child interpreter. It cannot import this module (the paper's package owns the name `flashspec`
# there), so its source is a string, run with `python -I -c`.

_DRIVER = r'''
import io, json, os, struct, sys, traceback

PROTOCOL = os.fdopen(os.dup(1), "wb")  # replies; fd 1 is pointed at stderr so prints cannot corrupt them
os.dup2(2, 1)
sys.stdout = sys.stderr
REQUESTS = sys.stdin.buffer
CODE_ROOT, SOURCE_ROOT = (os.path.realpath(p) for p in sys.argv[1:3])
sys.path.insert(0, CODE_ROOT)


def _editable(finder):
    module = getattr(finder, "__module__", "") or type(finder).__module__
    return module.startswith("__editable__")


sys.meta_path[:] = [finder for finder in sys.meta_path if not _editable(finder)]

import numpy as np
import torch

torch.set_num_threads(1)
import flashspec
from flashspec.sampling.rejection import rejection_sample


def receive():
    header = REQUESTS.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    data = np.load(io.BytesIO(REQUESTS.read(size)), allow_pickle=False)
    arrays = {key: data[key] for key in data.files}
    return json.loads(str(arrays.pop("meta"))), arrays


def send(meta, arrays):
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
    PROTOCOL.write(struct.pack("<Q", buffer.tell()) + buffer.getvalue())
    PROTOCOL.flush()


def relative(path):
    if not os.path.isabs(path):  # "<string>" (this driver) and compiled extensions' relative names
        return None
    path = os.path.realpath(path)
    for root in (CODE_ROOT, SOURCE_ROOT):
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return None


def portable(text):
    # paths inside the unpacked package, relative to it, so results do not depend on the cache folder
    return text.replace(SOURCE_ROOT + os.sep, "").replace(CODE_ROOT + os.sep, "")


def describe(error):
    frames = traceback.extract_tb(error.__traceback__)
    where = [f"{relative(f.filename)}:{f.lineno} in {f.name}" for f in frames if relative(f.filename)]
    return {"type": type(error).__name__, "message": portable(str(error)), "where": where}


def info(meta, arrays):
    import importlib.util
    return {"file": relative(flashspec.__file__), "module_version": flashspec.__version__,
            "sys_path": sys.path, "finds_our_lab": importlib.util.find_spec("flashspec_lab") is not None,
            "python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__}, {}


def score(logits, temperature):
    # as TargetModel.score_draft (engine/verifier.py): divide by T when T != 1, then log_softmax
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def verify(meta, arrays):
    torch.manual_seed(meta["seed"])
    draft_tokens = torch.from_numpy(arrays["draft_tokens"]).long()
    rows, gamma = draft_tokens.shape
    # score_draft returns the γ draft positions only: the target's position γ never reaches the verifier
    target_logprobs = score(torch.from_numpy(arrays["target_logits"])[:, :gamma], meta["temperature"])
    draft_logprobs = score(torch.from_numpy(arrays["draft_logits"]), meta["temperature"])
    accepted_ids, first_rejection, _ = rejection_sample(
        input_ids=torch.zeros(rows, 1, dtype=torch.long), draft_logprobs=draft_logprobs,
        target_logprobs=target_logprobs, draft_token_ids=draft_tokens, gamma=gamma)
    # SpeculativeEngine.generate keeps accepted_ids[accepted_ids != -1] in order; a stable sort of the -1s
    # to the end does that for every row at once, checked against the engine's own expression below
    order = torch.argsort((accepted_ids == -1).long(), dim=1, stable=True)
    emitted = torch.full((rows, gamma + 1), -1, dtype=torch.long)
    emitted[:, :gamma] = accepted_ids.gather(1, order)
    for row in range(min(rows, 64)):
        ids = accepted_ids[row:row + 1]
        new_tokens = ids[ids != -1].view(1, -1)
        assert torch.equal(emitted[row, :new_tokens.shape[1]], new_tokens[0])
        assert bool((emitted[row, new_tokens.shape[1]:] == -1).all())
    return {}, {"tokens": emitted.numpy(), "first_rejection": first_rejection.long().numpy()}


def paper_tests(meta, arrays):
    import pytest

    class Collect:
        def __init__(self):
            self.outcomes = {}

        def pytest_runtest_logreport(self, report):
            if report.when != "call" and report.passed:
                return
            entry = {"outcome": report.outcome, "when": report.when}
            crash = getattr(report.longrepr, "reprcrash", None)
            if report.failed and crash is not None:
                where = f"{relative(crash.path) or crash.path}:{crash.lineno}"
                entry.update(message=portable(crash.message), where=where)
            self.outcomes.setdefault(report.nodeid, entry)

    collect = Collect()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", SOURCE_ROOT,
                        *[os.path.join(SOURCE_ROOT, node) for node in meta["nodes"]]], plugins=[collect])
    return {"exit_code": int(code), "outcomes": collect.outcomes}, {}


class ToyDrafter:
    """A DraftModel over a toy table (prev2, prev1, position % period): samples γ tokens, returns log-probs."""

    def __init__(self, table, temperature, prompt_length, period):
        self.table, self.temperature, self.prompt_length, self.period = table, temperature, prompt_length, period

    def generate_draft(self, input_ids, gamma):
        prev2, prev1 = int(input_ids[0, -2]), int(input_ids[0, -1])
        position = input_ids.shape[1] - self.prompt_length
        tokens, logprobs = [], []
        for index in range(gamma):
            step = score(self.table[prev2, prev1, (position + index) % self.period], self.temperature)
            token = int(torch.multinomial(step.exp(), 1))
            tokens.append(token)
            logprobs.append(step)
            prev2, prev1 = prev1, token
        return torch.tensor([tokens]), torch.stack(logprobs).unsqueeze(0)


class ToyTarget:
    """A TargetModel over a toy table: log-probs at the γ draft positions, as score_draft returns them."""

    def __init__(self, table, prompt_length, period):
        self.table, self.prompt_length, self.period = table, prompt_length, period
        self.device, self.vocab_size = torch.device("cpu"), table.shape[-1]

    def score_draft(self, input_ids, draft_token_ids, gamma, temperature=1.0):
        prev2, prev1 = int(input_ids[0, -2]), int(input_ids[0, -1])
        position = input_ids.shape[1] - self.prompt_length
        logprobs = []
        for index in range(gamma):
            logprobs.append(score(self.table[prev2, prev1, (position + index) % self.period], temperature))
            prev2, prev1 = prev1, int(draft_token_ids[0, index])
        return torch.stack(logprobs).unsqueeze(0)


def thompson_engine(meta, arrays):
    from flashspec import BanditConfig, FlashSpecConfig, SamplingConfig, SpeculativeEngine
    from flashspec.bandit import ThompsonSelector

    tables = [torch.from_numpy(arrays[f"draft{i}"]) for i in range(meta["n_arms"])]
    prompt = torch.tensor([meta["prompt"]])
    config = FlashSpecConfig(device="cpu", dtype="float32", max_new_tokens=meta["max_new_tokens"],
                             bandit=BanditConfig(strategy="thompson", n_arms=meta["n_arms"]),
                             sampling=SamplingConfig(gamma=meta["gamma"], temperature=meta["temperature"]))
    drafters = [ToyDrafter(t, meta["temperature"], prompt.shape[1], meta["period"]) for t in tables]
    target = ToyTarget(torch.from_numpy(arrays["target"]), prompt.shape[1], meta["period"])
    bandit = ThompsonSelector(n_arms=meta["n_arms"])
    updates = []
    update = bandit.update

    def logged_update(arm, accepted):  # records what the engine feeds, then runs the selector's own update
        updates.append([int(arm), int(accepted)])
        update(arm, accepted=accepted)

    bandit.update = logged_update
    np.random.seed(meta["seed"])  # ThompsonSelector.select draws from numpy's global generator
    torch.manual_seed(meta["seed"])
    engine = SpeculativeEngine(config, drafters, target, bandit)
    result = {"updates": updates}
    try:
        output = engine.generate(prompt, max_new_tokens=meta["max_new_tokens"])
        result["output_ids"] = output.output_ids.tolist()
    except Exception as error:
        result["error"] = describe(error)
    result["posterior_alpha"], result["posterior_beta"] = list(bandit._post_alpha), list(bandit._post_beta)
    return result, {}


COMMANDS = {"info": info, "verify": verify, "paper_tests": paper_tests, "thompson_engine": thompson_engine}
while True:
    request = receive()
    if request is None or request[0]["command"] == "quit":
        break
    meta, arrays = request
    try:
        reply, reply_arrays = COMMANDS[meta["command"]](meta, arrays)
        send({"ok": True, **reply}, reply_arrays)
    except Exception as error:
        send({"ok": False, "error": describe(error)}, {})
'''


def _encode(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
    return struct.pack("<Q", buffer.tell()) + buffer.getvalue()


@dataclass
class Events:
    """What the public verifier did, counted over the rows of its calls (one row of one call = one speculative
    step; the harness keeps stepping rows that already have their length until every row has it)."""

    steps: int = 0
    leak_steps: int = 0  # more tokens emitted than first_rejection + 1: drafts after the first rejection kept
    leaked_tokens: int = 0
    all_accepted_steps: int = 0  # last draft replaced by a residual sample, no bonus token

    def add(self, tokens: np.ndarray, first_rejection: np.ndarray) -> None:
        gamma = tokens.shape[1] - 1
        emitted = (tokens != -1).sum(1)
        rejected = first_rejection < gamma
        extra = np.where(rejected, emitted - (first_rejection + 1), 0)
        self.steps += len(tokens)
        self.leak_steps += int((extra > 0).sum())
        self.leaked_tokens += int(extra.sum())
        self.all_accepted_steps += int((~rejected).sum())


@dataclass
class PublicCode:
    """The child interpreter running the public package; a context manager (starts it, stops it)."""

    package: PublicPackage
    events: Events = field(default_factory=Events)
    info: dict[str, Any] = field(default_factory=dict)
    _process: subprocess.Popen | None = None
    _stderr: Any = None

    def __enter__(self) -> PublicCode:
        self._stderr = tempfile.TemporaryFile()
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", _DRIVER, str(self.package.code_root), str(self.package.source_root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=self.package.source_root, env=env,
        )
        try:
            self.info = self.call("info")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            try:
                self._process.stdin.write(_encode({"command": "quit"}, {}))
                self._process.stdin.close()
                self._process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._stderr is not None:
            self._stderr.close()

    def _child_stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def call(self, command: str, meta: dict[str, Any] | None = None,
             arrays: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """One request; returns the reply's fields (arrays under their names); raises PublicCodeError."""
        process = self._process
        if process is None:
            raise RuntimeError("PublicCode is not running: use it as a context manager")
        try:
            process.stdin.write(_encode({"command": command, **(meta or {})}, arrays or {}))
            process.stdin.flush()
            header = process.stdout.read(8)
            if len(header) < 8:
                raise EOFError
            (size,) = struct.unpack("<Q", header)
            data = np.load(io.BytesIO(process.stdout.read(size)), allow_pickle=False)
        except (OSError, EOFError) as error:
            raise RuntimeError(
                f"the child running flashspec=={self.package.version} died:\n{self._child_stderr()}"
            ) from error
        reply_arrays = {key: data[key] for key in data.files}
        reply = json.loads(str(reply_arrays.pop("meta")))
        if not reply.pop("ok"):
            raise PublicCodeError(**{"type_name": reply["error"]["type"], "message": reply["error"]["message"],
                                     "where": reply["error"]["where"]})
        return {**reply, **reply_arrays}

    def verifier(self) -> exactness.Verifier:
        """The public rejection_sample (and the engine's token collection) in the harness's verifier signature."""

        def run(target_logits: torch.Tensor, draft_logits: torch.Tensor | None, draft_tokens: torch.Tensor,
                params: SamplingParams, generator: int, draft_noise: exactness.DraftNoise) -> VerifyOutput:
            if draft_logits is None:
                raise ValueError("the public verifier needs the draft's distribution (stochastic drafts only)")
            if params.top_k or params.top_p < 1.0 or params.temperature <= 0:
                raise ValueError("the public engine applies a temperature > 0 only (no top-k / top-p)")
            reply = self.call("verify", {"seed": int(generator), "temperature": float(params.temperature)}, {
                "target_logits": target_logits.float().numpy(), "draft_logits": draft_logits.float().numpy(),
                "draft_tokens": draft_tokens.long().numpy()})
            tokens, first_rejection = reply["tokens"], reply["first_rejection"]
            self.events.add(tokens, first_rejection)
            emitted = torch.from_numpy((tokens != -1).sum(1))
            return VerifyOutput(tokens=torch.from_numpy(tokens), num_accepted=emitted - 1)

        return run


# ----------------------------------------------------------------------------------------------
# Measurements


def _config(name: str) -> grid.ChiSquareCase:
    return next(config for config in grid.CONFIGS if config.name == name)


def chi_square(public: PublicCode, name: str) -> dict[str, Any]:
    """One configuration through the χ² harness: the public verifier and, as the positive control, ours."""
    config = _config(name)
    public.events = Events()
    public_fit = grid.run_config(config, public.verifier())
    ours_fit = grid.run_config(config, exactness.library_verifier())
    return {
        "config": name, "gamma": config.gamma, "temperature": config.params.temperature,
        "num_sequences": config.num_sequences, "length": grid.LENGTH, "vocab": grid.VOCAB,
        "exercises": list(EXERCISED.get(name, ())), "events": vars(public.events).copy(),
        "public": _fit_row(public_fit), "ours": _fit_row(ours_fit),
    }


def _fit_row(fit: exactness.FitResult) -> dict[str, Any]:
    return {"statistic": fit.statistic, "dof": fit.dof, "p_value": fit.p_value, "impossible": fit.impossible,
            "passes": fit.passes(grid.ALPHA_EACH)}


def residual_law_at_gamma1(public: PublicCode, num_sequences: int = 20_000, seed: int = 5) -> dict[str, Any]:
    """At γ = 1 the reading says every emitted token is a sample of the residual (p - q)+ / ||(p - q)+||,
    accepted draft or not.  χ² of the public verifier's first tokens against that law and against p."""
    config = _config("two-g1-T1.0")
    target, drafts = grid.grid_models(config)
    first = exactness.sample_sequences(target, drafts, config.params, 1, num_sequences, 1, seed,
                                       verifier=public.verifier())
    p = exactness.marginal_first_token(target, config.params)
    q = exactness.marginal_first_token(drafts[0], config.params)  # round robin: draft 0 proposes at step 0
    residual = np.maximum(p - q, 0.0) / np.maximum(p - q, 0.0).sum()
    return {"config": config.name, "num_sequences": num_sequences, "p": p.tolist(), "q": q.tolist(),
            "residual": residual.tolist(),
            "against_residual": _fit_row(exactness.chi_square_test(first, residual, grid.VOCAB)),
            "against_target": _fit_row(exactness.chi_square_test(first, p, grid.VOCAB))}


def gate_report(public: PublicCode) -> dict[str, Any]:
    """The paper's γ = 1, draft = target KS gate: its own test run verbatim on its code, and the same
    configuration through this harness (`exactness.paper_gate`) on the public verifier and on ours."""
    verbatim = public.call("paper_tests", {"nodes": [PAPER_GATE_TEST]})
    try:
        harness: dict[str, Any] = {"public": _fit_row(exactness.paper_gate(public.verifier(), grid.gate_target()))}
    except PublicCodeError as error:
        harness = {"public": {"error": error.as_dict()}}
    harness["ours"] = _fit_row(exactness.paper_gate(exactness.library_verifier(), grid.gate_target()))
    return {"paper_test": verbatim, "harness": harness}


def thompson(public: PublicCode, seed: int = 0, max_new_tokens: int = 64) -> dict[str, Any]:
    """The public engine with its ThompsonSelector (it feeds the count of accepted drafts to `update`), and the
    same (arm, count) sequence fed to our ThompsonSampling through `update_step`."""
    from flashspec import bandits

    target, drafts = grid.grid_models(_config("two-g2-T1.0"))
    arrays = {"target": target.table.numpy()} | {f"draft{i}": d.table.numpy() for i, d in enumerate(drafts)}
    vocab = target.vocab
    public_run = public.call("thompson_engine", {
        "n_arms": len(drafts), "gamma": THOMPSON_GAMMA, "temperature": 1.0, "max_new_tokens": max_new_tokens,
        "seed": seed, "prompt": [vocab, vocab], "period": exactness.CONTEXT_PERIOD}, arrays)
    policy = bandits.ThompsonSampling(n_arms=len(drafts), seed=seed)
    for arm, accepted in public_run["updates"]:
        policy.select()
        policy.update_step(arm, accepted, THOMPSON_GAMMA)
    after = policy.select()  # the call that follows the last update, where the public selector raised
    count = next((accepted for _, accepted in public_run["updates"] if accepted > 1), None)
    as_reward = None
    if count is not None:
        try:
            bandits.ThompsonSampling(n_arms=len(drafts), seed=seed).update(0, count)
            as_reward = "accepted"
        except ValueError as error:
            as_reward = f"ValueError: {error}"
    alpha, beta = policy.posterior()
    return {
        "gamma": THOMPSON_GAMMA, "seed": seed, "public": public_run,
        "ours": {"update_step": "ok", "select_after": int(after), "posterior_alpha": alpha[0].tolist(),
                 "posterior_beta": beta[0].tolist(), "count_fed_to_update": count, "update_with_count": as_reward},
    }


def verdicts(report: dict[str, Any]) -> dict[str, str]:
    """Each claim the book makes about the public code, against what was measured."""
    rows = {row["config"]: row for row in report["chi_square"]}
    leak_rows = [row for row in rows.values() if "post_rejection_leak" in row["exercises"]]
    leak = all(not r["public"]["passes"] and r["events"]["leak_steps"] > 0 for r in leak_rows)
    bonus = not rows["two-g1-T1.0"]["public"]["passes"] and rows["two-g1-T1.0"]["events"]["all_accepted_steps"] > 0
    ours_pass = all(row["ours"]["passes"] for row in rows.values())
    error = report["thompson"]["public"].get("error")
    gate = report["paper_gate"]["paper_test"]["outcomes"].get(PAPER_GATE_TEST, {})
    law = report["residual_law_at_gamma1"]
    return {
        "gamma1_output_follows_residual_not_target": (
            "holds" if law["against_residual"]["passes"] and not law["against_target"]["passes"] else "does not hold"),
        "post_rejection_leak": "holds" if leak else "does not hold",
        "bonus_from_residual": "holds" if bonus else "does not hold",
        "our_verifier_passes_same_harness": "yes" if ours_pass else "NO",
        "thompson_crashes_on_counts": f"holds: {error['type']}: {error['message']}" if error else "does not hold",
        "paper_gate_passes_on_public_code": (
            "passes" if gate.get("outcome") == "passed"
            else f"does not hold: the test {gate.get('outcome')} ({gate.get('message', '')} at {gate.get('where')})"
        ),
    }


def measure(package: PublicPackage) -> dict[str, Any]:
    """Every measurement of the public package, as stored in results/public_code_<version>.json."""
    with PublicCode(package) as public:
        report: dict[str, Any] = {
            "child": {key: public.info[key] for key in ("file", "module_version", "finds_our_lab",
                                                        "python", "torch", "numpy")},
            "chi_square": [chi_square(public, name) for name in EXERCISED],
            "residual_law_at_gamma1": residual_law_at_gamma1(public),
            "paper_gate": gate_report(public),
            "paper_tests": public.call("paper_tests", {"nodes": list(PAPER_TEST_FILES)}),
            "thompson": thompson(public),
        }
    report["verdicts"] = verdicts(report)
    return report


# Where each finding sits in the 0.1.4 package (paths relative to the unpacked wheel or sdist).
SOURCE_READING = {
    "verifier": "flashspec/sampling/rejection.py: rejection_sample (l. 26), _sample_residual (l. 185); "
                "called by flashspec/engine/speculative.py:204 (SpeculativeEngine.generate)",
    "post_rejection_leak": "rejection.py:160-164 sets to -1 only the rejected slots (masked_fill(~accepted_mask, "
                           "-1)), not the slots after the first rejection; speculative.py:228 emits every slot "
                           "that is not -1",
    "bonus_from_residual": "rejection.py:175-176 writes the residual sample at min(first_rejection, γ-1): when all γ "
                           "drafts pass, it replaces draft γ-1 by a sample of (p-q)+ at γ-1 (_sample_residual, "
                           "l. 223-234); engine/verifier.py:154-162 scores γ positions only, so no bonus token exists",
    "empty_residual": "rejection.py:229-234: when (p-q)+ is 0 at that slot (all accepted and p = q), residual / 1e-9 "
                      "is all zeros and torch.multinomial raises RuntimeError",
    "thompson": "speculative.py:221-222 passes int(mean first_rejection), a count in [0, γ], to "
                "ThompsonSelector.update; bandit/thompson.py:140-141 adds it to α and 1 - count to β; "
                "select (l. 106) then calls np.random.beta with β <= 0",
    "paper_gate": "tests/integration/test_e2e_sampling.py:142-162 (sdist): γ = 1, draft_logprobs = target_logprobs "
                  "(l. 86), KS at N = 10,000, α = 0.01",
}


def main(argv: list[str] | None = None) -> int:
    """`python -m experiments.public_code [--version 0.1.4] [--out results/public_code_0.1.4.json]`."""
    parser = argparse.ArgumentParser(prog="python -m experiments.public_code", description=main.__doc__)
    parser.add_argument("--version", default=AUDITED_VERSION, help="flashspec release on PyPI to audit")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default results/public_code_<version>.json)")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    out = args.out or _REPO_ROOT / "results" / f"public_code_{args.version}.json"
    torch.set_num_threads(1)
    started = provenance.record(["python -m experiments.public_code", *(argv if argv is not None else sys.argv[1:])])
    package = fetch(args.version)
    report = measure(package)
    settings = {
        "public_package": {
            "name": "flashspec", "version": package.version, "index": "PyPI (pip download --no-deps)",
            "archives": {kind: {"file": path.name, "sha256": package.sha256[kind]}
                         for kind, path in package.archives.items()},
            "code_identical_in_wheel_and_sdist": package.code_identical(),
            "run_from": "wheel",
        },
        "alpha_each": grid.ALPHA_EACH,
    }
    provenance.write_result(out, started, settings, {**report, "source_reading": SOURCE_READING})
    print(f"wrote {out}")
    for claim, verdict in report["verdicts"].items():
        print(f"  {claim}: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
