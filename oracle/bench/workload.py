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




def compiled(fn: Callable) -> Callable:
    """torch.compile of ``fn`` at static shapes, as a model step that only ever sees one shape compiles
    it (without ``dynamic=False`` the second shape would make dynamo recompile for dynamic shapes)."""
    from oracle.declare.implementations import compile_every_case  # a core module that loads the op modules

    compile_every_case()
    return torch.compile(fn, dynamic=False)


def forget_compiled() -> None:
    """Drop every graph dynamo holds, as a fresh process would start: the next workload's compile sees
    only its own shape, and its guards are not checked against the shapes measured before."""
    import torch._dynamo

    torch._dynamo.reset()


def checkout_kernels():
    """This repository's kernels, found as ``--impl kernels`` finds them: never another package that
    owns the import name ``kernels`` (Hugging Face's hub-kernels library)."""
    from oracle.declare.implementations import builtin_module

    return builtin_module("kernels")


# Vendors whose adapter of the built-in ops (peers/<vendor>/builtin.py, in a checkout) names the
# callables the benchmark times, in ``BENCH_PEERS``: op -> callable, as HF's model would call it.
VENDORS = ("liger",)


def vendor_peers(op: str, include: bool) -> Peers:
    """The vendors' counterparts of ``op`` that can be imported here; none where ``include`` is off."""
    import importlib

    from oracle.errors import ImplementationUnavailable

    found = {}
    for vendor in VENDORS if include else ():
        try:
            module = importlib.import_module(f"peers.{vendor}.builtin")
        except (ImportError, ImplementationUnavailable):  # not installed, or not in a checkout
            continue
        fn = module.BENCH_PEERS.get(op)
        if fn is not None:
            found[vendor] = lambda fn=fn: fn
    return found
