"""Mutation testing of an implementation's Triton kernels: how much of a kernel the harness's cases
would catch going wrong (``python -m oracle.mutate``; docs/design.md §9)."""
