"""The masks and offsets a left-padded batch makes, remembered for the layers after the first (one forward uses
one mask and one offsets array for every layer): which RowStarts a mask stands for (`row_starts`), held by id in a
few most recent entries, big prefill masks only until the next one (`remember_mask`)."""
from __future__ import annotations

import collections

import mlx.core as mx

from ..ops.attention import RowStarts

# masks made by SharedBatchVeloxKVCache.make_mask: id -> (mask, RowStarts); a handful suffice (one forward uses one
# mask for every layer)
_MASKS: collections.OrderedDict = collections.OrderedDict()
_MASKS_KEPT = 8
_OFFSETS: collections.OrderedDict = collections.OrderedDict()      # (idx, left padding) -> offsets array
_OFFSETS_KEPT = 4


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
