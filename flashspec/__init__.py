"""FlashSpec: exact speculative decoding with on-device verification and online draft selection."""
from __future__ import annotations

from flashspec.sampling import SamplingParams, warp_logits
from flashspec.verify import VerifyOutput, verify

__version__ = "0.1.0"

__all__ = ["SamplingParams", "VerifyOutput", "verify", "warp_logits", "__version__"]

from flashspec import bandits, rewards  # noqa: E402  (online draft selection: policies and step rewards)

__all__ += ["bandits", "rewards"]
