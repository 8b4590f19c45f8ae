"""A batch in one B-row cache, left-padded as mlx-lm's BatchKVCache is: one decode-step launch per layer for the
whole batch (accelerated/cache/batch.py attends per sequence: B launches and ~5B operations per layer).

For the methods whose tokens encode independently of their position and of each other (turboquant,
turboquant_rvq, turboquant_prod, rabitq, mlx_affine): then a sequence's record is the same bytes wherever its tokens
sit, so the batch keeps every sequence's tokens in one `VeloxKVCache` of B rows, sequence i's at positions [lp_i, idx)
behind lp_i tokens of padding, as BatchKVCache keeps its fp16 tensors. With an exact window R the stream's window is
its newest min(idx, R) positions and every row's own window is its newest min(T_i, R) tokens: the same split, since a
row's tokens end at idx, so each row holds exactly what its own cache holds (the flush of a decode step encodes the
same position in every row; in rows still shorter than R it is padding). KIVI (either role) only where every row's
left padding is a whole number of groups (`alignment`: the lengths equal mod G): its key groups and its window's
flushes count from the sequence's first token (a window holds R .. R + G - 1 tokens by the length mod G), so rows
whole groups apart flush together at the stream's group bounds; rows that are not would need per-row flush
positions in the kernels (with tuning's `ragged`, on by default, they share one B-row cache of ragged streams,
each row flushing at its own phase: cache/ragged.py, its decode step cache/ragged_step.py, docs/ragged-kivi.md). A batch whose rows stop being whole groups apart (extend, a KIVI prefill) goes on per
sequence inside this class (`_seq`, a BatchVeloxKVCache) until a filter leaves rows that are. The padding
rows hold what the model computed for the padding tokens (a prompt's left padding, a right-padded prefill's tail
once `finalize` rolled it to the left) or zeros (rows added by merge, extend); attention never reads them: the
decode step's launch takes each row's start (ops.attention.RowStarts, the partial kernel's `rstart`: each row's
splits cover its own tokens; with a window, once every row's start lies in the encoded tokens: kernels.attention
.supports), and other paths the mask. merge, extend, filter, extract and finalize move records
without decoding them (through the records' state arrays: restack.py), so `extract(i)` gives back the bytes
sequence i's own cache would hold.

The mask: `make_mask` returns mlx-lm's array (create_causal_mask with the left padding, what BatchKVCache gives)
and remembers it; the hooked dispatch (integration.py) hands our attention the RowStarts it stands for instead
(masks.row_starts). mlx-lm's BatchKVCache makes the same mask (a batch whose first layer is fp16 gets its mask from
there): integration.install has its make_mask remember the RowStarts too (masks.remember_batch_kv_mask). Any other
array mask is attended as an array (the ops path: slower; on CUDA in TF32, MLX's default for float32 matmuls). Prefill masks
are held only until the next mask (masks.remember_mask: at 8 x 32k one is 537 MB).

Checks (spec/streaming.md, 'Deferred rejection'): the B rows are one cache; a NaN or Inf in any sequence's chunk
rolls the whole batch back to before that chunk and raises (the per-sequence class rolls back that sequence only).
Attention results are those of the tolerance tier: the rows' splits differ from a sequence's own cache's, so
outputs can differ from a single-sequence run in the last bits (BatchVeloxKVCache's match it bit for bit).
"""
from __future__ import annotations

import json
import math

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

from .. import tuning
from .base import VeloxKVCache
from .batch import BatchVeloxKVCache, _same_config
from .classes import cache_class
from .left_padded import LeftPadded
from .masks import _MASKS, _MASKS_KEPT, remember_mask
from . import ragged
from .restack import empty_like, layout, part_of, restack, rolled, stack, stream_split
from .rotating import VeloxRotatingKVCache
from ..ops.attention import RowStarts

_POSITIONAL = ("kivi",)    # methods whose bytes depend on a token's position (KIVI's key groups)


def alignment(key_params, value_params) -> int:
    """The tokens a row's left padding must be a multiple of: KIVI's G in a role that is KIVI (both roles: their
    least common multiple; its groups and its window's flushes count from the sequence's first token), else 1."""
    return math.lcm(*(p.group_size for p in (key_params, value_params) if p.method in _POSITIONAL))


def eligible(caches) -> bool:
    """Whether `caches` (single-sequence caches of one layer) can share one B-row cache: VeloxKVCaches of one class
    and configuration (sliding-window caches: one max_size, per-token methods, R = 0), an exact window R only without
    exact-trim copies (a per-sequence tail), every cache's window where a left-padded layout puts it (`layout`: not
    after a trim that left one cache's window short of the others'), and with KIVI in a role (no exact-trim copies)
    every sequence's left padding a whole number of its groups (`alignment`: lengths equal mod G, then each row's
    groups and flushes are the stream's)."""
    if not tuning.current().shared or not caches:
        return False
    c0 = caches[0]
    if not isinstance(c0, VeloxKVCache):
        return False
    if any(type(c) is not type(c0) or not _same_config(c, c0) for c in caches):
        return False
    roles = (c0.key_params, c0.value_params)
    if any((p.window or p.method in _POSITIONAL) and p.kept_capacity() for p in roles):
        return False
    if isinstance(c0, VeloxRotatingKVCache):     # one max_size; no exact window (its eviction would split it)
        return (all(c.max_size == c0.max_size for c in caches)
                and not any(p.window or p.method in _POSITIONAL for p in roles))
    top = max(c.offset for c in caches)
    if any((top - c.offset) % alignment(*roles) for c in caches):       # (tuning's ragged: cache/ragged.py)
        return tuning.current().ragged and ragged.fits(caches, [top - c.offset for c in caches], top)
    if not any(p.window or p.method in _POSITIONAL for p in roles):
        return True
    for c in caches:
        c._flush_step()              # a chunk a decode step left pending is among the stream's tokens
    try:
        for role in ("_k", "_v"):
            layout([(top - c.offset, *stream_split(getattr(c, role))) for c in caches])
    except ValueError:
        return False
    return True


def _stacked(caches, lp, idx: int, like):
    """restack.stack, or the ragged layout (cache/ragged.py) where KIVI rows are not whole groups apart."""
    if any(x % alignment(like.key_params, like.value_params) for x in lp) and not isinstance(like,
                                                                                           VeloxRotatingKVCache):
        return ragged.stack(caches, lp, idx, like), None
    return stack(caches, lp, idx, like)


class SharedBatchVeloxKVCache(LeftPadded):
    """A left-padded batch of sequences in one B-row VeloxKVCache behind mlx-lm's BatchKVCache protocol (see the
    module). `inner.offset` is the batch's position count (mlx-lm's `_idx`).

    With an exact window (R > 0) a right-padded prefill (prepare(right_padding=...) .. finalize) runs through a
    per-sequence BatchVeloxKVCache (`_seq`): in one left-padded stream the flush of a row's last tokens would not
    wait for its right padding (they would be encoded where its own cache keeps them exact), and finalize could
    not roll tokens across the window's edge without encoding them. finalize restacks the sequences' caches into
    one B-row cache again; decode steps always run on the B-row cache.

    A sliding-window inner cache (VeloxRotatingKVCache, per-token methods, R = 0) holds the newest tokens only:
    every row's held tokens end at its stream's end, the stream evicts them for all rows at once (so each row holds
    what its own cache holds: min(T_i, max_size - 1) old tokens before an update), `make_mask` gives each row's
    start in the held tokens, and its right-padded prefill runs per sequence as a window's does (in one stream the
    eviction would drop a row's tokens before its right padding)."""

    def __init__(self, inner, left_padding: list[int], batch: int, held: list | None = None):
        self.inner = inner
        self._lp = [int(x) for x in left_padding]
        self._b = int(batch)
        self._right = None        # right padding to roll into the left padding at finalize
        self._seq = None          # the per-sequence cache of a windowed right-padded prefill (see the class)
        # sliding window: each row's held tokens where they differ (after merge, extend, finalize; None after an
        # update, which evicts them all to one length: min(T_i, tokens held) each)
        self._held = None if held is None else [int(h) for h in held]
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
        inner, held = _stacked(caches, lp, top, caches[0])
        return cls(inner, lp, len(caches), held)

    @property
    def _idx(self) -> int:
        return self._seq._idx if self._seq is not None else self.inner.offset

    @property
    def offset(self) -> mx.array:
        return self._seq.offset if self._seq is not None else LeftPadded.offset.fget(self)

    @property
    def left_padding(self) -> mx.array:
        return self._seq.left_padding if self._seq is not None else LeftPadded.left_padding.fget(self)

    def _per_sequence_prefill(self) -> bool:
        """Whether a right-padded prefill runs per sequence (see the class): an exact window, a sliding window, KIVI
        (also a left-padded one: the padding need not be whole groups)."""
        return bool(self.inner.key_params.window or self.inner.value_params.window
                    or isinstance(self.inner, VeloxRotatingKVCache) or self._align > 1)

    @property
    def _align(self) -> int:
        return alignment(self.inner.key_params, self.inner.value_params)

    def _prefilling(self) -> bool:
        """Whether a prefill runs per sequence now (between prepare and finalize, or a left padding not consumed)."""
        return self._seq is not None and any(getattr(self._seq, n) is not None for n in ("_skip", "_remaining",
                                                                                           "_right"))

    def per_sequence(self) -> BatchVeloxKVCache:
        """The batch as a BatchVeloxKVCache (each sequence's own cache: the same bytes)."""
        if self._seq is not None:
            return self._seq
        return BatchVeloxKVCache([self.extract(i) for i in range(self._b)], self._lp, self._idx)

    def _rotating(self) -> bool:
        return isinstance(self.inner, VeloxRotatingKVCache)

    def _stream_tokens(self) -> int:
        self.inner._flush_step()
        return 0 if self.inner._k is None else self.inner._k.tokens

    def _rows_held(self) -> list[int]:
        """Each row's tokens in the stream (its newest, ending at the stream's end)."""
        if self._held is not None:
            return list(self._held)
        top = self._stream_tokens()
        return [max(min(self._idx - x, top), 0) for x in self._lp]    # (0: left padding still to come)

    def _changed(self) -> None:
        self._offset = self._starts = None

    def _unragged(self) -> None:
        """A ragged inner cache (cache/ragged.py) goes per sequence for filter, extend, trim (restacked after)."""
        if self._seq is None and ragged.is_ragged(self.inner):
            self._seq, self.inner = self.per_sequence(), empty_like(self.inner)

    def filter(self, batch_indices) -> None:
        keep = batch_indices.tolist() if isinstance(batch_indices, mx.array) else [int(i) for i in batch_indices]
        self._unragged()
        if self._seq is not None:
            self._seq.filter(keep)
            self._b = len(keep)
            if not self._prefilling():       # (KIVI: the rows kept may be whole groups apart now)
                self._end_per_sequence()
            self._changed()
            return
        lp = [self._lp[i] for i in keep]
        shift = min(lp) if lp and self._right is None else 0     # as BatchKVCache: drop padding every row has
        shift -= shift % self._align                              # (KIVI: whole groups)
        if self.inner.empty():
            self.inner = empty_like(self.inner)
            shift = 0
            self._held = None
        elif self._rotating():
            held = self._rows_held()
            held = [held[i] for i in keep]
            first = self._stream_tokens() - max(held, default=0)      # stream tokens no kept row holds
            self.inner = restack([part_of(self.inner, 0, keep, first)], self.inner, offset=self._idx - shift)
            self._held = held
        else:
            self.inner = restack([part_of(self.inner, 0, keep, shift)], self.inner)
        self._lp = [x - shift for x in lp]
        if self._right is not None:
            self._right = [self._right[i] for i in keep]
        self._b = len(keep)
        self._changed()

    def extend(self, other) -> None:
        """Joins `other`'s sequences (a SharedBatchVeloxKVCache, or a BatchVeloxKVCache: KIVI's batches whose rows
        are not whole groups apart); where the rows of both cannot be one B-row cache (`alignment`), the batch goes
        on per sequence (a BatchVeloxKVCache inside, `_seq`) until a filter leaves rows that can."""
        if not isinstance(other, (SharedBatchVeloxKVCache, BatchVeloxKVCache)):
            raise ValueError(f"other: expected a SharedBatchVeloxKVCache, got {type(other).__name__}")
        ref = other.inner if isinstance(other, SharedBatchVeloxKVCache) else (other.caches or [self.inner])[0]
        if type(ref) is not type(self.inner) or not _same_config(self.inner, ref):
            raise ValueError("other: its caches have other parameters than this batch's")
        if any(getattr(c, n, None) is not None for c in (self, other, self._seq, getattr(other, "_seq", None))
               for n in ("_right", "_skip", "_remaining")):
            raise ValueError("other: cannot extend between prepare and finalize")
        self._unragged()
        top = max(self._idx, other._idx)
        shifts = (top - self._idx, top - other._idx)
        if (self._seq is not None or not isinstance(other, SharedBatchVeloxKVCache) or other._seq is not None
                or shifts[0] % self._align or shifts[1] % self._align):
            seq = self.per_sequence()
            seq.extend(other.per_sequence() if isinstance(other, SharedBatchVeloxKVCache) else other)
            self._seq, self.inner, self._b, self._held = seq, empty_like(self.inner), len(seq.caches), None
            self._end_per_sequence()
            self._changed()
            return
        held = None
        if self._rotating():       # stream tokens: both batches' held tokens end at the stream's end
            ends = (self._stream_tokens(), other._stream_tokens())
            pads = (max(ends) - ends[0], max(ends) - ends[1])
            held = self._rows_held() + other._rows_held()
        else:
            pads = shifts
        parts = [part_of(c.inner, pad, nrows=c._b) for c, pad in zip((self, other), pads)]
        self.inner = restack(parts, self.inner, offset=top)
        self._held = held
        self._lp = [x + shifts[0] for x in self._lp] + [x + shifts[1] for x in other._lp]
        self._b += other._b
        self._changed()

    def extract(self, idx: int):
        """Sequence idx as its own single-sequence cache (its rows' bytes, the padding left out)."""
        if self._seq is not None:
            return self._seq.extract(idx)
        if self.inner.empty():
            return empty_like(self.inner)
        if ragged.is_ragged(self.inner):
            return ragged.extract(self.inner, idx, self._lp)
        first = self._stream_tokens() - self._rows_held()[idx]     # its left padding (sliding window: held tokens)
        return restack([part_of(self.inner, 0, [idx], first)], self.inner, offset=self._idx - self._lp[idx])

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        if self._prefilling():
            raise ValueError("right_padding: a right-padded prefill is under way (finalize first)")
        if self._seq is not None:        # a batch going on per sequence (extend)
            self._seq.prepare(left_padding=left_padding, lengths=lengths, right_padding=right_padding)
            self._changed()
            return
        right = right_padding is not None and max(right_padding) > 0
        # (a sliding window's left-padded chunk too: its band and the padding rows' starts are no RowStarts, and an
        # array mask leaves the padding queries nothing to attend: NaN in the next layer's keys; KIVI's: whole groups)
        if self._per_sequence_prefill() and (right or (left_padding is not None
                                                       and (self._rotating() or self._align > 1))):
            seq = BatchVeloxKVCache([self.extract(i) for i in range(self._b)], self._lp, self._idx)
            seq.prepare(left_padding=left_padding, lengths=lengths, right_padding=right_padding)   # (checks them)
            self._seq, self.inner = seq, empty_like(self.inner)
            self._changed()
            return
        if left_padding is not None:
            if not self.inner.empty():
                raise ValueError("left_padding: can only be added to an empty batch cache")
            self._lp = [x + int(p) for x, p in zip(self._lp, left_padding)]
        if right:
            self._right = [int(x) for x in right_padding]
        self._changed()

    def finalize(self) -> None:
        if self._seq is not None:
            self._end_per_sequence()
            return
        if self._right is not None and max(self._right) > 0 and not self.inner.empty():
            self.inner = rolled(self.inner, self._right)
            self._lp = [x + r for x, r in zip(self._lp, self._right)]
        self._right = None
        self._changed()

    def _end_per_sequence(self) -> None:
        """The per-sequence prefill's caches back into one B-row cache (finalize; the chunk that ends a left-padded
        prefill; extend and filter of a batch going on per sequence) where they fit one (KIVI: rows whole groups
        apart; a window's layout), else the batch goes on per sequence."""
        seq = self._seq
        seq.finalize()
        self._lp = list(seq._lp)
        self._changed()
        if any(x % self._align for x in self._lp) and not (tuning.current().ragged and not self._rotating()
                                                            and ragged.fits(seq.caches, self._lp, seq._idx)):
            return
        try:
            self.inner, self._held = _stacked(seq.caches, self._lp, seq._idx, self.inner)
        except ValueError:          # (a window trimmed short in some of them: restack's layout)
            return
        self._seq = None

    # ---- protocol: the model's calls ----------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if keys.ndim != 4 or keys.shape[0] != self._b:
            raise ValueError(f"keys: expected (B = {self._b}, H, t, d), got {keys.shape}")
        if self._seq is not None:
            was = self._prefilling()
            out = self._seq.update_and_fetch(keys, values)
            if was and not self._prefilling():      # a left padding consumed
                self._end_per_sequence()
            return out
        self._offset = None         # (also if the inner cache rolls back a bad chunk and raises)
        self._held = None           # a sliding window's eviction: every row holds min(T_i, tokens held)
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
        if self._seq is not None:
            return self._seq.make_mask(N, return_array, window_size, **kwargs)
        if self._rotating():
            return self._rotating_mask(N, return_array, window_size)
        # the left padding as the rows' starts array, made once per layout (left_padding makes a new array per call)
        mask = create_causal_mask(N, offset=self._idx, left_padding=self.starts, window_size=window_size)
        if window_size is None:
            remember_mask(_MASKS, mask, (mask, RowStarts(self.starts, N > 1, mask, tuple(self._lp))), _MASKS_KEPT)
        return mask

    def _rotating_mask(self, N: int, return_array: bool, window_size):
        """A sliding-window inner cache's VeloxRotatingKVCache.make_mask, per row: the next update attends over the
        tokens held after its eviction (each row's newest min(T_i, held) of them) and the N new ones; a row holding
        fewer starts later, and a row whose left padding the chunk still holds (a left-padded prefill) after it.
        Remembered as the rows' starts where no query's band reaches below them."""
        old = self.inner._held_after_eviction()
        window_size = window_size or self.inner.max_size
        host = tuple(old - min(h, old) + min(max(lp - self._idx, 0), N) for h, lp in zip(self._rows_held(), self._lp))
        if N == 1 and not any(host) and old + 1 <= window_size and not return_array:
            return None       # as the single cache's: every row attends over all it holds
        starts = mx.array(host, dtype=mx.int32)
        mask = create_causal_mask(N, offset=old, left_padding=starts, window_size=window_size)
        if old + N <= window_size:
            remember_mask(_MASKS, mask, (mask, RowStarts(starts, N > 1, mask, host)), _MASKS_KEPT)
        return mask

    # ---- sizes, checks, trim, state -----------------------------------------------------------------
    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self._seq.empty() if self._seq is not None else self.inner.empty()

    def check(self) -> None:
        self._offset = None         # a rollback changes the position count
        for c in self._seq.caches if self._seq is not None else (self.inner,):
            c.check()

    @property
    def nbytes(self) -> int:
        return self._seq.nbytes if self._seq is not None else self.inner.nbytes

    @property
    def nbytes_parts(self) -> dict:
        return self.per_sequence().nbytes_parts if self._seq is not None or ragged.is_ragged(self.inner) \
            else self.inner.nbytes_parts

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        if self._prefilling():
            raise ValueError("n: cannot trim between prepare and finalize")
        if ragged.is_ragged(self.inner):
            self._unragged()
            n = self._seq.trim(n)
            self._end_per_sequence()
            return n
        if self._seq is not None:
            return self._seq.trim(n)
        n = self.inner.trim(min(self._idx, n))
        self._held = None           # (a sliding window trims only before it evicted: each row holds its T_i)
        self._changed()
        return n

    @property
    def state(self):
        """(inner state, meta JSON); during a windowed right-padded prefill (mlx-lm evaluates `state` after each
        prefill chunk) the per-sequence cache's, which the setter restacks."""
        if self._seq is not None or ragged.is_ragged(self.inner):    # (ragged rows: saved per sequence too)
            return self.per_sequence().state
        meta = {"left_padding": self._lp, "batch": self._b, "class": type(self.inner).__name__, "held": self._held}
        return self.inner.state, json.dumps(meta)

    @state.setter
    def state(self, v):
        inner_state, meta = v
        meta = json.loads(meta)
        if "classes" in meta:       # a per-sequence prefill's state (see the getter)
            seq = BatchVeloxKVCache.__new__(BatchVeloxKVCache)
            seq.state = v
            self.__init__(empty_like(seq.caches[0]), seq._lp, len(seq.caches))
            self._seq = seq
            if not self._prefilling():
                self._end_per_sequence()
            return
        self.__init__(cache_class(meta["class"]).from_state(inner_state), meta["left_padding"], meta["batch"],
                      meta.get("held"))

    def __repr__(self) -> str:
        return f"SharedBatchVeloxKVCache(B={self._b}, idx={self._idx}, left_padding={self._lp}, inner={self.inner!r})"


__all__ = ["SharedBatchVeloxKVCache", "eligible"]
