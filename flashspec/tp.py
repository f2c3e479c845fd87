"""Tensor parallelism for the target: its decoder layers sharded over the ranks of a process group.

What is sharded: in every decoder layer of the TARGET, q/k/v and gate/up projections are split by output
features (`ColwiseParallel`: each rank holds num_heads/N query heads, num_kv_heads/N KV heads and 1/N of
the MLP's intermediate features) and o_proj/down_proj by input features (`RowwiseParallel`: one all-reduce
after attention and one after the MLP). This is PyTorch's DTensor `parallelize_module`; there is no
communication code here. Embeddings, norms and lm_head stay replicated, and each rank's `LlamaRunner`
keeps a KV cache of its local heads only (it reads `TP_SIZE_ATTR`, set here on the model).

Why no broadcast: after each all-reduce every rank holds bitwise the same hidden state (ring/tree
all-reduces in NCCL and gloo end with every rank copying the same reduced buffer), so every rank computes
the same logits. Drafts, the policy and verification are replicated, and the randomness is counter-based
(key, stream, row, position, index): every rank draws the same uniforms from the same logits and emits the
same tokens. `TensorParallel.guard_*` checks that this holds: the request once at the start, and a hash of
the emitted tokens every `check_every` steps, on the host when the fast path reads outcomes.

Launch (one process per GPU):

    torchrun --nproc-per-node 2 experiments/bench_tp.py --out results/bench_tp_h200x2.json

and in a script: `tp = TensorParallel.from_env()` (initialises the process group from torchrun's
environment), `shard_target(target, tp)`, then `FastSpeculativeDecoder(target, drafts, tp=tp)`.
"""
from __future__ import annotations

import gc
import hashlib
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

TP_SIZE_ATTR = "flashspec_tp_size"  # set on a sharded model; LlamaRunner divides its head counts by it
DEFAULT_CHECK_EVERY = 16
LAYER_PLAN_COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
LAYER_PLAN_ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def tp_size_of(model: torch.nn.Module) -> int:
    """How many ranks `model`'s decoder layers are sharded over (1 when not sharded)."""
    return int(getattr(model, TP_SIZE_ATTR, 1))


def check_shardable(config: Any, tp_size: int) -> None:
    """ValueError unless `tp_size` divides the attention heads, the KV heads and the MLP width."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size must be an int >= 1, got {tp_size!r}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % tp_size or kv_heads % tp_size:
        divisors = [n for n in range(1, kv_heads + 1) if heads % n == 0 and kv_heads % n == 0]
        raise ValueError(f"tensor parallelism over {tp_size} ranks needs the world size to divide "
                         f"num_attention_heads ({heads}) and num_key_value_heads ({kv_heads}); "
                         f"launch with a world size in {divisors}")
    if config.intermediate_size % tp_size:
        raise ValueError(f"tensor parallelism over {tp_size} ranks needs the world size to divide "
                         f"intermediate_size ({config.intermediate_size}); launch with another world size")


@dataclass
class TensorParallel:
    """A tensor-parallel group: the device mesh the target is sharded over, and a gloo group for the
    host-side consistency checks (CPU tensors, so they never wait on the GPU's queue).

    Build it with `TensorParallel.create(device_type)` after `dist.init_process_group` (all ranks), or
    `TensorParallel.from_env()` under torchrun.
    """

    mesh: Any                      # torch.distributed.device_mesh.DeviceMesh, 1-D
    guard_group: Any               # a gloo ProcessGroup over the same ranks
    check_every: int = DEFAULT_CHECK_EVERY
    _digest: Any = field(default=None, repr=False)
    _observed: int = 0

    @classmethod
    def create(cls, device_type: str, check_every: int = DEFAULT_CHECK_EVERY) -> TensorParallel:
        """Every rank of the default process group, as one 1-D mesh on `device_type` ("cpu" or "cuda")."""
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise ValueError("TensorParallel.create needs torch.distributed initialised first "
                             "(dist.init_process_group, or TensorParallel.from_env under torchrun)")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"check_every must be an int >= 1 (steps between token-hash checks), got {check_every!r}")
        world = dist.get_world_size()
        mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("tp",))
        backend = dist.get_backend()
        guard = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
        return cls(mesh=mesh, guard_group=guard, check_every=check_every)

    @classmethod
    def from_env(cls, check_every: int = DEFAULT_CHECK_EVERY) -> TensorParallel:
        """Initialise the process group from torchrun's environment (nccl on CUDA, each rank on GPU
        LOCAL_RANK; gloo on CPU) and return the group over every rank."""
        if "RANK" not in os.environ:
            raise ValueError("TensorParallel.from_env needs torchrun's environment (RANK, WORLD_SIZE, ...): "
                             "launch with `torchrun --nproc-per-node N script.py`")
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        return cls.create("cuda" if cuda else "cpu", check_every)

    @property
    def size(self) -> int:
        return self.mesh.size()

    @property
    def rank(self) -> int:
        return dist.get_rank(self.guard_group)

    @property
    def device(self) -> torch.device:
        if self.mesh.device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.mesh.device_type)

    # ------------------------------------------------------------------------------ consistency guard
    def _gather(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's `values` (one small all_gather on the gloo group)."""
        mine = torch.tensor(list(values), dtype=torch.long)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.guard_group))]
        dist.all_gather(every, mine, group=self.guard_group)
        return [tensor.tolist() for tensor in every]

    def guard_request(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: Sequence[Any]) -> None:
        """Once per request, before any forward: all ranks must hold the same prompt (and mask) and the
        same `settings` (seed, budgets, sampling, ...), else every rank raises RuntimeError."""
        prompt = _hash_bytes(input_ids.detach().cpu().long().numpy().tobytes(),
                             attention_mask.detach().cpu().long().numpy().tobytes(),
                             repr(tuple(input_ids.shape)).encode())
        other = _hash_bytes(repr(tuple(settings)).encode())
        every = self._gather([prompt, other])
        for index, what in enumerate(("prompt (input_ids / attention_mask)",
                                      "settings (seed, max_new_tokens, sampling, EOS)")):
            groups = _ranks_by_value([values[index] for values in every])
            if len(groups) > 1:
                raise RuntimeError(f"tensor-parallel ranks got different {what}: the rank groups "
                                   f"{list(groups.values())} each hold another one; every rank must call generate "
                                   "with the same request")
        self._digest = hashlib.blake2b(digest_size=8)
        self._observed = 0

    def guard_step(self, step: int, arm: int, new_tokens: Sequence[Sequence[int]]) -> None:
        """Fold step `step`'s arm and emitted tokens (per row) into the running hash; every `check_every`
        steps compare it across ranks (`guard_check`)."""
        if self._digest is None:
            raise RuntimeError("guard_step before guard_request: the request was not checked")
        self._digest.update(f"{arm}|".encode())
        for row, tokens in enumerate(new_tokens):
            self._digest.update(f"{row}:{','.join(map(str, tokens))};".encode())
        self._observed += 1
        if self._observed % self.check_every == 0:
            self.guard_check(step)

    def guard_check(self, step: int) -> None:
        """Compare (step, hash of every arm and token so far) across ranks now: RuntimeError naming the
        step and the ranks on a mismatch. The fast path calls it every `check_every` steps and at the end."""
        if self._digest is None:
            raise RuntimeError("guard_check before guard_request: the request was not checked")
        mine = int.from_bytes(self._digest.copy().digest(), "little", signed=True)
        groups = _ranks_by_value([tuple(values) for values in self._gather([step, mine])])
        if len(groups) > 1:
            detail = {f"step {value[0]}, hash {value[1]:#x}": ranks for value, ranks in groups.items()}
            raise RuntimeError(f"tensor-parallel ranks diverged by step {step}: the tokens emitted so far differ "
                               f"(ranks by value: {detail}); the all-reduce or a replicated computation is not "
                               "bitwise identical across ranks")


def shard_forward_bytes(config: Any, tp_size: int, batch: int, filled: int, element_size: int = 2) -> int:
    """Bytes one rank reads in a one-token forward of a Llama-family target sharded over `tp_size` ranks:
    its 1/N of every decoder layer's projections, the replicated norms, final norm and head (the embedding
    table too only when tied to the head: otherwise a forward reads a few of its rows), and its heads'
    K/V of `filled` positions for `batch` rows. Divide by the copy bandwidth for the rank's HBM floor."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim
    sharded = layers * ((q_width + 2 * kv_width) * hidden + q_width * hidden + 3 * hidden * config.intermediate_size)
    replicated = layers * 2 * hidden + hidden + config.vocab_size * hidden  # norms, final norm, head
    kv = 2 * layers * batch * filled * kv_width
    return element_size * (sharded // tp_size + replicated + kv // tp_size)


def _hash_bytes(*parts: bytes) -> int:
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return int.from_bytes(digest.digest(), "little", signed=True)


def _ranks_by_value(values: Sequence[Any]) -> dict[Any, list[int]]:
    """value -> the ranks holding it (one key when all agree)."""
    groups: dict[Any, list[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return groups


def shard_target(model: torch.nn.Module, tp: TensorParallel) -> torch.nn.Module:
    """Shard `model`'s decoder layers over `tp` in place (Colwise q/k/v/gate/up, Rowwise o/down) and mark
    it (`TP_SIZE_ATTR`) so `LlamaRunner` uses the local head counts. Every rank must pass identical weights
    (e.g. the same seed or checkpoint). Returns the model."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if tp_size_of(model) != 1:
        raise ValueError(f"the model is already sharded over {tp_size_of(model)} ranks; shard an unsharded copy")
    check_shardable(model.config, tp.size)
    plan: dict[str, Any] = {name: ColwiseParallel() for name in LAYER_PLAN_COLWISE}
    plan.update({name: RowwiseParallel() for name in LAYER_PLAN_ROWWISE})
    for layer in model.model.layers:
        parallelize_module(layer, tp.mesh, plan)
    setattr(model, TP_SIZE_ATTR, tp.size)
    return model


SHUTDOWN_TIMEOUT_S = 60.0


def shutdown(*decoders: Any, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Leave the process group cleanly: free the decoders' sessions (their CUDA graphs hold NCCL work),
    wait for every rank, then `destroy_process_group`. NCCL's communicator teardown can hang after
    collectives were captured in CUDA graphs (pytorch/pytorch#115388); if it has not returned after
    `timeout_s`, this process says so and exits with status 0, its results being already written."""
    for decoder in decoders:
        decoder.close()
    gc.collect()
    if not dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.barrier()
    done = threading.Event()

    def destroy() -> None:
        dist.destroy_process_group()
        done.set()

    threading.Thread(target=destroy, daemon=True).start()
    if not done.wait(timeout_s):
        print(f"flashspec.tp: destroy_process_group did not return within {timeout_s:.0f} s (NCCL teardown "
              "after graph-captured collectives); exiting", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
