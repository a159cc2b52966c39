"""Adapters from other libraries' kernels to the contract (docs/design.md §2), one module per library."""
