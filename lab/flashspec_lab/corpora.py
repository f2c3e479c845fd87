"""Three text domains assembled offline from files every FlashSpec machine already has.

The model zoo needs real text in distinct domains, and no machine the project runs on can download
datasets.  Everything here comes from the running Python interpreter and the installed PyTorch wheel
(a hard dependency), so a fresh machine with no internet and no apt packages can build it:

- ``python``: source code of the interpreter's standard library (tests, idlelib, the generated codec
  tables of ``encodings`` and site-packages excluded), docstrings removed: they are English prose and
  the ``prose`` domain uses them.  Licence: PSF-2.0.
- ``prose``: English technical prose -- the interpreter's documentation topics (``pydoc_data.topics``),
  then docstrings of the standard library, then docstrings of PyTorch's Python modules, with doctest
  lines removed.  Licences: PSF-2.0 (Python docs and stdlib), BSD-3-Clause (PyTorch).
- ``cpp``: C++ headers of PyTorch's own libraries (``torch/include/{ATen,c10,torch}``, generated
  per-operator headers under ``ATen/ops`` excluded).  Licence: BSD-3-Clause.

Documents are visited in a fixed pseudo-random order (SHA-1 of their source id) and split into train and
held-out by the hash of the *file* they come from, so a stdlib file's docstrings (prose) and its code
(python) are both held out or both trained on.  Each assembled domain records the SHA-256 of its text.
"""
from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass

DOMAINS: tuple[str, ...] = ("python", "prose", "cpp")

LICENCES: dict[str, str] = {
    "python": "PSF-2.0 (CPython standard library source, shipped with the interpreter)",
    "prose": "PSF-2.0 (pydoc_data.topics and CPython stdlib docstrings); BSD-3-Clause (PyTorch docstrings)",
    "cpp": "BSD-3-Clause (PyTorch C++ headers: ATen, c10, torch)",
}

DOCUMENT_SEPARATOR = "\n\n"
MAX_DOCUMENT_CHARS = 20_000  # longer files are cut so one generated header cannot dominate a domain
MIN_DOCSTRING_CHARS = 120
CPP_SUFFIXES = (".h", ".hpp", ".cuh")
CPP_SUBDIRS = ("ATen", "c10", "torch")


@dataclass(frozen=True)
class Document:
    """One unit of text: `source` names where it came from, `split_key` decides train vs held-out."""

    domain: str
    source: str
    split_key: str
    text: str


@dataclass(frozen=True)
class DomainCorpus:
    """The assembled text of one domain, split into train and held-out documents."""

    domain: str
    train_text: str
    heldout_text: str
    num_train_documents: int
    num_heldout_documents: int
    licence: str

    @property
    def sha256(self) -> str:
        """SHA-256 of the train text, a separator line, then the held-out text (UTF-8)."""
        digest = hashlib.sha256(self.train_text.encode("utf-8"))
        digest.update(b"\n=== heldout ===\n")
        digest.update(self.heldout_text.encode("utf-8"))
        return digest.hexdigest()

    def manifest(self) -> dict[str, object]:
        """JSON-ready description: sizes, document counts, licence, SHA-256."""
        return {
            "domain": self.domain,
            "train_chars": len(self.train_text),
            "heldout_chars": len(self.heldout_text),
            "num_train_documents": self.num_train_documents,
            "num_heldout_documents": self.num_heldout_documents,
            "licence": self.licence,
            "sha256": self.sha256,
        }


def _order_key(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8")).hexdigest()


def is_heldout(split_key: str, heldout_every: int) -> bool:
    """Deterministic split: a file is held out when its SHA-1 falls in one bucket of `heldout_every`."""
    return int(_order_key("split:" + split_key)[:8], 16) % heldout_every == 0


def stdlib_dir() -> str:
    """The running interpreter's standard-library folder."""
    return sysconfig.get_paths()["stdlib"]


def _stdlib_files() -> list[str]:
    """Relative paths of stdlib .py files, tests/idlelib/site-packages excluded, in hash order."""
    root = stdlib_dir()
    # encodings/: ~100 generated codec tables that are the same file up to the table (near-duplicates would
    # leak from train into held-out)
    skipped = {"test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "__pycache__",
               "encodings"}
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in skipped and not d.startswith("test"))
        for name in files:
            if name.endswith(".py") and not name.startswith("test_"):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found, key=_order_key)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def strip_docstrings(text: str) -> str:
    """Python source without its module, class and function docstrings (a body that was only a docstring
    becomes ``pass``), so the code domain holds code and the prose domain holds the prose."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return text
    lines = text.splitlines(keepends=True)
    replaced: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            start, end = first.lineno - 1, first.end_lineno or first.lineno
            for index in range(start, end):
                replaced[index] = ""
            if len(node.body) == 1 and not isinstance(node, ast.Module):
                replaced[start] = " " * first.col_offset + "pass\n"
    return "".join(replaced.get(index, line) for index, line in enumerate(lines))


def python_documents() -> Iterator[Document]:
    """Standard-library modules without docstrings, one document per file."""
    root = stdlib_dir()
    for relpath in _stdlib_files():
        text = _read_text(os.path.join(root, relpath))
        text = strip_docstrings(text) if text else text
        if text and text.strip():
            yield Document("python", "stdlib:" + relpath, "stdlib:" + relpath, text[:MAX_DOCUMENT_CHARS])


def _clean_prose(text: str) -> str:
    """Drop doctest lines (`>>>` / `...`) so the prose domain stays prose."""
    kept = [line for line in text.splitlines() if not line.lstrip().startswith((">>>", "..."))]
    return "\n".join(kept).strip()


def _docstrings(path: str) -> str:
    """Module, class and function docstrings of one Python file, joined by blank lines."""
    text = _read_text(path)
    if text is None:
        return ""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                cleaned = _clean_prose(doc)
                if cleaned:
                    parts.append(cleaned)
    return DOCUMENT_SEPARATOR.join(parts)


def torch_dir() -> str:
    """The installed PyTorch package folder (imported lazily: torch is a hard dependency anyway)."""
    import torch

    return os.path.dirname(torch.__file__)


def _torch_python_files() -> list[str]:
    root = torch_dir()
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in {"testing", "test", "include", "__pycache__"})
        for name in files:
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found, key=_order_key)


def prose_documents() -> Iterator[Document]:
    """Documentation topics first, then stdlib docstrings, then PyTorch docstrings."""
    from pydoc_data import topics

    for name in sorted(topics.topics, key=_order_key):
        text = _clean_prose(topics.topics[name])
        if text:
            yield Document("prose", "pydoc_data.topics:" + name, "pydoc_data.topics:" + name, text)
    root = stdlib_dir()
    for relpath in _stdlib_files():
        text = _docstrings(os.path.join(root, relpath))
        if text:
            yield Document("prose", "stdlib-docstrings:" + relpath, "stdlib:" + relpath, text[:MAX_DOCUMENT_CHARS])
    root = torch_dir()
    for relpath in _torch_python_files():
        text = _docstrings(os.path.join(root, relpath))
        if text:
            yield Document("prose", "torch-docstrings:" + relpath, "torch:" + relpath, text[:MAX_DOCUMENT_CHARS])


def torch_include_dir() -> str:
    return os.path.join(torch_dir(), "include")


def cpp_documents() -> Iterator[Document]:
    """PyTorch's own C++ headers, one document per file (generated ATen/ops headers excluded)."""
    root = torch_include_dir()
    found = []
    for subdir in CPP_SUBDIRS:
        for folder, subfolders, files in os.walk(os.path.join(root, subdir)):
            subfolders[:] = sorted(d for d in subfolders if d != "ops")
            for name in files:
                if name.endswith(CPP_SUFFIXES):
                    found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    for relpath in sorted(found, key=_order_key):
        text = _read_text(os.path.join(root, relpath))
        if text and text.strip():
            yield Document("cpp", "torch-include:" + relpath, "torch-include:" + relpath, text[:MAX_DOCUMENT_CHARS])


DOCUMENT_SOURCES = {"python": python_documents, "prose": prose_documents, "cpp": cpp_documents}


def check_sources_available() -> None:
    """Raise a clear error when a domain's source files are missing on this machine."""
    if not os.path.isfile(os.path.join(stdlib_dir(), "os.py")):
        raise RuntimeError(f"flashspec corpora: the Python standard library was not found at {stdlib_dir()}")
    try:
        from pydoc_data import topics  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            "flashspec corpora: pydoc_data.topics is missing from this Python (Debian: apt-get install "
            "libpython3-stdlib, or use a python.org/pyenv/conda build)"
        ) from error
    if not all(os.path.isdir(os.path.join(torch_include_dir(), d)) for d in CPP_SUBDIRS):
        raise RuntimeError(
            f"flashspec corpora: PyTorch C++ headers not found under {torch_include_dir()} "
            "(install the standard torch wheel from PyPI, which ships them)"
        )


def assemble_domain(domain: str, max_train_chars: int, heldout_every: int = 10,
                    max_heldout_chars: int | None = None) -> DomainCorpus:
    """Collect one domain's documents until `max_train_chars` of train text (and a tenth of it held out)."""
    if domain not in DOCUMENT_SOURCES:
        raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
    if max_train_chars <= 0:
        raise ValueError(f"max_train_chars must be positive, got {max_train_chars}")
    if heldout_every < 2:
        raise ValueError(f"heldout_every must be >= 2, got {heldout_every}")
    heldout_cap = max_train_chars // heldout_every if max_heldout_chars is None else max_heldout_chars
    train, heldout = [], []
    train_chars = heldout_chars = 0
    for document in DOCUMENT_SOURCES[domain]():
        if is_heldout(document.split_key, heldout_every):
            if heldout_chars < heldout_cap:
                heldout.append(document.text)
                heldout_chars += len(document.text) + len(DOCUMENT_SEPARATOR)
        elif train_chars < max_train_chars:
            train.append(document.text)
            train_chars += len(document.text) + len(DOCUMENT_SEPARATOR)
        if train_chars >= max_train_chars and heldout_chars >= heldout_cap:
            break
    if not train or not heldout:
        raise RuntimeError(f"flashspec corpora: domain {domain!r} produced no train or no held-out text")
    return DomainCorpus(
        domain=domain,
        train_text=DOCUMENT_SEPARATOR.join(train)[:max_train_chars],
        heldout_text=DOCUMENT_SEPARATOR.join(heldout)[:heldout_cap],
        num_train_documents=len(train),
        num_heldout_documents=len(heldout),
        licence=LICENCES[domain],
    )


def assemble(max_train_chars: int, domains: tuple[str, ...] = DOMAINS,
             heldout_every: int = 10) -> dict[str, DomainCorpus]:
    """All domains, each capped at `max_train_chars` characters of training text."""
    check_sources_available()
    return {domain: assemble_domain(domain, max_train_chars, heldout_every) for domain in domains}


def corpora_sha256(corpora: dict[str, DomainCorpus]) -> str:
    """One SHA-256 over the per-domain hashes, in domain order (the zoo's cache key uses it)."""
    digest = hashlib.sha256()
    for domain in sorted(corpora):
        digest.update(f"{domain}:{corpora[domain].sha256}\n".encode())
    return digest.hexdigest()
