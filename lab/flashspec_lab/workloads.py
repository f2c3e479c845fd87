"""Chat prompts for real instruct models: six task categories in the spirit of Spec-Bench, as chat messages.

Every real-model measurement (SmolLM2-135M-Instruct, a ChatML model) serves these prompts, so that results are
comparable across categories, request streams and machines.  Categories:

- ``conversation``: a prior user/assistant exchange, then a follow-up user turn;
- ``coding``: write, fix or explain code;
- ``math``: grade-school word problems that need step-by-step reasoning;
- ``summarisation``, ``qa``, ``rewriting``: a task over a passage of the Python documentation topics shipped with
  the interpreter (``pydoc_data.topics``, PSF-2.0), named by a fixed topic key and cut at a paragraph boundary.

Instructions, conversations, code and problems are original to FlashSpec (``data/prompts.json``, where
``{passage}`` marks the passage's place).  Passages come from the running interpreter, so a topic key it lacks is
an error naming the key rather than a silently different set; `fingerprint` names the exact text served.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CATEGORIES: tuple[str, ...] = ("conversation", "coding", "math", "summarisation", "qa", "rewriting")
PASSAGE_LIMITS: dict[str, int] = {"summarisation": 1500, "qa": 1500, "rewriting": 700}  # characters
MIN_PASSAGE_CHARS = 300
PLACEHOLDER = "{passage}"
SOURCE_PREFIX = "pydoc_data.topics:"
DATA_FILE = "data/prompts.json"

_SENTENCE_END = re.compile(r"[.?!][\"')]*(\s*\[\d+\])?$")  # "...end.", "...end.)", "...end. [1]"


@dataclass(frozen=True)
class Prompt:
    """One request: chat `messages` ({"role", "content"} dicts, ending with a user turn), ready for
    `tokenizer.apply_chat_template`; `source` is ``pydoc_data.topics:<key>`` for a passage prompt, else None."""

    id: str
    category: str
    messages: tuple[dict[str, str], ...]
    source: str | None = None


def topic_text(key: str) -> str:
    """The full text of pydoc topic `key` in this interpreter; a missing key is a ValueError naming it."""
    try:
        from pydoc_data.topics import topics
    except ImportError as error:
        raise ValueError("this Python ships without pydoc_data, which the summarisation, qa and rewriting prompts "
                         "take their passages from; use a full CPython install") from error
    if key not in topics:
        version = ".".join(map(str, sys.version_info[:3]))
        raise ValueError(f"pydoc_data.topics has no topic {key!r} in Python {version}; the prompt set needs it "
                         f"(run under a Python that has it, e.g. 3.11 or 3.12)")
    return topics[key]


def passage(key: str, limit: int = 1500) -> str:
    """The opening of pydoc topic `key` (its title line dropped), cut at a paragraph boundary to at most `limit`
    characters and ending with a prose sentence, not a heading, a lead-in colon or a code block."""
    paragraphs = topic_text(key).split("\n\n")
    start = 1 if paragraphs and _is_heading(paragraphs[0]) else 0
    end, size = start, 0
    while end < len(paragraphs) and size + len(paragraphs[end]) + 2 <= limit:
        size += len(paragraphs[end]) + 2
        end += 1
    while end > start and not _ends_sentence(paragraphs[end - 1]):
        end -= 1
    text = "\n\n".join(paragraphs[start:end]).strip("\n")
    if len(text) < MIN_PASSAGE_CHARS:
        raise ValueError(f"pydoc topic {key!r} gives a passage of {len(text)} characters within {limit}, fewer than "
                         f"{MIN_PASSAGE_CHARS}; this Python's documentation differs from the one the set was made "
                         f"for (3.11, 3.12)")
    return text


def prompts(categories: Iterable[str] | None = None) -> list[Prompt]:
    """All prompts of `categories` (default: all of CATEGORIES), category by category in the order given, each
    category in the data file's order.  Every call builds fresh messages, so callers may edit them."""
    names = _check_categories(categories)
    return [prompt for name in names for prompt in _category(name)]


def render(tokenizer: Any, prompt: Prompt) -> torch.Tensor:
    """Token ids [1, n] (int64) of `prompt` through the tokenizer's chat template, ending with the assistant
    header (``add_generation_prompt=True``) so that an instruct model answers rather than continues."""
    if not isinstance(prompt, Prompt):
        raise TypeError(f"prompt must be a workloads.Prompt (from prompts(), stream() or mixed()), "
                        f"got {type(prompt).__name__}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("render needs a tokenizer with a chat template, and this one has none: use the instruct "
                         "model's own tokenizer (e.g. from flashspec.real.load_smollm2) or set "
                         "tokenizer.chat_template")
    encoded = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=True,
                                            return_dict=True, return_tensors="pt")
    return encoded["input_ids"]


def stream(categories: Iterable[str] | None = None, switch_every: int = 4, requests: int | None = None,
           seed: int = 0) -> list[Prompt]:
    """A task-switching stream: `switch_every` consecutive requests of one category, then the next category,
    cycling, as a server sees when users change task.

    The category order and each category's prompt order are drawn from `seed`.  Inside a category every prompt is
    served once before any repeats (a fresh order for each further pass).  `requests` defaults to the number of
    prompts selected; with the shipped set (equal category sizes, 24) and a `switch_every` dividing 24 that
    serves every prompt exactly once.
    """
    names = _check_categories(categories)
    switch_every = _check_int("switch_every", switch_every, 1)
    seed = _check_int("seed", seed, None)
    pools = {name: _category(name) for name in names}
    total = sum(map(len, pools.values())) if requests is None else _check_int("requests", requests, 1)
    chooser = random.Random(seed)
    order = chooser.sample(names, len(names))
    queues = {name: chooser.sample(pools[name], len(pools[name])) for name in order}
    served: list[Prompt] = []
    block = 0
    while len(served) < total:
        name = order[block % len(order)]
        for _ in range(min(switch_every, total - len(served))):
            if not queues[name]:
                queues[name] = chooser.sample(pools[name], len(pools[name]))
            served.append(queues[name].pop(0))
        block += 1
    return served


def mixed(seed: int = 0, categories: Iterable[str] | None = None) -> list[Prompt]:
    """Every prompt of `categories` once, in an order drawn from `seed`: a mixed workload whose next category is
    random (where ``stream(switch_every=1)`` alternates categories strictly)."""
    names = _check_categories(categories)
    seed = _check_int("seed", seed, None)
    pool = prompts(names)
    return random.Random(seed).sample(pool, len(pool))


def fingerprint(served: Sequence[Prompt]) -> str:
    """SHA-256 of the ids, categories, sources and messages of `served`, in order: names the exact text of a
    workload in a record (passages follow the interpreter's documentation)."""
    rows = [[p.id, p.category, p.source, [dict(m) for m in p.messages]] for p in served]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def _category(name: str) -> list[Prompt]:
    """The prompts of one (checked) category, passages filled in from this interpreter's pydoc topics."""
    built = []
    for entry in _data()[name]:
        messages = tuple(dict(message) for message in entry["messages"])
        source = None
        if name in PASSAGE_LIMITS:
            source = SOURCE_PREFIX + entry["topic"]
            text = passage(entry["topic"], PASSAGE_LIMITS[name])
            last = messages[-1]
            messages = messages[:-1] + ({**last, "content": last["content"].replace(PLACEHOLDER, text)},)
        built.append(Prompt(id=entry["id"], category=name, messages=messages, source=source))
    return built


@lru_cache(maxsize=1)
def _data() -> dict[str, list[dict[str, Any]]]:
    """The shipped prompt file, checked once: every category present, unique ids, chat turns alternating and
    ending with a user turn, and a passage placeholder exactly where a passage belongs."""
    data = json.loads(resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8"))["prompts"]
    if tuple(data) != CATEGORIES:
        raise ValueError(f"{DATA_FILE} has categories {list(data)}, expected {list(CATEGORIES)}")
    seen: set[str] = set()
    for name, entries in data.items():
        for entry in entries:
            where = f"{DATA_FILE}, {entry.get('id')!r}"
            if entry["id"] in seen:
                raise ValueError(f"{where}: the id is used twice")
            seen.add(entry["id"])
            roles = [message["role"] for message in entry["messages"]]
            if roles != ["user", "assistant"] * (len(roles) // 2) + ["user"]:
                raise ValueError(f"{where}: roles {roles} do not alternate user/assistant ending with user")
            holders = sum(message["content"].count(PLACEHOLDER) for message in entry["messages"])
            wanted = name in PASSAGE_LIMITS
            if (holders != int(wanted) or ("topic" in entry) != wanted
                    or (wanted and PLACEHOLDER not in entry["messages"][-1]["content"])):
                raise ValueError(f"{where}: a {name} prompt needs {int(wanted)} {PLACEHOLDER} (in its last turn) "
                                 f"and {'a' if wanted else 'no'} topic")
    return data


def _is_heading(paragraph: str) -> bool:
    lines = paragraph.strip("\n").splitlines()
    return len(lines) == 2 and len(lines[1]) >= 3 and set(lines[1]) <= set("*=-")


def _ends_sentence(paragraph: str) -> bool:
    return (not paragraph.startswith(" ") and not _is_heading(paragraph)
            and _SENTENCE_END.search(paragraph.rstrip()) is not None)


def _check_categories(categories: Iterable[str] | None) -> tuple[str, ...]:
    if categories is None:
        return CATEGORIES
    if isinstance(categories, str):
        raise ValueError(f"categories must be a list of category names, not the string {categories!r}; "
                         f"pass [{categories!r}]")
    try:
        names = tuple(categories)
    except TypeError:
        raise ValueError(f"categories must be a list of names from {list(CATEGORIES)} or None, "
                         f"got {categories!r}") from None
    if not names:
        raise ValueError(f"categories is empty; pass None for all, or some of {list(CATEGORIES)}")
    unknown = [name for name in names if name not in CATEGORIES]
    if unknown:
        raise ValueError(f"categories: unknown {unknown}; the valid ones are {list(CATEGORIES)}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"categories: {repeated} given more than once; name each category once")
    return names


def _check_int(name: str, value: Any, minimum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        wanted = "an int" if minimum is None else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return value
