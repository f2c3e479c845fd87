"""The `flashspec` command.

    flashspec generate --prompt "..."                    # no download: tiny random models built on the fly
    flashspec generate --target PATH --draft PATH [--draft PATH] --prompt-lookup --policy thompson \\
                       --gamma 4 --temperature 0.8 --max-new-tokens 128 --prompt "..."
    flashspec bench verify ...   -> flashspec.bench.main(argv)
    flashspec bench engine ...   -> flashspec.bench_engine.main(argv)
    flashspec zoo ...            -> flashspec.zoo.main(argv)
    flashspec bandits ...        -> flashspec.simulate.main(argv)

`generate` streams the text of the first prompt as it is accepted, with a progress bar on stderr
and the summary table at the end.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

DISPATCH = {
    ("bench", "verify"): "flashspec.bench",
    ("bench", "engine"): "flashspec.bench_engine",
    ("zoo",): "flashspec.zoo",
    ("bandits",): "flashspec.simulate",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    command = args[0]
    if command == "generate":
        return generate_command(args[1:])
    if command == "bench":
        if len(args) < 2 or args[1] not in ("verify", "engine"):
            print("usage: flashspec bench {verify,engine} [options]", file=sys.stderr)
            return 2
        return dispatch(DISPATCH[("bench", args[1])], args[2:])
    if (command,) in DISPATCH:
        return dispatch(DISPATCH[(command,)], args[1:])
    print(f"flashspec: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
    return 2


def usage() -> str:
    return (
        "usage: flashspec {generate,bench verify,bench engine,zoo,bandits} [options]\n"
        "  generate      speculative generation (default: tiny random models, no download)\n"
        "  bench verify  verification kernel benchmark\n"
        "  bench engine  engine benchmark: FlashSpec vs HF assisted vs plain decoding\n"
        "  zoo           build or inspect the offline model zoo\n"
        "  bandits       bandit simulations\n"
        "run `flashspec <command> --help` for the options of a command"
    )


def dispatch(module_name: str, argv: list[str]) -> int:
    """Import `module_name` only now (so one missing module breaks only its own command) and run main."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        print(f"flashspec: {module_name} is not available ({error}); this command cannot run", file=sys.stderr)
        return 2
    entry = getattr(module, "main", None)
    if not callable(entry):
        print(f"flashspec: {module_name} has no main(argv); this command cannot run", file=sys.stderr)
        return 2
    result = entry(argv)
    return int(result) if isinstance(result, int) else 0


def generate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashspec generate", description="Exact speculative generation.")
    parser.add_argument("--prompt", default="def fibonacci(n):", help="text to continue")
    parser.add_argument("--target", help="target model folder or hub id (default: a tiny random model)")
    parser.add_argument("--zoo", metavar="SIZE", help="use the offline model zoo of this size (e.g. cpu): its "
                        "trained target, all its drafts and its tokenizer (built and cached on first use)")
    parser.add_argument("--draft", action="append", default=[], help="draft model folder or hub id (repeatable)")
    parser.add_argument("--prompt-lookup", action="store_true", help="add the model-free prompt-lookup drafter")
    parser.add_argument("--policy", default="thompson", help="bandit policy name (see flashspec.bandits.POLICIES)")
    parser.add_argument("--gamma", type=int, default=4, help="drafted tokens per step")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--dtype", default="auto", help="auto, bf16, fp16 or fp32")
    parser.add_argument("--quantization", default=None, choices=[None, "nf4"], help="nf4: bitsandbytes 4-bit")
    parser.add_argument("--trust-remote-code", action="store_true", help="run model code from the checkpoint")
    parser.add_argument("--json", help="write the per-step statistics to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def generate_command(argv: list[str]) -> int:
    args = generate_parser().parse_args(argv)
    import torch

    from flashspec import models
    from flashspec.drafters import PromptLookupDrafter
    from flashspec.engine import SpeculativeDecoder
    from flashspec.sampling import SamplingParams

    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        if args.zoo is not None:
            if args.target or args.draft:
                raise ValueError("--zoo brings its own target and drafts; drop --target/--draft")
            target, drafts, tokenizer = zoo_models(args.zoo, args.device)
        elif args.target is None:
            if args.draft:
                raise ValueError("--draft needs --target (drafts must share the target's tokenizer)")
            target, drafts, tokenizer = default_models(args.device)
        else:
            load = dict(dtype=args.dtype, quantization=args.quantization, device=args.device,
                        trust_remote_code=args.trust_remote_code)
            target = models.load_model(args.target, **load)
            drafts = [models.load_model(path, **load) for path in args.draft]
            tokenizer = models.load_tokenizer(args.target, trust_remote_code=args.trust_remote_code)
            draft_tokenizers = [models.load_tokenizer(path, trust_remote_code=args.trust_remote_code) for path in args.draft]
            for index, (draft, draft_tokenizer) in enumerate(zip(drafts, draft_tokenizers)):
                models.check_compatible(target, draft, tokenizer, draft_tokenizer, draft_name=args.draft[index])
        if args.prompt_lookup or not drafts:
            drafts = [*drafts, PromptLookupDrafter()]
        decoder = SpeculativeDecoder(target, drafts, policy=args.policy, gamma=args.gamma, policy_kwargs={"seed": args.seed})
        input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
        if input_ids.shape[1] == 0:
            raise ValueError("--prompt encodes to no tokens; give some text")
        positions = models.max_positions_of(target)
        max_new_tokens = args.max_new_tokens
        if positions is not None and input_ids.shape[1] + max_new_tokens > positions:
            max_new_tokens = max(0, positions - input_ids.shape[1])
            print(f"flashspec: max-new-tokens lowered to {max_new_tokens} (the target has {positions} positions)", file=sys.stderr)
    except ValueError as error:
        print(f"flashspec generate: {error}", file=sys.stderr)
        return 2

    streamer = TextStreamer(tokenizer, total=max_new_tokens, progress=not args.no_progress)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    try:
        with torch.no_grad():
            result = decoder.generate(
                input_ids, max_new_tokens=max_new_tokens, sampling=sampling, seed=args.seed, on_step=streamer
            )
    except ValueError as error:
        print(f"\nflashspec generate: {error}", file=sys.stderr)
        return 2
    finally:
        streamer.close()
    sys.stdout.write("\n")
    print(result.stats.format_table(), file=sys.stderr)
    if args.json:
        result.stats.to_json(args.json)
        print(f"per-step statistics written to {args.json}", file=sys.stderr)
    return 0


class TextStreamer:
    """`on_step` callback: decode row 0's accepted tokens incrementally and write the new text."""

    def __init__(self, tokenizer: Any, total: int, progress: bool = True) -> None:
        from tqdm import tqdm

        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""
        self.stop_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.bar = tqdm(total=total, unit="tok", file=sys.stderr, disable=not progress, leave=False)

    def __call__(self, event: Any) -> None:
        count = event.num_generated[0] - len(self.tokens)
        self.tokens.extend(event.new_tokens[0][: max(count, 0)])
        text = self.tokenizer.decode([t for t in self.tokens if t not in self.stop_ids])
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            self.bar.clear()
            sys.stdout.write(text[len(self.text) :])
            sys.stdout.flush()
            self.text = text
        self.bar.update(max(count, 0))

    def close(self) -> None:
        self.bar.close()


def zoo_models(size: str, device: str | None) -> tuple[Any, list[Any], Any]:
    """The offline model zoo's target, drafts and tokenizer (flashspec.zoo builds and caches them)."""
    try:
        from flashspec import zoo
    except ImportError as error:
        raise ValueError(f"--zoo needs flashspec.zoo, which failed to import ({error})") from error
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
    print(
        "flashspec: no --target given: tiny random models built on the fly (the text is noise; "
        "pass --target PATH for a real model)",
        file=sys.stderr,
    )
    return target, drafts, tokenizer


if __name__ == "__main__":
    raise SystemExit(main())
