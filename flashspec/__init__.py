"""FlashSpec: exact speculative decoding with on-device verification and online draft selection."""
from __future__ import annotations

from flashspec.sampling import SamplingParams, warp_logits
from flashspec.verify import VerifyOutput, verify

__version__ = "0.1.0"

__all__ = ["SamplingParams", "VerifyOutput", "verify", "warp_logits", "__version__"]

from flashspec import bandits, rewards  # noqa: E402  (online draft selection: policies and step rewards)

__all__ += ["bandits", "rewards"]

from flashspec import drafters, engine, models, stats  # noqa: E402  (the generation loop, drafters, loader, stats)
from flashspec.drafters import ModelDrafter, PromptLookupDrafter  # noqa: E402
from flashspec.engine import SpeculativeDecoder, generate  # noqa: E402
from flashspec.fast import (FastPathsDecoder, FastPlainDecoder, FastSpeculativeDecoder,  # noqa: E402
                            make_decoder)  # static caches, CUDA graphs
from flashspec.models import load_model  # noqa: E402

__all__ += ["drafters", "engine", "models", "stats", "SpeculativeDecoder", "generate", "ModelDrafter",
            "PromptLookupDrafter", "load_model", "FastSpeculativeDecoder", "FastPlainDecoder",
            "FastPathsDecoder", "make_decoder"]
