"""What both batch caches (batch.py: a cache per sequence; batch_shared.py: one B-row cache) share: the left
padding bookkeeping behind mlx-lm's `offset` and `left_padding`."""
from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import _BaseCache

from .masks import offsets


class LeftPadded(_BaseCache):
    """What both batch caches (batch.py's and batch_shared.py's) derive from `_idx` (the batch's position count) and
    `_lp` (each row's left padding): mlx-lm's `offset` and `left_padding`. A subclass sets `_offset = None` where
    either changes."""
    _offset: mx.array | None = None

    @property
    def offset(self) -> mx.array:
        """(B,) int32 positions (RoPE's offsets): one array per step and layout, shared by the layers (the model
        reads it in every layer; the layers of a batch move in step)."""
        if self._offset is None:
            self._offset = offsets(self._idx, self._lp)
        return self._offset

    @property
    def left_padding(self) -> mx.array:
        return mx.array(self._lp, dtype=mx.int32)
