"""The counter-based hash of `flashspec.rng`, written again in uint32 Triton arithmetic.

Bit for bit the same function as the torch version (tests/test_kernels.py checks it): a
uniform is a pure function of (key, stream, row, position, index), so a kernel draws its
accept uniforms and its Gumbel noise without a generator, a host sync or any state.

The key and stream enter only through a 32-bit prefix computed once on the host
(`stream_prefix`); the kernels finish the hash with the row, position and index.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from flashspec import rng

_MASK32 = rng.MASK32


def fmix32_host(h: int) -> int:
    """murmur3's finaliser on a Python int (host side, for the key prefix)."""
    h &= _MASK32
    h ^= h >> 16
    h = (h * rng.FMIX_C1) & _MASK32
    h ^= h >> 13
    h = (h * rng.FMIX_C2) & _MASK32
    return h ^ (h >> 16)


def stream_prefix(key: rng.Key, stream: int) -> int:
    """The part of `rng.base_hash` that depends only on (key, stream), as a uint32 Python int."""
    h = fmix32_host(key.lo ^ rng.SALT)
    h = fmix32_host(h ^ key.hi)
    return fmix32_host(h ^ stream)


def device_function(fn):
    """`triton.jit` for compiled kernels; the plain Python function under the interpreter.

    The interpreter re-patches triton.language on every call of a nested jit function
    (about 6 ms each); a plain function called inside a running kernel sees the patched
    language already, so helpers cost only their arithmetic.
    """
    return fn if os.environ.get("TRITON_INTERPRET", "0") == "1" else triton.jit(fn)


def as_int32(value: int) -> int:
    """A uint32 value reinterpreted as int32, so Triton always types the kernel argument i32."""
    value &= _MASK32
    return value - (1 << 32) if value >= (1 << 31) else value


@device_function
def fmix32(h):
    """murmur3's finaliser on uint32 tensors (multiplication wraps modulo 2**32)."""
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@device_function
def base_hash(prefix, row, position):
    """rng.base_hash finished from the host prefix: `prefix` is the int32-typed stream prefix,
    `row` and `position` integer tensors (taken modulo 2**32, as the torch version does)."""
    h = prefix.to(tl.uint32, bitcast=True)
    h = fmix32(h ^ row.to(tl.uint32))
    return fmix32(h ^ position.to(tl.uint32))


@device_function
def uniform_from_base(base, index):
    """float32 uniform in (0, 1) from a uint32 base hash and an integer index (broadcasting)."""
    salted = fmix32(index.to(tl.uint32) + 0x632BE5AB)
    bits = fmix32(base ^ salted)
    return ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
