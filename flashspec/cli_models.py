"""The models `flashspec generate` loads: checkpoints (--target/--draft), the offline real model (--real), the lab's
zoo (--zoo) and the tiny default models, each failure turned into a ValueError naming the option (the CLI prints
it as one line)."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

def checkpoint_models(args: argparse.Namespace) -> tuple[Any, list[Any], Any]:
    """The --target and --draft checkpoints and the target's tokenizer, checked to share one vocabulary."""
    from flashspec import models

    trust = args.trust_remote_code
    model = partial(models.load_model, dtype=args.dtype, quantization=args.quantization, device=args.device,
                    trust_remote_code=trust)
    tokenizer_of = partial(models.load_tokenizer, trust_remote_code=trust)
    target = load_checkpoint("--target", args.target, partial(model, args.target))
    drafts = [load_checkpoint("--draft", path, partial(model, path)) for path in args.draft]
    tokenizer = load_checkpoint("--target", args.target, partial(tokenizer_of, args.target))
    for draft, path in zip(drafts, args.draft):
        draft_tokenizer = load_checkpoint("--draft", path, partial(tokenizer_of, path))
        models.check_compatible(target, draft, tokenizer, draft_tokenizer, draft_name=f"--draft {path}")
    return target, drafts, tokenizer


def real_models(args: argparse.Namespace) -> tuple[Any, list[Any], Any]:
    """--real NAME's target and tokenizer (flashspec.real, offline), and any --draft checkpoints checked
    to share its tokenizer."""
    from flashspec import models, real

    if args.quantization is not None:
        raise ValueError(f"--real {args.real} loads dequantised float weights; drop --quantization")
    try:
        target, tokenizer = real.load_real(args.real, device=args.device,
                                           dtype=None if args.dtype == "auto" else args.dtype)
    except ValueError as error:
        raise ValueError(f"--real {args.real}: {one_line(error, limit=600)}") from error
    except Exception as error:  # noqa: BLE001 -- e.g. a damaged cached conversion
        raise ValueError(
            f"--real {args.real}: could not load it ({type(error).__name__}: {one_line(error)}); delete the "
            f"cached conversion under {real.cache_root()} to convert it again"
        ) from error
    drafts = []
    for path in args.draft:
        load = partial(models.load_model, path, dtype=args.dtype, device=args.device,
                       trust_remote_code=args.trust_remote_code)
        draft = load_checkpoint("--draft", path, load)
        draft_tokenizer = load_checkpoint(
            "--draft", path, partial(models.load_tokenizer, path, trust_remote_code=args.trust_remote_code))
        models.check_compatible(target, draft, tokenizer, draft_tokenizer, draft_name=f"--draft {path}")
        drafts.append(draft)
    return target, drafts, tokenizer


def load_checkpoint(option: str, name: str, load: Callable[[], Any]) -> Any:
    """Run `load` and turn any failure into a ValueError naming the option and the checkpoint.

    Whatever goes wrong inside a load (a truncated safetensors file, a malformed config, a missing
    tokenizer, a failed download) comes from the checkpoint the user named, so every exception
    type is caught here; the message keeps the exception's type and text so a real bug stays visible.
    """
    try:
        return load()
    except ValueError as error:
        raise ValueError(f"{option} {name}: {one_line(error)}") from error
    except Exception as error:  # noqa: BLE001 -- any failure reading the checkpoint is bad input
        raise ValueError(
            f"{option} {name}: could not load it ({type(error).__name__}: {one_line(error)}); pass a folder "
            "holding a complete, uncorrupted checkpoint (config.json, weights, tokenizer) or a hub id"
        ) from error


def one_line(error: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (library messages often span several), cut to `limit` characters."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def zoo_models(size: str, device: str | None) -> tuple[Any, list[Any], Any]:
    """The offline model zoo's target, drafts and tokenizer (flashspec_lab.zoo builds and caches them)."""
    try:
        from flashspec_lab import zoo
    except ImportError as error:
        raise ValueError(f"--zoo needs flashspec_lab.zoo, which failed to import ({error})") from error
    loaded = zoo.load_zoo(size, device=device)
    return loaded.target, list(loaded.drafts.values()), loaded.tokenizer


def default_models(device: str | None) -> tuple[Any, list[Any], Any]:
    """No-download default: a character tokenizer and tiny random Llama models built on the fly.
    Their weights are random, so the text is noise; pass --target for a real model."""
    from flashspec import models

    tokenizer = models.char_tokenizer()
    vocab = len(tokenizer)
    where = models.default_device() if device is None else device
    common = dict(vocab_size=vocab, max_positions=1024, device=where, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    target = models.tiny_llama(hidden_size=64, num_layers=2, num_heads=4, seed=0, **common)
    drafts = [
        models.tiny_llama(hidden_size=32, num_layers=1, num_heads=2, seed=1, **common),
        models.tiny_llama(hidden_size=32, num_layers=1, num_heads=2, seed=2, **common),
    ]
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for all
        print(
            "flashspec: no --target given: tiny random models built on the fly (the text is noise; "
            "pass --target PATH for a real model)",
            file=sys.stderr,
        )
    return target, drafts, tokenizer


