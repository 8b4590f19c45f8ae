"""The deferred checks of one append evaluated in one launch (spec/streaming.md, 'Deferred rejection').

`flags(pending)` turns the (kind, array, message) records of accelerated.ops.numerics.deferred_checks into
one lazy (n,) uint32 array, nonzero where a check fails. On a GPU it is accelerated.kernels.commit's kernel
with nothing to store and one block column (one threadgroup per check, reading every checked array through
its strides); elsewhere MLX ops compute the same flags (numerics.fault_flags).
"""
from __future__ import annotations

import mlx.core as mx

from . import backend, commit
from ..ops import numerics


def flags(pending: list) -> mx.array:
    """(n,) lazy flags of recorded checks [(kind, array, message)], nonzero where a check fails."""
    if not pending:
        raise ValueError("pending: no checks to evaluate")
    if not backend.available()[0] or any(a.size == 0 for _, a, _ in pending):
        return numerics.fault_flags(pending)
    return commit.commit([], pending, columns=1).reshape(-1)     # (n, 1): a view as (n,)
