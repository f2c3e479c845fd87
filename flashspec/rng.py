"""Counter-based random numbers shared bit-for-bit by the PyTorch reference and the Triton kernels.

A uniform is a pure function of (key, stream, row, position, index): no state, no generator
object on the device, and therefore no host sync and no dependence on launch order.  The
same integer hash is written twice -- here in int64 torch arithmetic, and in
`flashspec.kernels.rng` in uint32 Triton arithmetic -- and the tests check they agree.

Construction (all arithmetic modulo 2**32):

    fmix32(h)  = murmur3's finaliser (a bijection with full avalanche)
    base       = fmix32(fmix32(fmix32(fmix32(fmix32(key_lo ^ SALT) ^ key_hi) ^ stream) ^ row) ^ position)
    bits       = fmix32(base ^ fmix32(index + INDEX_OFFSET))
    uniform    = ((bits >> 9) + 0.5) * 2**-23          (exact in float32, strictly inside (0, 1))

Streams keep independent uses of randomness apart (book/design.md §2): the accept test, the
residual/bonus sample and the draft's own sampling never share a uniform.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

MASK32 = 0xFFFFFFFF
FMIX_C1 = 0x85EBCA6B
FMIX_C2 = 0xC2B2AE35
SALT = 0x9E3779B9
INDEX_OFFSET = 0x632BE5AB
UNIFORM_SCALE = 2.0**-23

# Streams: never reuse one for two purposes.
STREAM_ACCEPT = 1
STREAM_SAMPLE = 2
STREAM_DRAFT = 3
DRAFT_STREAM_BASE = STREAM_DRAFT + 16  # the engines' draft d samples on stream DRAFT_STREAM_BASE + 16·d
MAX_SEED = 2**64 - 1  # keys hold 64 bits: a larger seed would repeat a smaller one's draws


def check_seed(seed: object, name: str = "seed") -> int:
    """`seed` as validated: an int in [0, 2**64) (a key holds 64 bits, so a larger seed would give a smaller
    seed's draws)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, 2**64) (it is the run's 64-bit key), got {seed!r}")
    return seed


def draft_stream(draft: int) -> int:
    """The stream draft `draft` (its index in the decoder's pool) samples its proposals on: apart from the
    verifier's accept and sample streams and from every other draft's, under the step's one key."""
    return DRAFT_STREAM_BASE + 16 * draft


@dataclass(frozen=True)
class Key:
    """A 64-bit key split in two 32-bit halves (plain Python ints: kernel arguments, no transfer)."""

    lo: int
    hi: int

    @classmethod
    def from_seed(cls, seed: int) -> "Key":
        seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        return cls(lo=seed & MASK32, hi=(seed >> 32) & MASK32)


def key_from_generator(generator: torch.Generator | int | None) -> Key:
    """Turn `generator` (a torch.Generator, an int seed, or None for torch's default) into a Key.

    An int is used as the key itself, so the same int always gives the same draws.  A
    generator is advanced by one 64-bit draw on the host; a CUDA generator contributes its
    seed and offset (read on the host, never synchronising the device).
    """
    if generator is None:
        return Key.from_seed(int(torch.randint(0, 2**62, (1,)).item()))
    if isinstance(generator, bool):
        raise ValueError("generator must be a torch.Generator, an int seed or None, not a bool")
    if isinstance(generator, int):
        return Key.from_seed(check_seed(generator, "generator"))
    if isinstance(generator, torch.Generator):
        if generator.device.type == "cpu":
            return Key.from_seed(int(torch.randint(0, 2**62, (1,), generator=generator).item()))
        offset = generator.get_offset()
        generator.set_offset(offset + 4)
        return Key.from_seed(_mix64(generator.initial_seed(), offset))
    raise ValueError(
        f"generator must be a torch.Generator, an int seed or None, got {type(generator).__name__}"
    )


def derive_seed(seed: int, *counters: int) -> int:
    """A 62-bit seed derived from `seed` and counters (e.g. the decode step): a pure function."""
    value = int(seed) & 0xFFFFFFFFFFFFFFFF
    for counter in counters:
        value = _mix64(value, int(counter))
    return value & (2**62 - 1)


def _mix64(a: int, b: int) -> int:
    """splitmix64-style combination of two integers into one 64-bit value (host only)."""
    x = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _mul32(h: torch.Tensor, constant: int) -> torch.Tensor:
    """(h * constant) mod 2**32 for int64 tensors holding uint32 values, without int64 overflow."""
    low = (h & 0xFFFF) * constant
    high = ((h >> 16) * constant) & 0xFFFF
    return (low + (high << 16)) & MASK32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3 32-bit finaliser on int64 tensors holding uint32 values."""
    h = h ^ (h >> 16)
    h = _mul32(h, FMIX_C1)
    h = h ^ (h >> 13)
    h = _mul32(h, FMIX_C2)
    return h ^ (h >> 16)


def base_hash(key: Key | torch.Tensor, stream: int, row: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Per-(row, position) hash; `row` and `position` broadcast against each other.

    `key` is a Key (host ints) or an int64 tensor [2] = (lo, hi) on the device: a device key lets
    a captured CUDA graph draw fresh uniforms on every replay (see `step_key`)."""
    device = row.device
    if isinstance(key, Key):
        h = fmix32(torch.tensor(key.lo ^ SALT, dtype=torch.int64, device=device))
        h = fmix32(h ^ key.hi)
    else:
        h = fmix32((key[0] ^ SALT) & MASK32)
        h = fmix32(h ^ key[1])
    h = fmix32(h ^ stream)
    h = fmix32(h ^ (row.to(torch.int64) & MASK32))
    return fmix32(h ^ (position.to(torch.int64) & MASK32))


def uniform_from_base(base: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in (0, 1) from a base hash and an index; the two broadcast."""
    bits = fmix32(base ^ fmix32((index.to(torch.int64) + INDEX_OFFSET) & MASK32))
    return ((bits >> 9).to(torch.float32) + 0.5) * UNIFORM_SCALE


def uniforms(
    key: Key | torch.Tensor, stream: int, rows: int, positions: int, width: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Uniforms of shape [rows, positions, width] for one stream (index = last axis)."""
    row = torch.arange(rows, device=device).view(rows, 1, 1)
    position = torch.arange(positions, device=device).view(1, positions, 1)
    index = torch.arange(width, device=device).view(1, 1, width)
    return uniform_from_base(base_hash(key, stream, row, position), index)


STEP_SALT = 0x5BD1E995


def step_key(seed_key: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The key of decode step `step` as an int64 tensor [2]: (lo, fmix32(hi ^ fmix32(step + salt))).

    Pure device arithmetic on `seed_key` [2] and `step` [1], so a CUDA graph that holds the step
    counter in a device buffer and advances it draws new uniforms on each replay (a key passed as a
    launch argument would be frozen into the graph). Distinct steps give distinct keys: fmix32 is a
    bijection. `step_key_host` is the same function on host ints."""
    hi = fmix32((seed_key[1] ^ fmix32((step.reshape(()) + STEP_SALT) & MASK32)) & MASK32)
    return torch.stack([seed_key[0] & MASK32, hi])


def step_key_host(seed: Key, step: int) -> Key:
    """`step_key` on a host Key and int step: the key of step `step` of a run keyed `seed` (the eager engine's
    schedule, equal to the fast engine's on the device)."""
    as_tensor = torch.tensor([seed.lo, seed.hi], dtype=torch.int64)
    lo, hi = step_key(as_tensor, torch.tensor([step], dtype=torch.int64)).tolist()
    return Key(lo=lo, hi=hi)


def key_tensor(key: Key, device: torch.device | str = "cpu") -> torch.Tensor:
    """A Key as the int64 tensor [2] (lo, hi) that `base_hash` and `step_key` take."""
    return torch.tensor([key.lo, key.hi], dtype=torch.int64, device=device)
