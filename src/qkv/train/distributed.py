"""DistributedDataParallel the nanoGPT way: the rank comes from the environment torchrun sets.

``qkv train`` run plainly is one process. Run under ``torchrun --nproc_per_node N`` (or with
``--nnodes``), each process finds ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in its environment,
joins the process group (NCCL on GPUs, gloo on the CPU), trains its own shard of the batches, and
only rank 0 reads nothing special but writes everything (logs, checkpoints, TensorBoard).
"""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..inference.device import pick_device

__all__ = [
    "DistInfo",
    "all_gather_objects",
    "all_reduce_sum",
    "barrier",
    "cleanup",
    "param_checksum",
    "pick_device",
    "raise_main_error",
    "setup",
    "unwrap",
]


@dataclass(frozen=True)
class DistInfo:
    """This process's place: ``rank`` of ``world_size``, ``local_rank`` on its node, its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an int, got {raw!r}") from None


def setup(device: str = "auto", *, timeout_minutes: float = 30.0) -> DistInfo:
    """Read torchrun's environment, pick the device, and join the process group if
    ``WORLD_SIZE > 1`` (NCCL for CUDA devices, gloo for the CPU).

    ``timeout_minutes`` is how long a collective may wait for the other ranks (the NCCL watchdog's
    limit): rank 0 evaluates alone while the others wait at the next collective, so it must
    exceed the longest validation."""
    world = _env("WORLD_SIZE", 1)
    rank = _env("RANK", 0)
    local = _env("LOCAL_RANK", rank)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE")
    dev = pick_device(device, local)
    backend = None
    if world > 1:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            dist.init_process_group(
                backend=backend,
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(minutes=timeout_minutes),
            )
    return DistInfo(rank, local, world, dev, backend)


def cleanup() -> None:
    """Leave the process group, if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel (or ``torch.compile``) wrapper."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over all ranks in place (no-op in a single process); returns ``t``."""
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` in a single process)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if _active():
        dist.barrier()


def raise_main_error(err: BaseException | None) -> None:
    """Raise, on every rank, the error rank 0 met before the run (``err`` there; the others
    pass None), so that no rank goes on alone and waits for the others at a collective. A
    no-op when rank 0 met none; in a single process, ``raise err`` when there is one."""
    first = all_gather_objects(err)[0]
    if first is not None:
        raise err if err is not None else first


def param_checksum(model: nn.Module) -> str:
    """A SHA-256 of every parameter's bytes, in name order: equal on all ranks when the
    replicas are in sync."""
    h = hashlib.sha256()
    for name, p in sorted(unwrap(model).named_parameters()):
        h.update(name.encode())
        h.update(p.detach().to("cpu").reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
