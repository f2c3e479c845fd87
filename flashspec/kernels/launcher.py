"""Launching the verify kernels with little host time: `_Launcher` (a jit kernel whose compiled binary is called
directly after its first launch), the raw C entry of Triton 3.9's launcher (`_firing`), and the ticket counters
the kernels' programs meet through."""
from __future__ import annotations

import functools
import inspect
import os

import numpy as np
import torch
import triton

from flashspec.kernels.shims import interpreting

_COMPILE_OPTIONS: dict = {} if interpreting() else {"enable_fp_fusion": False}
FAST_LAUNCH = os.environ.get("FLASHSPEC_TRITON_FAST_LAUNCH", "1") != "0"

_COUNTERS: dict[tuple[str, int | None], tuple[torch.Tensor, int]] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown ticket buffers: a captured graph may still hold their address


def _ticket_counter(device: torch.device, size: int, address: bool = False) -> torch.Tensor | int:
    """Zeroed int32 tickets, kept between calls (each call's last program resets its entry), or their
    address. One buffer per device: calls on one device must not run concurrently on several streams."""
    key = (device.type, device.index)
    cached = _COUNTERS.get(key)
    if cached is None or cached[0].numel() < size:
        if cached is not None:
            _RETIRED.append(cached[0])
        counter = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        cached = _COUNTERS[key] = (counter, counter.data_ptr())
    return cached[1] if address else cached[0]


# the current CUDA device without `torch.cuda.current_device`'s lazy-init check (a µs): for calls whose tensors are
# on a CUDA device already
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

try:  # what Triton's own launcher uses
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover
    def _current_stream(device_index: int) -> int:
        return torch.cuda.current_stream(device_index).cuda_stream


class _Launcher:
    """Launch a jit kernel; after its first launch per specialisation, call the compiled binary
    directly. Triton's own per-call path (argument binding, cache key built from a string of
    the options) costs tens of µs of host time, more than the kernels at small B. Our key
    refines Triton's specialisation -- every tensor's dtype and 16-byte alignment, every int's
    divisibility by 16, equality to 1 and int32 range, every constexpr and option -- so a cached
    binary is the one Triton itself would pick. FLASHSPEC_TRITON_FAST_LAUNCH=0 turns it off."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.binaries: dict = {}

    @staticmethod
    def _spec(arg) -> object:
        if isinstance(arg, torch.Tensor):
            return (arg.dtype, arg.data_ptr() % 16 == 0)
        if isinstance(arg, bool):
            return ("b", arg)
        if isinstance(arg, int):
            return (arg % 16 == 0, arg == 1, -(2**31) <= arg < 2**31)
        return type(arg)

    @classmethod
    def spec_key(cls, args: tuple, meta: dict) -> tuple:
        """The specialisation of a launch, from every argument (one `_spec` each) and every constexpr."""
        return tuple(cls._spec(a) for a in args), tuple(meta.items())

    def _entry(self, args: tuple, meta: dict, key: int | None) -> object:
        """What a binary is cached under: `key` when given (`_entry_id` of the caller's device and `launch_key`),
        else (device, specialisation) computed from the arguments."""
        return (torch.cuda.current_device(), self.spec_key(args, meta)) if key is None else key

    def registers(self, args: tuple, meta: dict, key: int | None = None) -> dict | None:
        """Registers and spills per thread of the binary cached for these arguments (after a launch), or
        None (interpreted, Triton's own launch path, or not launched yet): what bounds the programs per SM."""
        if interpreting() or not FAST_LAUNCH:
            return None
        cached = self.binaries.get(self._entry(args, meta, key))
        if cached is None:
            return None
        binary = cached[0]
        return {"registers": int(getattr(binary, "n_regs", -1)), "spills": int(getattr(binary, "n_spills", -1)),
                "shared_bytes": int(getattr(binary.metadata, "shared", -1))}

    def __call__(self, grid: tuple, args: tuple, meta: dict, key: int | None = None) -> None:
        """Launch. `key`, when given, stands for (current device, `spec_key(args, meta)`) (computing that costs
        about a µs per argument): it must determine it, as `_entry_id` of `launch_key` does for the verify steps.
        Pointer arguments may be raw addresses (ints) once the binary is cached (`_is_warm`)."""
        if interpreting():
            with np.errstate(all="ignore"):  # log(0), inf - inf in masked lanes are intended
                self.kernel[grid](*args, **meta)
            return
        if not FAST_LAUNCH:
            self.kernel[grid](*args, **meta)
            return
        entry = self._entry(args, meta, key)
        cached = self.binaries.get(entry)
        if cached is None:
            binary = self.kernel[grid](*args, **meta)
            self.binaries[entry] = (binary, tuple(meta[name] for name in self.kernel.arg_names[len(args):]),
                                    torch.cuda.current_device())
            return
        binary, constexprs, device_index = cached
        stream = _current_stream(device_index)
        enter_hook, exit_hook = _launch_hooks()
        # what Triton passes: the hook's metadata, built only when there is a hook to read it
        metadata = None if enter_hook is None else binary.launch_metadata(grid, stream, *args, *constexprs)
        binary.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                   binary.function, binary.packed_metadata, metadata, enter_hook, exit_hook, *args, *constexprs)


def _launch_hooks() -> tuple:
    """Triton's launch enter and exit hooks, None where there is none: Triton >= 3.9 keeps each as a chain that
    may be empty (calling an empty chain, and building the metadata it would read, cost about a µs a launch)."""
    runtime = triton.knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return (None if enter is None or getattr(enter, "calls", True) == [] else enter,
            None if leave is None or getattr(leave, "calls", True) == [] else leave)


def _firing(binary, grid: tuple):
    """fire(stream, arguments): one launch of a cached binary with no hook, through the launcher's C entry
    where this Triton's launcher is the one `_raw_launch_call` recognises (skipping its Python wrapper: two
    closures and the scratch checks, about a µs a launch), else through the launcher itself."""
    grid_x, grid_y, grid_z = tuple(grid) + (1,) * (3 - len(grid))
    run, function, packed = binary.run, binary.function, binary.packed_metadata
    raw = _raw_launch_call(run)
    if raw is not None:
        launch, cooperative, pdl, annotations, signature = raw

        def fire(stream: int, args: list) -> None:
            launch(grid_x, grid_y, grid_z, stream, function, cooperative, pdl, packed, None, None, None, None,
                   None, annotations, signature, args)
        return fire

    def fire(stream: int, args: list) -> None:
        run(grid_x, grid_y, grid_z, stream, function, packed, None, None, None, *args)
    return fire


# what Triton 3.9's CudaLauncher.__call__ passes to its C launch: `_raw_launch_call` checks that the wrapper still
# reads so before calling the C entry the same way
_LAUNCH_CALL_39 = ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, "
                   "kernel_metadata, launch_metadata, launch_enter_hook, launch_exit_hook, global_scratch, "
                   "profile_scratch, self.arg_annotations, self.kernel_signature, kernel_args)")


@functools.lru_cache(maxsize=None)
def _wrapper_calls_launch_as_39(launcher_type: type) -> bool:
    try:
        source = inspect.getsource(launcher_type.__call__)
    except (OSError, TypeError):
        return False
    return _LAUNCH_CALL_39 in " ".join(source.split()).replace("( ", "(").replace(" )", ")")


def _raw_launch_call(launcher) -> tuple | None:
    """(launch, cooperative, pdl, argument annotations, kernel signature) of a launcher whose Python wrapper
    only forwards to its C entry (Triton 3.9's: no global or profile scratch, no sanitizer), else None."""
    names = ("launch", "launch_cooperative_grid", "launch_pdl", "arg_annotations", "kernel_signature")
    if (not all(hasattr(launcher, name) for name in names) or getattr(launcher, "global_scratch_size", 1)
            or getattr(launcher, "profile_scratch_size", 1) or getattr(launcher, "gsan_enabled", False)
            or not _wrapper_calls_launch_as_39(type(launcher))):
        return None
    return tuple(getattr(launcher, name) for name in names)
