"""What an op module tells the benchmark (oracle/bench.py): its peers and its workloads at the shapes
models train at. GPU only; nothing here runs at import time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Workload:
    """One op at one shape: inputs, and per implementation a forward and a forward+backward."""

    op: str
    variant: str
    dtype: torch.dtype
    fwd_bytes: int
    fwd_bwd_bytes: int
    forward: dict[str, Callable[[], object]] = field(default_factory=dict)
    forward_backward: dict[str, Callable[[], object]] = field(default_factory=dict)
    producer: Callable[[], object] | None = None  # what every fwd+bwd also runs (RoPE's clone)
    producer_bytes: int = 0  # memory the producer allocates, subtracted from peaks
    fwd_bwd_target: float = 0.8  # forward+backward time at most this many times the fastest peer's (targets())


@dataclass(frozen=True)
class Bench:
    """An op's part of the benchmark."""

    # (include_liger) -> implementation name (kernels, eager, compile, liger) -> the callable it times;
    # peers may take what HF's model hands them (RoPE's gathered table rows), not the contract's form
    peers: Callable[[bool], dict[str, Callable]]
    # (peers, dtype) -> the workloads at model shapes
    workloads: Callable[[dict[str, Callable], torch.dtype], list[Workload]]
    # (peers) -> workloads across widths for the column sweep, labelled by their variant; None: no sweep
    sweep: Callable[[dict[str, Callable]], list[Workload]] | None = None


def randn_cuda(*shape, dtype, requires_grad=False) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(requires_grad)


@functools.cache
def _compile_setup() -> None:
    import torch._dynamo

    # Every shape and dtype compiles a graph of its own; past the default limit torch.compile would
    # fall back to eager without a word and the comparison would be against the wrong thing.
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 256)


def compiled(fn: Callable) -> Callable:
    """torch.compile of ``fn`` at static shapes, as a model step compiles it."""
    _compile_setup()
    return torch.compile(fn)
