"""What an op module tells the benchmark (oracle/bench/): its peers, its workloads at the shapes models
train at and, for some, a sweep across widths; and torch.compile as the harness uses it, for the
benchmark's peers and ``--impl compile``. Nothing here runs at import time."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Workload:
    """One op at one shape: inputs, and per implementation a forward and a forward+backward."""

    op: str
    variant: str  # the op's own variant: llama, gemma, plain, packed, ...
    dtype: torch.dtype
    fwd_bytes: int
    fwd_bwd_bytes: int
    forward: dict[str, Callable[[], object]] = field(default_factory=dict)
    forward_backward: dict[str, Callable[[], object]] = field(default_factory=dict)
    producer: Callable[[], object] | None = None  # what every fwd+bwd also runs (RoPE's clone)
    producer_bytes: int = 0  # memory the producer allocates, subtracted from peaks
    width: int | None = None  # columns of a sweep row; None at a model's shape

    @property
    def label(self) -> str:
        """The variant as tables and the dashboard show it: a sweep row adds ", <width> cols"."""
        return self.variant if self.width is None else f"{self.variant}, {self.width} cols"


# Implementation name (kernels, eager, compile, liger) -> a factory of the callable it times. Factories, not
# callables: every workload makes its own, so torch.compile's is a new static graph per shape.
Peers = dict[str, Callable[[], Callable]]


@dataclass(frozen=True)
class Bench:
    """An op's part of the benchmark."""

    # (include_liger) -> its Peers; peers may take what HF's model hands them (RoPE's gathered table
    # rows), not the contract's form
    peers: Callable[[bool], Peers]
    # (peers, dtype) -> the workloads at model shapes
    workloads: Callable[[Peers, torch.dtype], Iterable[Workload]]
    # (peers, widths) -> the sweep's workloads, built lazily (each holds its own inputs); None: no sweep
    sweep: Callable[[Peers, Sequence[int]], Iterable[Workload]] | None = None
    sweep_widths: tuple[int, ...] = ()  # the sweep's widths when the command line names none


def instantiate(peers: Peers) -> dict[str, Callable]:
    """The callables of one workload, one per implementation."""
    return {name: make() for name, make in peers.items()}


def randn_cuda(*shape, dtype, requires_grad=False) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(requires_grad)


@functools.cache
def compile_every_case() -> None:
    """torch.compile as the harness uses it (``--impl compile``, the benchmark's peers): a graph for
    every case, never eager code in its place. Past dynamo's default of 8 recompiles of a function
    (a new rank, a size of 1, another layout or eps each recompile) torch.compile runs the function
    eagerly, with one log line: for 40 drawn rms_norm cases (CPU, derandomized draws) ``--impl
    compile`` compiled 11 graphs and judged HF's eager code in the cases past the limit; with the
    limits raised, 29 graphs. So the limits are raised far past what a run draws, and reaching one
    anyway is an error the case reports."""
    import torch._dynamo.config as dynamo

    for limit, value in (("recompile_limit", 1024), ("cache_size_limit", 1024),
                         ("accumulated_recompile_limit", 65536)):
        if hasattr(dynamo, limit):
            setattr(dynamo, limit, value)
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):
        dynamo.fail_on_recompile_limit_hit = True


def compiled(fn: Callable) -> Callable:
    """torch.compile of ``fn`` at static shapes, as a model step that only ever sees one shape compiles
    it (without ``dynamic=False`` the second shape would make dynamo recompile for dynamic shapes)."""
    compile_every_case()
    return torch.compile(fn, dynamic=False)


def forget_compiled() -> None:
    """Drop every graph dynamo holds, as a fresh process would start: the next workload's compile sees
    only its own shape, and its guards are not checked against the shapes measured before."""
    import torch._dynamo

    torch._dynamo.reset()
