"""A batch in one B-row cache, left-padded as mlx-lm's BatchKVCache is: one decode-step launch per layer for the
whole batch (accelerated/cache/batch.py attends per sequence: B launches and ~5B operations per layer).

For the methods whose tokens encode independently of their position and of each other (turboquant,
turboquant_rvq, turboquant_prod, rabitq, mlx_affine) with no exact window: then a sequence's record is the same
bytes wherever its tokens sit, so the batch keeps every sequence's tokens in one `VeloxKVCache` of B rows, sequence
i's at positions [lp_i, idx) behind lp_i tokens of padding, as BatchKVCache keeps its fp16 tensors. The padding
rows hold what the model computed for the padding tokens (a prompt's left padding, a right-padded prefill's tail
once `finalize` rolled it to the left) or zeros (rows added by merge, extend); attention never reads them: the
decode step's launch takes each row's start (ops.attention.RowStarts, the partial kernel's `rstart`: each row's
splits cover its own tokens), and other paths the mask. merge, extend, filter, extract and finalize move records
without decoding them (through the records' state arrays), so `extract(i)` gives back the bytes sequence i's own
cache would hold.

The mask: `make_mask` returns mlx-lm's array (create_causal_mask with the left padding, what BatchKVCache gives)
and remembers it; the hooked dispatch (hook.py) hands our attention the RowStarts it stands for instead
(`row_starts`). mlx-lm's BatchKVCache makes the same mask (a batch whose first layer is fp16 gets its mask from
there): hook.install has its make_mask remember the RowStarts too (`remember_batch_kv_mask`). Any other array mask
is attended as an array (the ops path: slower; on CUDA in TF32, MLX's default for float32 matmuls). Prefill masks
are held only until the next mask (`remember_mask`: at 8 x 32k one is 537 MB).

Checks (spec/streaming.md, 'Deferred rejection'): the B rows are one cache; a NaN or Inf in any sequence's chunk
rolls the whole batch back to before that chunk and raises (the per-sequence class rolls back that sequence only).
Attention results are those of the tolerance tier: the rows' splits differ from a sequence's own cache's, so
outputs can differ from a single-sequence run in the last bits (BatchVeloxKVCache's match it bit for bit).
"""
from __future__ import annotations

import collections
import json
import typing

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import _BaseCache

from veloxquant.accelerated import tuning
from veloxquant.accelerated.ops.attention import RowStarts

_POSITIONAL = ("kivi",)    # methods whose bytes depend on a token's position (KIVI's key groups)

# masks made by SharedBatchVeloxKVCache.make_mask: id -> (mask, RowStarts); a handful suffice (one forward uses one
# mask for every layer)
_MASKS: collections.OrderedDict = collections.OrderedDict()
_MASKS_KEPT = 8
_OFFSETS: collections.OrderedDict = collections.OrderedDict()      # (idx, left padding) -> offsets array
_OFFSETS_KEPT = 4


def eligible(caches) -> bool:
    """Whether `caches` (single-sequence caches of one layer) can share one B-row cache: VeloxKVCaches of one class
    and configuration (not a sliding-window cache), per-token methods in both roles, no exact window."""
    from veloxquant.accelerated.cache.base import VeloxKVCache
    from veloxquant.accelerated.cache.batch import _same_config
    from veloxquant.accelerated.cache.rotating import VeloxRotatingKVCache
    if not tuning.current().shared or not caches:
        return False
    c0 = caches[0]
    if not isinstance(c0, VeloxKVCache) or isinstance(c0, VeloxRotatingKVCache):
        return False
    if any(type(c) is not type(c0) or not _same_config(c, c0) for c in caches):
        return False
    return all(p.method not in _POSITIONAL and not p.window for p in (c0.key_params, c0.value_params))


def remember(kept: collections.OrderedDict, key, value, most: int):
    """kept[key] = value, dropping the oldest entries beyond `most` (the masks and offsets arrays of recent steps)."""
    kept[key] = value
    while len(kept) > most:
        kept.popitem(last=False)
    return value


BIG_MASK = 1 << 22     # elements: a mask past this (a prefill chunk's (B, 1, L, T): 537 MB at 8 x 2048 x 32k) is kept
                       # only until the next mask is remembered, not among the last `most`


def remember_mask(kept: collections.OrderedDict, mask: mx.array, value, most: int):
    """remember(kept, id(mask), value, most) for a mask made by a batch cache (value[0] is the mask), first dropping
    the big masks remembered before: holding a handful of prefill masks alive would cost GBs at long contexts."""
    for key in [k for k, v in kept.items() if v[0].size > BIG_MASK]:
        del kept[key]
    return remember(kept, id(mask), value, most)


def remember_batch_kv_mask(cache, mask, n: int, window_size=None) -> None:
    """A mask mlx-lm's BatchKVCache.make_mask made (an fp16 layer of a batch whose other layers are ours: the model
    makes the mask from its first layer's cache): it is create_causal_mask with the batch's left padding, the same
    mask our B-row cache makes, so it is remembered as the RowStarts it stands for and our layers attend with the
    decode step's launch instead of an array mask (hook.install wraps BatchKVCache.make_mask). Not for sliding
    windows (window_size) or anything but an array."""
    if window_size is None and type(mask) is mx.array:
        starts = cache.left_padding
        if starts.dtype != mx.int32:
            starts = starts.astype(mx.int32)
        remember_mask(_MASKS, mask, (mask, RowStarts(starts, n > 1, mask)), _MASKS_KEPT)


def cache_class(name: str):
    """The cache class a saved batch names (accelerated.cache.CACHE_CLASSES)."""
    import veloxquant.accelerated.cache as vq
    return {cls.__name__: cls for cls in vq.CACHE_CLASSES}[name]


def offsets(idx: int, left_padding) -> mx.array:
    """(B,) int32 positions idx - left_padding[b], one array per (idx, padding): the layers of a batch move in step
    and the model reads the offsets in every layer (RoPE), so they share it instead of a host-made array each."""
    key = (idx, tuple(left_padding))
    a = _OFFSETS.get(key)
    if a is None:
        a = remember(_OFFSETS, key, mx.array([idx - x for x in left_padding], dtype=mx.int32), _OFFSETS_KEPT)
    return a


def row_starts(mask):
    """The RowStarts a mask made by SharedBatchVeloxKVCache.make_mask stands for, else the mask itself."""
    if type(mask) is mx.array:
        entry = _MASKS.get(id(mask))
        if entry is not None and entry[0] is mask:
            return entry[1]
    return mask


class _Part(typing.NamedTuple):
    """Rows of one cache's record going into a restacked cache: its fields (None: no token), meta, row count,
    the rows taken (None: all), the first token taken and the zero tokens put on their left."""
    k: dict | None
    v: dict | None
    meta: dict
    nrows: int
    rows: list | None = None
    first: int = 0
    pad: int = 0

    @property
    def tokens(self) -> int:
        return self.pad + (self.meta["offset"] - self.first if self.k is not None else 0)


def _part(cache, pad: int = 0, rows=None, first: int = 0, nrows: int = 1) -> _Part:
    """cache's record (checks settled) as a _Part; `nrows`: its rows when it holds no token yet."""
    k, v, meta = cache.state
    meta = json.loads(meta)
    return _Part(k, v, meta, k["window"].shape[0] if k is not None else nrows, rows, first, pad)


def _restack(parts: list, like):
    """One cache of type(like) holding the parts' rows one after another (every part the same token count after
    its padding); an empty cache of like's configuration if none has a token."""
    tops = {p.tokens for p in parts}
    if len(tops) != 1:
        raise ValueError(f"parts: token counts after padding differ: {sorted(tops)}")
    top = tops.pop()
    ref = next((p for p in parts if p.k is not None), None)
    if ref is None or top == 0:
        return _empty_like(like)
    if any(p.k is not None and "kept" in p.k for p in parts):     # exact-trim values: a per-sequence tail
        raise ValueError("parts: a record with kept tokens (an exact window or exact-trim tail) cannot be restacked")
    fields = []
    for role in ("k", "v"):
        out = {}
        for name, a_ref in getattr(ref, role).items():
            pieces = []
            for p in parts:
                f = getattr(p, role)
                nb = len(p.rows) if p.rows is not None else p.nrows
                if f is None:
                    a = mx.zeros((nb, a_ref.shape[1], 0, *a_ref.shape[3:]), dtype=a_ref.dtype)
                else:
                    a = f[name]
                    if p.rows is not None and list(p.rows) != list(range(a.shape[0])):
                        a = a[mx.array(p.rows, dtype=mx.int32)]
                    if name != "window" and p.first:
                        a = a[:, :, p.first:]
                if name != "window" and top > a.shape[2]:
                    a = mx.pad(a, [(0, 0), (0, 0), (top - a.shape[2], 0)] + [(0, 0)] * (a.ndim - 3))
                pieces.append(a)
            out[name] = mx.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0]
        fields.append(out)
    meta = dict(ref.meta)
    meta.update(offset=top, k={**meta["k"], "tokens": top}, v={**meta["v"], "tokens": top}, evicted=0)
    meta["class"] = type(like).__name__
    return type(like).from_state((fields[0], fields[1], json.dumps(meta)))


def _empty_like(cache):
    """A new empty cache with `cache`'s class and configuration."""
    meta = json.loads(cache.meta_state)
    for key in ("k", "v"):
        meta.pop(key, None)
    meta["offset"] = 0
    return type(cache).from_state((None, None, json.dumps(meta)))


class LeftPadded(_BaseCache):
    """What both batch caches (this module's and batch.py's) derive from `_idx` (the batch's position count) and
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


class SharedBatchVeloxKVCache(LeftPadded):
    """A left-padded batch of sequences in one B-row VeloxKVCache behind mlx-lm's BatchKVCache protocol (see the
    module). `inner.offset` is the batch's position count (mlx-lm's `_idx`)."""

    def __init__(self, inner, left_padding: list[int], batch: int):
        self.inner = inner
        self._lp = [int(x) for x in left_padding]
        self._b = int(batch)
        self._right = None        # right padding to roll into the left padding at finalize
        self._offset = self._starts = None

    # ---- protocol: merge / filter / extend / extract / prepare / finalize ---------------------------
    @classmethod
    def merge(cls, caches) -> "SharedBatchVeloxKVCache":
        caches = list(caches)
        if not eligible(caches):
            raise ValueError("caches: not one configuration of per-token methods without a window "
                             "(BatchVeloxKVCache takes those)")
        lengths = [c.offset for c in caches]
        top = max(lengths)
        lp = [top - n for n in lengths]
        inner = _restack([_part(c, p) for c, p in zip(caches, lp)], caches[0])
        return cls(inner, lp, len(caches))

    @property
    def _idx(self) -> int:
        return self.inner.offset

    def _changed(self) -> None:
        self._offset = self._starts = None

    def filter(self, batch_indices) -> None:
        keep = batch_indices.tolist() if isinstance(batch_indices, mx.array) else [int(i) for i in batch_indices]
        lp = [self._lp[i] for i in keep]
        shift = min(lp) if lp and self._right is None else 0     # as BatchKVCache: drop padding every row has
        if self.inner.empty():
            self.inner = _empty_like(self.inner)
            shift = 0
        else:
            self.inner = _restack([_part(self.inner, 0, keep, shift)], self.inner)
        self._lp = [x - shift for x in lp]
        if self._right is not None:
            self._right = [self._right[i] for i in keep]
        self._b = len(keep)
        self._changed()

    def extend(self, other: "SharedBatchVeloxKVCache") -> None:
        if not isinstance(other, SharedBatchVeloxKVCache):
            raise ValueError(f"other: expected a SharedBatchVeloxKVCache, got {type(other).__name__}")
        if not eligible([self.inner, other.inner]):
            raise ValueError("other: its caches have other parameters than this batch's")
        if self._right is not None or other._right is not None:
            raise ValueError("other: cannot extend between prepare and finalize")
        top = max(self._idx, other._idx)
        pads = (top - self._idx, top - other._idx)
        parts = [_part(c.inner, pad, nrows=c._b) for c, pad in zip((self, other), pads)]
        self.inner = _restack(parts, self.inner)
        self._lp = [x + pads[0] for x in self._lp] + [x + pads[1] for x in other._lp]
        self._b += other._b
        self._changed()

    def extract(self, idx: int):
        """Sequence idx as its own single-sequence cache (its rows' bytes, the padding left out)."""
        if self.inner.empty():
            return _empty_like(self.inner)
        return _restack([_part(self.inner, 0, [idx], self._lp[idx])], self.inner)

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        if left_padding is not None:
            if not self.inner.empty():
                raise ValueError("left_padding: can only be added to an empty batch cache")
            self._lp = [x + int(p) for x, p in zip(self._lp, left_padding)]
        if right_padding is not None and max(right_padding) > 0:
            self._right = [int(x) for x in right_padding]
        self._changed()

    def finalize(self) -> None:
        if self._right is not None and max(self._right) > 0 and not self.inner.empty():
            self.inner = _rolled(self.inner, self._right)
            self._lp = [x + r for x, r in zip(self._lp, self._right)]
        self._right = None
        self._changed()

    # ---- protocol: the model's calls ----------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if keys.ndim != 4 or keys.shape[0] != self._b:
            raise ValueError(f"keys: expected (B = {self._b}, H, t, d), got {keys.shape}")
        self._offset = None         # (also if the inner cache rolls back a bad chunk and raises)
        out = self.inner.update_and_fetch(keys, values)
        self._offset = None
        return out

    @property
    def starts(self) -> mx.array:
        """(B,) int32: each row's first real position (its left padding), on the device, made once per layout."""
        if self._starts is None:
            self._starts = mx.array(self._lp, dtype=mx.int32)
            mx.eval(self._starts)
        return self._starts

    @property
    def attention(self) -> str:
        return self.inner.attention

    @property
    def bits(self) -> int:
        return self.inner.bits

    @property
    def group_size(self) -> int:
        return self.inner.group_size

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        # the left padding as the rows' starts array, made once per layout (left_padding makes a new array per call)
        mask = create_causal_mask(N, offset=self._idx, left_padding=self.starts, window_size=window_size)
        if window_size is None:
            remember_mask(_MASKS, mask, (mask, RowStarts(self.starts, N > 1, mask, tuple(self._lp))), _MASKS_KEPT)
        return mask

    # ---- sizes, checks, trim, state -----------------------------------------------------------------
    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.inner.empty()

    def check(self) -> None:
        self._offset = None         # a rollback changes the position count
        self.inner.check()

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    @property
    def nbytes_parts(self) -> dict:
        return self.inner.nbytes_parts

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = self.inner.trim(min(self._idx, n))
        self._changed()
        return n

    @property
    def state(self):
        meta = {"left_padding": self._lp, "batch": self._b, "class": type(self.inner).__name__}
        return self.inner.state, json.dumps(meta)

    @state.setter
    def state(self, v):
        inner_state, meta = v
        meta = json.loads(meta)
        self.__init__(cache_class(meta["class"]).from_state(inner_state), meta["left_padding"], meta["batch"])

    def __repr__(self) -> str:
        return f"SharedBatchVeloxKVCache(B={self._b}, idx={self._idx}, left_padding={self._lp}, inner={self.inner!r})"


def _rolled(cache, shifts: list[int]):
    """cache with each row's tokens rolled right by shifts[row] (mlx-lm's dynamic_roll at finalize: a right-padded
    prefill's padding moves to the front)."""
    k, v, meta = cache.state
    meta = json.loads(meta)
    t = meta["offset"]
    idx = (mx.arange(t)[None, :] - mx.array(shifts, dtype=mx.int32)[:, None]) % t     # (B, t)
    out = []
    for f in (k, v):
        g = {}
        for name, a in f.items():
            if name == "window":
                g[name] = a
                continue
            ix = idx.reshape(idx.shape[0], 1, t, *([1] * (a.ndim - 3)))
            g[name] = mx.take_along_axis(a, mx.broadcast_to(ix, a.shape), axis=2)
        out.append(g)
    return type(cache).from_state((out[0], out[1], json.dumps(meta)))


__all__ = ["SharedBatchVeloxKVCache", "eligible", "row_starts"]
