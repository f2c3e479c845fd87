"""FlashSpec: exact speculative decoding with on-device verification and online draft selection."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

_CHECKOUT_KERNELS = Path(__file__).resolve().parent.parent / "kernels"


class _CheckoutKernelsFinder(importlib.abc.MetaPathFinder):
    """Maps `flashspec.kernels` to the top-level kernels/ folder of a source checkout.

    An install maps it through setuptools' package-dir; this finder only matters when the
    package is imported straight from a checkout (repo root as cwd, or PYTHONPATH=.), where
    the ordinary path finder looks for flashspec/kernels/ and finds nothing.
    """

    def find_spec(self, name, path, target=None):  # noqa: D102 - importlib protocol
        if name != "flashspec.kernels" or not (_CHECKOUT_KERNELS / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, _CHECKOUT_KERNELS / "__init__.py", submodule_search_locations=[str(_CHECKOUT_KERNELS)]
        )


if not any(isinstance(finder, _CheckoutKernelsFinder) for finder in sys.meta_path):
    sys.meta_path.append(_CheckoutKernelsFinder())

from flashspec.sampling import SamplingParams, warp_logits
from flashspec.verify import VerifyOutput, verify

__version__ = "0.1.0"

__all__ = ["SamplingParams", "VerifyOutput", "verify", "warp_logits", "__version__"]

from flashspec import bandits, rewards  # noqa: E402  (online draft selection: policies and step rewards)

__all__ += ["bandits", "rewards"]

from flashspec import drafters, engine, models, stats  # noqa: E402  (the generation loop, drafters, loader, stats)
from flashspec.drafters import ModelDrafter, PromptLookupDrafter  # noqa: E402
from flashspec.engine import SpeculativeDecoder, generate  # noqa: E402
from flashspec.models import load_model  # noqa: E402

__all__ += ["drafters", "engine", "models", "stats", "SpeculativeDecoder", "generate", "ModelDrafter",
            "PromptLookupDrafter", "load_model"]

from flashspec import corpora, switching, zoo  # noqa: E402  (offline model zoo: corpora, models, switching workload)

__all__ += ["corpora", "switching", "zoo"]
