"""Ragged KIVI rows in one B-row stream (accelerated/cache/batch_shared.py: a left-padded batch whose rows' left
padding is not a whole number of KIVI groups; issue 29, item 3). Each row keeps its own group phase: the bytes of
row i are those of its own single-sequence cache, its groups and its window's flushes counting from its first token.

Layout (one role, B rows, positions 0 .. idx - 1 of the batch, row i's first token at its left padding p_i):
- the row's phase f_i = p_i mod g (g = G for KIVI, 1 for a per-token method: then every row's phase is 0) and its
  encoded boundary b_i = max(0, f_i + g * floor((idx - R - f_i) / g)): a function of the phase alone (rows of one
  phase flush together). Where the row holds at least R tokens b_i = p_i + Q_i (Q_i its own cache's encoded count),
  else b_i <= p_i (all its tokens are in its window, as in its own cache);
- per-token fields (codes; KIVI values' scale and zero) at the row's positions: row i's encoded tokens are rows
  p_i .. b_i - 1; group fields (KIVI keys' scale and zero) at group row j covering positions f_i + jG ..
  f_i + jG + G - 1: row i's groups are rows (p_i - f_i) / G .. (b_i - f_i) / G - 1;
- one window array of positions lo .. idx - 1, lo = min b_i: row i's window is its positions max(b_i, p_i) ..
  idx - 1 (in a row that flushed past lo, its window slots below b_i are stale copies, never read).
The boundaries differ by less than g between rows, so the window holds at most R + G - 1 tokens, as a single
cache's does. The host knows every row's padding and the step count: which rows flush at a step needs no sync.
A step's flushing rows (one phase) all encode the same positions b_i .. b'_i - 1 into the same group row.

`RaggedStream` stores the layout; its appends run the general path (the method's encode_chunk per flushing phase,
new arrays per flush) or, for KIVI in both roles (and turboquant keys with R = 0 beside KIVI values with R > 0), the
in-place step of cache/ragged_step.py (in_place.append_in_place
hands a ragged pair to it: buffers with room, one launch per step, the decode step's append inside the attention's
partial launch), and its record
(ops.attention.RaggedRecord) goes to the kernels' ragged partial (VQ_RAGGED: the scalar loop reads each row up to
its own boundary, its key groups at its phase) where they take it, else to the ops path over every row's own tokens
decoded (`dequantized`). docs/ragged-kivi.md has the rest of the kernel plan. Checks are those of a stream: deferred
inside VeloxKVCache's update (marks restore the state).
"""
from __future__ import annotations

import copy
import dataclasses
import json

import mlx.core as mx

from ... import spec
from .. import layouts
from ..ops import numerics, record
from ..ops.attention import RaggedRecord
from ..stream import Stream
from . import ragged_step
from .restack import empty_like, stream_split


def unit(p) -> int:
    """Tokens per flush unit of a role: G for KIVI (either role: its window flushes whole groups), else 1."""
    return 1 if layouts.of(p).per_token else p.group_size


def phases(pads, p) -> list[int]:
    g = unit(p)
    return [x % g for x in pads]


def boundary(pad: int, idx: int, p) -> int:
    """Row's encoded boundary b_i at idx positions (see the module)."""
    g = unit(p)
    f = pad % g
    return max(0, f + g * ((idx - p.window - f) // g))


def _grouped(p) -> frozenset:
    return layouts.of(p).group_rows(p.role)


@dataclasses.dataclass(frozen=True)
class _Pending:
    stream: "RaggedStream"
    version: int
    dtype: str
    bhd: tuple
    writes: tuple            # (rows, first position, last position + 1, phase, fields) per flushing phase
    window: mx.array         # positions lo .. idx + t - 1 before the flush


class RaggedStream(Stream):
    """One role of a ragged B-row batch (see the module): `pads` each row's left padding, `tokens` the batch's
    positions. Trim, record and state are per row only (`row`); the batch cache goes per sequence for them."""

    ragged = True

    def __init__(self, params, pads, dtype=None, use_kernels="auto"):
        super().__init__(params, dtype, use_kernels)
        self._pads = [int(x) for x in pads]
        self._idx = 0
        self._f: dict[str, mx.array] = {}       # fields from position 0 (group fields: from group row 0)
        self._lo = 0                             # the window's first position
        self._window = None
        self._phases = None                      # (B,) int32 on the device, once (RaggedRecord.phases)

    # -- layout ------------------------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        return self._idx

    def bounds(self, idx: int | None = None) -> list[int]:
        idx = self._idx if idx is None else idx
        return [boundary(x, idx, self.params) for x in self._pads]

    def _rows_of(self, name: str, lo: int, hi: int, f: int) -> tuple[int, int]:
        """Field rows of positions lo .. hi - 1 of a row of phase f."""
        if name in _grouped(self.params):
            g = self.params.group_size
            return (lo - f) // g, (hi - f) // g
        return lo, hi

    # -- build from single-sequence streams, and back -------------------------------------------------
    @classmethod
    def stacked(cls, streams, pads, idx: int, params) -> "RaggedStream":
        """The rows of single-sequence streams (Stream or None: no token yet) at left paddings `pads`."""
        s = cls(params, pads)
        s._idx = int(idx)
        live = [x for x in streams if x is not None and x._bhd is not None]
        if not live:
            return s
        s._dtype, s._bhd = live[0]._dtype, (len(pads), *live[0]._bhd[1:])
        b, h, d = s._bhd
        bnd = s.bounds()
        s._lo = min(bnd)
        recs = [x.record() if x is not None and x._bhd is not None else None for x in streams]
        ref = next(r for r in recs if r)
        wins = []
        for i, (r, pad, bi) in enumerate(zip(recs, pads, bnd)):
            start = max(bi, pad)
            w = r["window"] if r else ref["window"][:, :, :0]
            if start + w.shape[2] != idx:
                raise ValueError(f"streams: row {i}'s window does not end its {idx - pad} tokens at the batch's end")
            wins.append(mx.pad(w, [(0, 0), (0, 0), (start - s._lo, 0), (0, 0)]))
        s._window = mx.concatenate(wins, axis=0)
        f = phases(pads, s.params)
        for name, a in ref.items():
            if name == "window":
                continue
            top = max(s._rows_of(name, 0, bi, fi)[1] for bi, fi in zip(bnd, f))
            rows = []
            for r, pad, bi, fi in zip(recs, pads, bnd, f):
                a0 = r[name] if r else a[:, :, :0]
                r0 = s._rows_of(name, pad, pad, fi)[0] if bi > pad else 0
                if a0.shape[2] and r0 + a0.shape[2] != s._rows_of(name, 0, bi, fi)[1]:
                    raise ValueError(f"streams: {name} rows do not end at the row's boundary")
                rows.append(mx.pad(a0, [(0, 0), (0, 0), (r0, top - r0 - a0.shape[2])] + [(0, 0)] * (a0.ndim - 3)))
            s._f[name] = mx.concatenate(rows, axis=0)
        return s

    def row(self, i: int) -> dict:
        """Row i's record: the bytes its own cache holds ({} before the first append)."""
        if self._bhd is None:
            return {}
        self.sync()
        pad, f, bi = self._pads[i], phases(self._pads, self.params)[i], self.bounds()[i]
        out = {}
        for name in record.field_names(self.params):
            if name == "window":
                out[name] = self._window[i:i + 1, :, max(bi, pad) - self._lo:]
            else:
                lo, hi = self._rows_of(name, pad, max(bi, pad), f)
                if name not in self._f:      # (nothing encoded in any row yet)
                    shape = record.expected_shapes(self.params, 1, self._bhd[1], 0, self._bhd[2], 0)[name]
                    kind = dict((n, k) for n, k, _ in record.layout(self.params))[name]
                    out[name] = mx.zeros(shape, dtype=record.FIELD_DTYPES[kind])
                    continue
                out[name] = self._f[name][i:i + 1, :, lo:hi]
        return out

    # -- append --------------------------------------------------------------------------------------
    def prepare(self, x: mx.array) -> _Pending:
        p = self.params
        numerics.check_x(x, p, finite=False)
        name = numerics.dtype_name(x.dtype)
        if self._dtype is not None and name != self._dtype:
            raise ValueError(f"x: dtype {name} differs from the stream's {self._dtype}")
        b, h, t, d = x.shape
        if b != len(self._pads) or (self._bhd is not None and (b, h, d) != self._bhd):
            raise ValueError(f"x: shape {tuple(x.shape)} does not continue (B, H, d) = {self._bhd or b}")
        self.sync()         # (rows an in-place step stored: read by the ops below)
        numerics.fault_nonfinite(x, numerics.NONFINITE)
        win = x if self._window is None or not self._window.shape[2] else mx.concatenate([self._window, x], axis=2)
        old, new = self.bounds(), self.bounds(self._idx + t)
        writes = {}
        for i, (f, b0, b1) in enumerate(zip(phases(self._pads, p), old, new)):
            a = max(b0, f)
            if b1 > a:
                writes.setdefault((a, b1, f), []).append(i)
        out = []
        for (a, c, f), rows in writes.items():
            sub = win[mx.array(rows, dtype=mx.int32), :, a - self._lo:c - self._lo]
            fields = record.encode_chunk(self._method, sub, p, c - a, c - a, sub.dtype)
            if not numerics.deferring():
                mx.eval(*fields.values())
            out.append((rows, a, c, f, fields))
        return _Pending(self, self._version, name, (b, h, d), tuple(out), win)

    def commit(self, pending: _Pending, writes: list | None = None) -> None:
        """Apply a `prepare` result. With `writes` (a list: a GPU's general path, cache/base.py), rows that fit in a
        field's array are not stored here: their (destination view, source) pairs go to `writes` for the caller's
        commit launch (kernels/commit.py, in place: no copy of the field), and a field that grows gets room for
        ragged_step.ROOM more positions; without, new arrays (the CPU)."""
        if pending.stream is not self or pending.version != self._version:
            raise ValueError("pending: prepared for another stream or an earlier state")
        self._dtype, self._bhd = pending.dtype, pending.bhd
        idx = self._idx + pending.window.shape[2] - (0 if self._window is None else self._window.shape[2])
        new = self.bounds(idx)
        fph = phases(self._pads, self.params)
        f = dict(self._f)
        for rows, a, c, ph, fields in pending.writes:
            for name, enc in fields.items():
                lo, hi = self._rows_of(name, a, c, ph)
                top = max(self._rows_of(name, 0, bi, fi)[1] for bi, fi in zip(new, fph))
                cur = f.get(name)
                n = 0 if cur is None else cur.shape[2]
                if writes is not None and n >= top:     # (rows past every mark's and view's: in place)
                    writes += _row_writes(cur, rows, lo, hi, enc)
                    continue
                if writes is not None:
                    top = max(top, ragged_step.need(self, name, idx + ragged_step.ROOM))
                grown = mx.zeros((len(self._pads), *enc.shape[1:2], max(top, n), *enc.shape[3:]), dtype=enc.dtype)
                if n:
                    grown[:, :, :n] = cur
                grown[mx.array(rows, dtype=mx.int32), :, lo:hi] = enc
                f[name] = grown
        lo = min(new)
        self._f, self._window = f, pending.window[:, :, lo - self._lo:]
        self._lo, self._idx = lo, idx
        self._version += 1

    # -- rollback ------------------------------------------------------------------------------------
    def mark(self) -> tuple:
        """(in-place steps write only past a mark's rows, so the buffers it names still hold its state)"""
        return (self._epoch, self._version, self._idx, dict(self._f), self._lo, self._window, self._dtype,
                self._bhd, self._wbuf, self._wflat, self._ws, self._wview)

    def restore(self, mark: tuple) -> None:
        (epoch, _, self._idx, f, self._lo, self._window, self._dtype, self._bhd, self._wbuf, self._wflat, self._ws,
         self._wview) = mark
        if epoch != self._epoch:
            raise ValueError("mark: taken before a trim; it can no longer be restored")
        self._f = dict(f)
        self._version += 1

    def trim(self, n: int) -> int:
        raise ValueError("n: a ragged B-row stream trims per sequence (the batch cache goes per sequence first)")

    def __deepcopy__(self, memo) -> "RaggedStream":
        """An independent copy: its own fields and window (in-place steps write the buffers)."""
        self.sync()
        new = copy.copy(self)
        new._pads, new._token = list(self._pads), None
        new._f = {n: mx.array(a) + mx.zeros((), dtype=a.dtype) for n, a in self._f.items()}
        new._window = None if self._window is None else self._window + mx.zeros((), dtype=self._window.dtype)
        new._wbuf = new._wflat = new._wview = None
        mx.eval(*new._f.values(), *([] if new._window is None else [new._window]))
        memo[id(self)] = new
        return new

    # -- views ---------------------------------------------------------------------------------------
    def dequantized(self) -> mx.array:
        """float32 (B, H, T, d): each row's encoded tokens decoded, its window upcast (padding positions:
        whatever the rows hold there; attention never reads them)."""
        if self._bhd is None:
            raise ValueError("stream: no tokens appended yet")
        self.sync()
        p, (b, h, d) = self.params, self._bhd
        bnd, fph = self.bounds(), phases(self._pads, p)
        top = max(bnd)
        dec = mx.zeros((b, h, top, d), dtype=mx.float32)
        for f in sorted(set(fph)):
            rows = [i for i, x in enumerate(fph) if x == f]
            bi = bnd[rows[0]]            # (one per phase)
            if bi <= f:
                continue
            ix = mx.array(rows, dtype=mx.int32)
            fields = {}
            for name, a in self._f.items():
                r0, r1 = self._rows_of(name, f, bi, f)
                fields[name] = a[ix, :, r0:r1]
            dec[ix, :, f:bi] = self._method.decode_tokens(fields, p, d).astype(mx.float32)
        win = numerics.upcast(self._window)
        pos = mx.arange(self._lo, min(top, self._idx))
        over = pos[None, :] < mx.array(bnd, dtype=mx.int32)[:, None]                       # encoded in that row
        mid = mx.where(over[:, None, :, None], dec[:, :, self._lo:top], win[:, :, :top - self._lo])
        parts = [dec[:, :, :self._lo], mid, win[:, :, top - self._lo:]]
        return mx.concatenate([a for a in parts if a.shape[2]], axis=2)

    def packed(self) -> RaggedRecord:
        """What attention reads: the fields and window as stored, each row's phase, and `decoded` (every token
        decoded, for the ops path: accelerated/attention.py)."""
        if self._bhd is None:
            raise ValueError("stream: no tokens appended yet")
        return RaggedRecord(self.params, dict(self._f), self._window, self._lo, self._method.decode_tokens,
                            self._token, self.phase_array(), self.dequantized)

    def phase_array(self) -> mx.array:
        """Each row's group phase, (B,) int32 on the device (made once)."""
        if self._phases is None:
            self._phases = mx.array(phases(self._pads, self.params), dtype=mx.int32)
            mx.eval(self._phases)
        return self._phases

    def append_in_place(self, v: "RaggedStream", keys: mx.array, values: mx.array, after, plan=None):
        """in_place.append_in_place for this stream (keys) and `v` (values): cache/ragged_step.py."""
        return ragged_step.append_in_place(self, v, keys, values, after, plan)

    def record(self) -> dict:
        raise ValueError("stream: a ragged B-row stream has no one record (its rows: `row`)")

    def state(self) -> tuple[dict, dict]:
        """({}, the metadata a Stream's state has): the rows' records are `row`'s (the batch cache saves per
        sequence)."""
        meta = dict(self.params.to_dict())
        meta.update(tokens=self.tokens, spec_version=spec.SPEC_VERSION)
        if self._dtype is not None:
            meta["dtype"] = self._dtype
        return {}, meta

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._f.values()) + (0 if self._window is None else self._window.nbytes)


def _row_writes(buf: mx.array, rows: list, lo: int, hi: int, enc: mx.array) -> list:
    """(destination view, source) pairs storing enc (one row per entry of `rows`) into rows lo .. hi - 1 of those
    batch rows of buf: one pair per run of consecutive batch rows."""
    out, j = [], 0
    while j < len(rows):
        k = j
        while k + 1 < len(rows) and rows[k + 1] == rows[k] + 1:
            k += 1
        out.append((buf[rows[j]:rows[k] + 1, :, lo:hi], enc[j:k + 1]))
        j = k + 1
    return out


# ---- the batch cache's inner VeloxKVCache over ragged streams (accelerated/cache/batch_shared.py) ----------
def is_ragged(cache) -> bool:
    return isinstance(getattr(cache, "_k", None), RaggedStream)


def fits(caches, pads, idx: int) -> bool:
    """Whether single-sequence caches (their tokens ending at idx behind left paddings `pads`) hold the split a
    ragged stream gives each row: its own cache's encoded prefix and window (not after a trim that left a window
    short, nor with exact-trim copies)."""
    for c in caches:
        c._flush_step()
    for c, pad in zip(caches, pads):
        for s, p in ((c._k, c.key_params), (c._v, c.value_params)):
            if p.kept_capacity():
                return False
            q, w = stream_split(s)
            if q + w != idx - pad or (q + w and w != idx - max(boundary(pad, idx, p), pad)):
                return False
    return True


def stack(caches, pads, idx: int, like):
    """A VeloxKVCache of like's class whose streams hold the caches' rows as ragged streams."""
    inner = empty_like(like)
    if not any(c._k is not None for c in caches):
        return inner
    for c in caches:
        c._flush_step()
    inner._k = RaggedStream.stacked([c._k for c in caches], pads, idx, like.key_params)
    inner._v = RaggedStream.stacked([c._v for c in caches], pads, idx, like.value_params)
    inner.offset = int(idx)
    return inner


def extract(inner, i: int, pads):
    """Row i of a ragged inner cache as its own single-sequence cache (its record's bytes)."""
    meta = json.loads(inner.meta_state)
    t = inner.offset - pads[i]
    meta["offset"] = t
    meta["k"]["tokens"] = meta["v"]["tokens"] = t
    return type(inner).from_state((inner._k.row(i), inner._v.row(i), json.dumps(meta)))


__all__ = ["RaggedStream", "boundary", "phases", "unit", "is_ragged", "fits", "stack", "extract"]
