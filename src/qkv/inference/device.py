"""Device choice: the one place a device name becomes a :class:`torch.device`.

``qkv train`` (each process of a torchrun job passes its ``local_rank``), ``qkv translate``,
``qkv evaluate``, :class:`qkv.translate.Translator` and the demos all pick their device here.
"""

from __future__ import annotations

import torch

from .._errors import SettingError, keyed

__all__ = ["pick_device"]


def pick_device(device: str | torch.device = "auto", local_rank: int = 0) -> torch.device:
    """The device ``device`` names: ``"auto"`` (CUDA when available, else the CPU), ``"cpu"``,
    ``"cuda"`` (GPU ``local_rank``, modulo the GPUs there are), ``"cuda:N"``, ...

    Raises:
        TypeError: ``device`` is neither a string nor a :class:`torch.device`.
        ValueError: not a device name, a device qkv does not run on (``mps``, ``meta``, ...),
            an index the machine does not have (``cpu:1``, ``cuda:7`` on a 2-GPU machine), or
            CUDA asked for where it is not available (one line, naming the argument).
    """
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise keyed(TypeError, "device", f"expected a device name, got {type(device).__name__}")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    expected = "expected 'auto', 'cpu', 'cuda' or 'cuda:N'"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise SettingError("device", f"{expected}, got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):  # mps, meta, xpu, ...: not what qkv runs or tests on
        raise SettingError(
            "device", f"{expected}, got {device!r} (qkv runs on the CPU and on CUDA GPUs)"
        )
    if dev.type == "cpu":
        if dev.index not in (None, 0):
            raise SettingError(
                "device", f"{expected}, got {device!r} (the CPU has no index: 'cpu')"
            )
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SettingError("device", f"{device!r} was asked for, but CUDA is not available")
    count = torch.cuda.device_count()
    if dev.index is None:
        dev = torch.device("cuda", local_rank % count)
    elif dev.index >= count:
        raise SettingError(
            "device",
            f"{device!r} was asked for, but this machine has {count} CUDA "
            f"device{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})",
        )
    return dev
