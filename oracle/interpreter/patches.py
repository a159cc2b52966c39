"""How the harness patches Triton: each replacement keeps what it replaced as ``_oracle_original``,
so that installing twice is seen, and a test can run with Triton's own function for a while."""

from __future__ import annotations

import contextlib

ORIGINAL = "_oracle_original"


@contextlib.contextmanager
def unpatched(owner, name: str):
    """Run with ``owner.name`` as it was before the harness replaced it (as it is, if it never did)."""
    patched = getattr(owner, name)
    setattr(owner, name, getattr(patched, ORIGINAL, patched))
    try:
        yield
    finally:
        setattr(owner, name, patched)
