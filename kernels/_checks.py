"""Input validation shared by the ops. Every check runs before any launch and names the argument."""

from __future__ import annotations

import numbers

import torch

from ._runtime import interpreted

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def require_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def require_float(name: str, t: torch.Tensor) -> None:
    require_tensor(name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def require_same_dtype(**tensors: torch.Tensor) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name}={dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"dtypes must match: {listed}")


def require_kernel_device(**tensors: torch.Tensor) -> None:
    """All tensors on one device, and a CUDA device unless the interpreter runs the kernels."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"tensors must be on one device: {listed}")
    device = next(iter(devices.values()))
    if not interpreted() and device.type != "cuda":
        raise ValueError(
            f"the kernels run on CUDA but the tensors are on {device}; move them to the GPU "
            "(or set TRITON_INTERPRET=1 to run them on the CPU through Triton's interpreter)"
        )


def require_ndim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def require_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Kernels compute in fp32, or in fp64 when any input is fp64 (so gradcheck can test them)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
