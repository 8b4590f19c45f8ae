"""Batched caches for mlx-lm's `batch_generate` / `BatchGenerator` / server (mlx-lm 0.32's batch protocol).

mlx-lm batches sequences of different lengths in one (B, H, T, d) cache, `BatchKVCache`
(mlx_lm/models/cache.py): `merge` left-pads single-sequence caches to a common length, a prefill of prompts of
different lengths is right-padded (`prepare(lengths=, right_padding=)`) and `finalize` rolls that padding to
the left; `filter` / `extend` drop and add sequences, `extract` gives one sequence back as a single cache,
`make_mask` hides the left padding, and `offset` is a per-sequence array (RoPE positions).

`VeloxKVCache.merge` makes a `SharedBatchVeloxKVCache` (batch_shared.py: the batch in one B-row cache, one
attention launch per layer) where every sequence's tokens encode independently of their position (exact windows
included; KIVI where the rows' left padding is whole groups); this module's `BatchVeloxKVCache` takes the others (kivi
rows not whole groups apart, sliding-window caches, exact-trim copies with a
window) and tuning's `shared=False`, and runs a windowed B-row cache's right-padded prefill.

`BatchVeloxKVCache` follows that protocol, but keeps one single-sequence `VeloxKVCache` per sequence and stores
only each sequence's real tokens: the padding is virtual. So merge and extract move records without decoding
them (each sequence's bytes are the bytes it has alone: the streams encode token by token, and a window and
KIVI's groups depend on the sequence's own token count, which a shared padded stream would change), and the
padding tokens, which mlx-lm computes but never uses, are never encoded (nor checked for NaN/Inf).

Layout (virtual, as BatchKVCache's): the batch has `_idx` positions; sequence i's T_i tokens sit at
[lp_i, lp_i + T_i), lp_i = `left_padding[i]`; during a right-padded prefill the positions after them are its
right padding (`finalize` moves them into lp_i). `offset` = `_idx - left_padding`, exactly BatchKVCache's.

Attention: in packed mode `update_and_fetch` returns `BatchPackedKV`s and the hooked dispatch
(accelerated/cache/integration.py) calls `attend_batch`: per sequence, its real query rows attend over its own packed
record with the mask restricted to its real keys (rows of padding queries are zeros: mlx-lm discards them).
A mask made by `make_mask` of one of these caches is known to be causal + left padding, so each sequence gets
exactly what its single-sequence cache would get ("causal" or None), which the fused kernels take. In
dequantize mode the decoded tokens are returned in the padded layout (zeros in the padding) for the model's
own attention with the mask.

Deferred checks run per sequence (each sequence's cache rolls itself back; the layers of a batch do not form a
CacheGroup, since mlx-lm merges each layer on its own).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

from .. import tuning
from ..attention import PackedKV, attend
from .base import VeloxKVCache
from .classes import cache_class
from .left_padded import LeftPadded
from .masks import remember_mask
from . import size as cache_size
from .rotating import VeloxRotatingKVCache

# Where every sequence takes the whole chunk (a decode step; a prefill chunk without padding), the batch's keys,
# values and queries are cut into per-sequence rows by one mx.split each (one Split operation with B outputs, for
# B <= 10: mlx/ops.cpp) instead of B slices each: at B = 8, 3 operations per layer instead of 24, each of which
# costs the host a few microseconds to build and encode on a GPU (accelerated.tuning's split_rows).
_SPLIT_MAX = 10           # mx.split makes one operation below 10 sections, slices above


def _rows_of(x: mx.array, rows) -> list:
    """Each sequence's rows of x (B, H, n, d) for a chunk's (start, count) per sequence; None for a count of 0."""
    b, n = x.shape[0], x.shape[2]
    if tuning.current().split_rows and 1 < b <= _SPLIT_MAX and all(ar == (0, n) for ar in rows):
        return mx.split(x, b, axis=0)
    return [x[i:i + 1, :, a:a + r] if r else None for i, (a, r) in enumerate(rows)]


# masks made by BatchVeloxKVCache.make_mask: id -> (mask, N, positions, left padding); a handful suffice
# (one forward uses one mask for every layer)
_OWN_MASKS: collections.OrderedDict = collections.OrderedDict()
_OWN_MASKS_KEPT = 8


@dataclasses.dataclass(frozen=True)
class BatchPackedKV:
    """One role of a batch in packed mode: per sequence its PackedKV (None if the chunk had no real token of
    it) and where the chunk's real rows are (start, count); `idx` positions, `lp` left padding; `own`: per
    sequence, (the mask its own cache's make_mask gave for the chunk,) for a sliding-window cache, else None."""
    seqs: tuple
    rows: tuple
    idx: int
    lp: tuple
    own: tuple = ()

    @property
    def shape(self):
        d = next(s.shape[3] for s in self.seqs if s is not None)
        h = next(s.shape[1] for s in self.seqs if s is not None)
        return len(self.seqs), h, self.idx, d


def _detached(cache):
    """A deep copy of one sequence's cache, checks settled, out of its CacheGroup."""
    cache.check()
    memo = {} if cache._group is None else {id(cache._group): None}
    new = copy.deepcopy(cache, memo)
    new._group = None
    new._chunks.clear()
    return new


def _same_config(a, b) -> bool:
    return (a.key_params == b.key_params and a.value_params == b.value_params and a.attention == b.attention
            and a.checks == b.checks)


class BatchVeloxKVCache(LeftPadded):
    """A batch of single-sequence VeloxKVCaches behind mlx-lm's BatchKVCache protocol (see the module)."""

    def __init__(self, caches: list, left_padding: list[int], idx: int):
        self.caches = list(caches)
        self._lp = [int(x) for x in left_padding]
        self._idx = int(idx)
        self._skip = None         # left padding still to drop at the front of incoming chunks (prepare)
        self._remaining = None    # real tokens still to come per sequence in a right-padded prefill
        self._right = None        # right padding to move into the left padding at finalize
        self._offset = None

    @property
    def attention(self) -> str:
        return self.caches[0].attention if self.caches else "packed"

    # ---- protocol: merge / filter / extend / extract / prepare / finalize ---------------------------
    @classmethod
    def merge(cls, caches) -> "BatchVeloxKVCache":
        caches = list(caches)
        if not caches:
            raise ValueError("caches: nothing to merge")
        for i, c in enumerate(caches):
            if not isinstance(c, VeloxKVCache):
                raise ValueError(f"caches: item {i} is a {type(c).__name__}, not a VeloxKVCache")
            if not _same_config(c, caches[0]):
                raise ValueError(f"caches: item {i} has other parameters than item 0 ({c!r} vs {caches[0]!r})")
        lengths = [c.offset for c in caches]
        top = max(lengths)
        return cls([_detached(c) for c in caches], [top - n for n in lengths], top)

    def filter(self, batch_indices) -> None:
        keep = batch_indices.tolist() if isinstance(batch_indices, mx.array) else [int(i) for i in batch_indices]
        self.caches = [self.caches[i] for i in keep]
        self._lp = [self._lp[i] for i in keep]
        for name in ("_skip", "_remaining", "_right"):
            v = getattr(self, name)
            if v is not None:
                setattr(self, name, [v[i] for i in keep])
        if self._lp and self._skip is None:
            shift = min(self._lp)           # as BatchKVCache: drop padding every sequence has
            self._lp = [x - shift for x in self._lp]
            self._idx -= shift
        self._offset = None

    def extend(self, other: "BatchVeloxKVCache") -> None:
        if callable(getattr(other, "per_sequence", None)):     # a SharedBatchVeloxKVCache (batch_shared.py)
            other = other.per_sequence()
        if not isinstance(other, BatchVeloxKVCache):
            raise ValueError(f"other: expected a BatchVeloxKVCache, got {type(other).__name__}")
        if (self.caches and other.caches and not _same_config(self.caches[0], other.caches[0])):
            raise ValueError("other: its caches have other parameters than this batch's")
        if any(getattr(c, n) is not None for c in (self, other) for n in ("_skip", "_remaining", "_right")):
            raise ValueError("other: cannot extend between prepare and finalize")
        top = max(self._idx, other._idx)
        self._lp = [x + top - self._idx for x in self._lp] + [x + top - other._idx for x in other._lp]
        self.caches = self.caches + other.caches
        self._idx = top
        self._offset = None

    def extract(self, idx: int):
        """Sequence idx as its own single-sequence cache (a copy of its records, bytes unchanged)."""
        return _detached(self.caches[idx])

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        b = len(self.caches)
        if left_padding is not None:
            if not self.empty():
                raise ValueError("left_padding: can only be added to an empty batch cache")
            left_padding = [int(x) for x in left_padding]
            self._lp = [x + p for x, p in zip(self._lp, left_padding)]
            self._skip = left_padding
        if right_padding is not None and max(right_padding) > 0:
            if lengths is None or len(lengths) != b:
                raise ValueError(f"lengths: one prompt length per sequence is needed with right_padding "
                                 f"(got {lengths!r})")
            self._remaining = [int(x) for x in lengths]
            self._right = [int(x) for x in right_padding]
        self._offset = None

    def finalize(self) -> None:
        if self._right is not None:
            self._lp = [x + p for x, p in zip(self._lp, self._right)]
        self._right = self._remaining = self._skip = None
        self._offset = None

    # ---- protocol: the model's calls ----------------------------------------------------------------
    @property
    def bits(self) -> int:
        if self.attention != "packed":
            raise AttributeError("bits")
        return self.caches[0].bits

    @property
    def group_size(self) -> int:
        if self.attention != "packed":
            raise AttributeError("group_size")
        return self.caches[0].group_size

    def _chunk_rows(self, n: int) -> list[tuple[int, int]]:
        """(start, count) of each sequence's real tokens in a chunk of n positions; consumes the pending
        left padding and remaining prompt lengths."""
        rows = []
        for i in range(len(self.caches)):
            a = 0
            if self._skip is not None:
                a = min(n, self._skip[i])
                self._skip[i] -= a
            r = n - a
            if self._remaining is not None:
                r = min(r, self._remaining[i])
                self._remaining[i] -= r
            rows.append((a, r))
        if self._skip is not None and not any(self._skip):
            self._skip = None
        return rows

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if keys.ndim != 4 or keys.shape[0] != len(self.caches):
            raise ValueError(f"keys: expected (B = {len(self.caches)}, H, t, d), got {keys.shape}")
        n = keys.shape[2]
        rows = self._chunk_rows(n)
        ks, vs = _rows_of(keys, rows), _rows_of(values, rows)
        # a sliding-window cache holds its newest tokens only, which the batch's mask (over every position) cannot
        # place: such a sequence attends with the mask its own cache gives, made before its update evicts
        own = tuple((c.make_mask(r),) if r and isinstance(c, VeloxRotatingKVCache) else None
                    for c, (_, r) in zip(self.caches, rows))
        fetched = [c.update_and_fetch(k, v) if k is not None else None for c, k, v in zip(self.caches, ks, vs)]
        self._idx += n
        self._offset = None
        if self.attention == "packed":
            return tuple(BatchPackedKV(tuple(f if f is None else f[j] for f in fetched), tuple(rows),
                                       self._idx, tuple(self._lp), own) for j in (0, 1))
        return tuple(self._padded([None if f is None else f[j] for f in fetched], ref)
                     for j, ref in ((0, keys), (1, values)))

    def _padded(self, decoded: list, ref: mx.array) -> mx.array:
        """Dequantize mode: every sequence's decoded tokens at their positions, zeros elsewhere (a sequence
        without a real token in this chunk has only padding query rows: zeros)."""
        out = []
        for lp, x in zip(self._lp, decoded):
            if x is None:
                out.append(mx.zeros((1, ref.shape[1], self._idx, ref.shape[3]), dtype=ref.dtype))
            else:
                out.append(mx.pad(x, [(0, 0), (0, 0), (lp, self._idx - lp - x.shape[2]), (0, 0)]))
        return mx.concatenate(out, axis=0)

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        mask = create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, window_size=window_size)
        if window_size is None:
            remember_mask(_OWN_MASKS, mask, (mask, N, self._idx + N, tuple(self._lp)), _OWN_MASKS_KEPT)
        return mask

    # ---- sizes, trim, state ---------------------------------------------------------------------------
    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return all(c.empty() for c in self.caches)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    @property
    def nbytes_parts(self) -> dict:
        """VeloxKVCache.nbytes_parts summed over the sequences."""
        return cache_size.add(*(c.nbytes_parts for c in self.caches))

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        for c in self.caches:
            c.trim(min(n, c.offset))
        self._idx -= n
        self._lp = [self._idx - c.offset for c in self.caches]
        self._offset = None
        return n

    @property
    def state(self):
        meta = {"idx": self._idx, "left_padding": self._lp, "classes": [type(c).__name__ for c in self.caches]}
        return [c.state for c in self.caches], json.dumps(meta)

    @state.setter
    def state(self, v):
        states, meta = v
        meta = json.loads(meta)
        self.__init__([cache_class(name).from_state(s) for name, s in zip(meta["classes"], states)],
                      meta["left_padding"], meta["idx"])

    def __repr__(self) -> str:
        return f"BatchVeloxKVCache(B={len(self.caches)}, idx={self._idx}, left_padding={self._lp})"


def _own_mask(mask, queries: mx.array, keys: BatchPackedKV) -> bool:
    """True if `mask` is "causal" or was made by a BatchVeloxKVCache.make_mask for this very layout."""
    if isinstance(mask, str):
        return True
    entry = _OWN_MASKS.get(id(mask))
    return entry is not None and entry[0] is mask and entry[1:] == (queries.shape[2], keys.idx, keys.lp)


def _sequence_mask(mask, i: int, a: int, r: int, lp: int, t: int, n: int, idx: int):
    """Rows a..a+r-1 and the columns of sequence i's real keys [lp, lp + t) of a mask in the batch layout."""
    m = mask
    while m.ndim < 4:
        m = m[None]
    m = mx.broadcast_to(m, (m.shape[0], m.shape[1], n, idx))
    bi = i if m.shape[0] > 1 else 0
    return m[bi:bi + 1, :, a:a + r, lp:lp + t]


def attend_batch(queries: mx.array, keys: BatchPackedKV, values: BatchPackedKV, scale: float, mask=None):
    """mlx-lm's SDPA contract over a batch of packed records: each sequence's real query rows attend over its
    own record (see the module); rows of padding queries are zeros."""
    b, hq, n, d = queries.shape
    own = mask is not None and _own_mask(mask, queries, keys)
    out = []
    qs = _rows_of(queries, keys.rows)
    for i, (k, v, (a, r)) in enumerate(zip(keys.seqs, values.seqs, keys.rows)):
        if k is None:
            out.append(mx.zeros((1, hq, n, d), dtype=queries.dtype))
            continue
        if keys.own and keys.own[i] is not None:
            m = keys.own[i][0]
        elif mask is None:
            m = None
        elif own:
            m = "causal" if r > 1 else None     # what the sequence's own cache's make_mask gives
        else:
            m = _sequence_mask(mask, i, a, r, keys.lp[i], k.shape[2], n, keys.idx)
        o = attend(qs[i], k, v, scale, m)
        if r < n:
            o = mx.pad(o, [(0, 0), (0, 0), (a, n - a - r), (0, 0)])
        out.append(o)
    return mx.concatenate(out, axis=0)


__all__ = ["BatchVeloxKVCache", "BatchPackedKV", "attend_batch", "PackedKV"]
