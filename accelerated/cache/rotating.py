"""Sliding-window compressed caches: mlx-lm's RotatingKVCache protocol over VeloxQuant records (issue 10).

Models that mix global and windowed attention (gemma3_text: `make_cache()` gives `RotatingKVCache(max_size=
sliding_window)` for most layers) need a cache that forgets tokens older than the window. mlx-lm 0.32's
RotatingKVCache (mlx_lm/models/cache.py) keeps, for `keep = 0`:
- after a one-token update the newest `max_size` tokens (written in place, rotating), mask None;
- after an update of S > 1 tokens the newest `max_size - 1` old tokens plus the S new ones in temporal
  order, with `make_mask(S)` = create_causal_mask(S, offset=min(max_size - 1, offset), window_size=max_size);
- `offset` = every token seen; `size()` = min(offset, max_size); trimmable while offset < max_size.

`VeloxRotatingKVCache` holds the same tokens, as records: before each update it evicts the oldest stored
tokens so that at most `max_size - 1` old ones remain (accelerated.stream.Stream.evict: encoded rows are
skipped, not copied, so a deferred check can still roll the layer back), then appends the chunk to the two
streams. So every update attends over exactly the tokens mlx-lm's cache would hold, in temporal order (a
one-token query needs no mask: softmax does not depend on the order), and `make_mask` is mlx-lm's for that
layout, which is what gemma3_text builds from its first sliding layer's cache for all of them. Attention
goes through the packed records like VeloxKVCache's (accelerated.attention; packed mode), no decoding.

Stored state: each stream is the one-shot record of the tokens it holds, with window R and kept tokens as
spec/streaming.md says (every record depends on its own token only; kivi evicts whole groups of G, so it
may hold up to G - 1 tokens more than mlx-lm, which its mask then hides). `keep > 0` (attention sinks kept
at the front) is not supported; make_prompt_cache leaves such layers with mlx-lm's RotatingKVCache.
A deferred fault (spec/streaming.md 'Deferred rejection') rolls the layer back to its state before the bad
chunk less the tokens that chunk's eviction dropped: no later query can attend to them (they are older
than the window of any position from the restored offset on).
"""
from __future__ import annotations

import json

import mlx.core as mx
from mlx_lm.models.cache import create_causal_mask

from .. import tuning
from . import masks
from .base import VeloxKVCache, _to_json
from ..kernels import methods as km
from ..ops.attention import RowStarts

# Evicted rows are freed (one copy of the held rows, after settling the deferred checks: a host sync) once they
# outnumber both tuning's compact_rows and the held tokens, so a decode step copies nothing on average. The copy's
# buffers have room for the rows appended until the next compaction (what they would grow to meanwhile anyway), so
# no step between two compactions grows a buffer and leaves the decode step.


class VeloxRotatingKVCache(VeloxKVCache):
    """Sliding-window cache of `max_size` tokens storing compressed records; arguments as VeloxKVCache
    (method, bits, window, exact_trim, ...) plus mlx-lm's `max_size` and `keep` (0 only)."""

    def __init__(self, max_size: int, keep: int = 0, bits: int | None = None, **kwargs):
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size: must be a positive int, got {max_size!r}")
        if keep != 0:
            raise ValueError(f"keep: only 0 is supported by VeloxRotatingKVCache, got {keep!r}")
        super().__init__(bits, **kwargs)
        self.max_size, self.keep = max_size, keep

    # ---- which tokens are held ------------------------------------------------------------------------
    def _held(self) -> int:
        # a chunk the decode step left for its attention launch (decode_step.DecodeStep.pending) is held already;
        # the streams count it once stored. No cost in a model's forward: its attention stored it before the next mask
        self._flush_step()
        return 0 if self._k is None else self._k.tokens

    def _held_after_eviction(self) -> int:
        """Old tokens the next update attends over: mlx-lm's max_size - 1; a kivi stream evicts encoded
        tokens in whole groups of G, so it may keep up to G - 1 more (the mask hides them)."""
        held, limit = self._held(), self.max_size - 1
        drop = held - limit
        if drop <= 0:
            return held
        for s in (self._k, self._v):
            if s.params.method == "kivi" and drop < s._q:      # encoded tokens go in whole groups only
                drop = drop // s.params.group_size * s.params.group_size
        return held - drop

    def _evict(self) -> None:
        self._flush_step()              # a chunk its decode step left pending counts among the held tokens
        drop = self._held() - self._held_after_eviction()
        if drop > 0:
            plan = self._in_place
            held = plan is not None and plan.kver == self._k._version and plan.vver == self._v._version
            self._k.evict(drop)
            self._v.evict(drop)
            if held:                    # rows are only skipped: the in-place append (and decode step) go on
                plan.evicted()
        limit = 0 if self._k is None else max(tuning.current().compact_rows, self._k.tokens)
        if self._k is not None and self._k.dead_rows() > limit:
            self._settle(keep=0)
            self._chunks.clear()      # marks taken before a compaction cannot be restored
            # room for the rows appended until the next compaction (the dead rows then: over `limit`, KIVI's whole
            # groups past it; a KIVI window's flush up to G more), so that no step in between grows a buffer
            g = max(s.params.group_size if s.params.method == "kivi" else 1 for s in (self._k, self._v))
            self._k.compact(limit + 2 * g)
            self._v.compact(limit + 2 * g)

    # ---- mlx-lm protocol ------------------------------------------------------------------------------
    def update_and_fetch(self, keys, values):
        self._evict()
        return super().update_and_fetch(keys, values)

    def size(self) -> int:
        return min(self.offset, self.max_size)

    def is_trimmable(self) -> bool:
        return self.offset < self.max_size     # as RotatingKVCache: nothing has been evicted yet

    def trim(self, n: int) -> int:
        if not self.is_trimmable():
            raise ValueError(f"n: this sliding-window cache has evicted tokens (offset {self.offset} >= "
                             f"max_size {self.max_size}); it is no longer trimmable")
        return super().trim(n)

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        """RotatingKVCache.make_mask for the layout the next update attends over (held tokens after the
        eviction, then the N new ones, in temporal order)."""
        old = self._held_after_eviction()
        window_size = window_size or self.max_size
        if N > 1 or return_array:
            if old + N > window_size or return_array:
                return create_causal_mask(N, old, window_size=window_size)
            return "causal"
        if old + 1 > window_size:      # a narrower window than max_size, or kivi's extra group tokens
            mask = create_causal_mask(1, old, window_size=window_size)
            if self.attention == "packed" and self._k is not None:
                # what it hides is the oldest old + 1 - window_size held tokens: remembered as that row start, the
                # hooked attention takes the kernels (which take no array mask) instead of the ops path
                b, start = self._k._bhd[0], old + 1 - window_size
                starts = km.count(start) if b == 1 else mx.array([start] * b, dtype=mx.int32)
                rows = RowStarts(starts, False, mask, (start,) * b)
                masks.remember_mask(masks._MASKS, mask, (mask, rows), masks._MASKS_KEPT)
            return mask
        return None

    # ---- save / load ----------------------------------------------------------------------------------
    @property
    def meta_state(self) -> str:
        meta = json.loads(super().meta_state)
        meta.update(max_size=self.max_size, keep=self.keep, evicted=self.offset - self._held())
        return _to_json(meta)

    @property
    def state(self):
        self._settle(keep=0)
        if self._k is None:
            return None, None, self.meta_state
        return dict(self._k.state()[0]), dict(self._v.state()[0]), self.meta_state

    @state.setter
    def state(self, v):
        VeloxKVCache.state.fset(self, v)
        meta = json.loads(v[2])
        self.max_size, self.keep = meta["max_size"], meta["keep"]

    def __repr__(self) -> str:
        return super().__repr__().replace("(offset=", f"(max_size={self.max_size}, offset=", 1)
