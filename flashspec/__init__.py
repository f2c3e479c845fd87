"""FlashSpec: exact speculative decoding with on-device verification and online draft selection."""
from __future__ import annotations

from flashspec.sampling import SamplingParams, warp_logits
from flashspec.verify import VerifyOutput, verify

__version__ = "0.1.0"

__all__ = ["SamplingParams", "VerifyOutput", "verify", "warp_logits", "__version__"]
