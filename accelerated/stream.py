"""Streaming state of one stream (one layer, one role, all heads) on mx arrays (spec/streaming.md).

Chunks of any size arrive along T; the state after T tokens is the record that one-shot encode of those
T tokens produces (until a lossy KIVI trim). Encoded fields live in buffers that grow along the token
axis in steps of 256 rows (like mlx-lm's KVCache), so per-token appends do not copy the whole prefix.
Every check (x, dtype, shape; norm overflow and KIVI float16 overflow of the tokens this append encodes)
runs before any state changes. Beside the record, the newest flushed tokens are kept exactly (spec
`exact_trim`, streaming.md "Exact trims") so that a trim of up to E tokens restores the state exactly.

`use_kernels` ("auto" | True | False) picks accelerated.kernels' fused kernels for the per-token math of the
methods that have them ("auto": whenever the kernels can run, i.e. on a GPU); both paths store the same bytes.
"""
from __future__ import annotations

import copy
import dataclasses

import mlx.core as mx

from .. import spec
from . import kernels, layouts, ops
from .ops import numerics, record
from .ops.attention import PackedRecord, Views



class _Rows:
    """An array growing along axis 2, preallocated in steps; rows lo..n-1 are valid (rows before `lo` were
    evicted by a sliding-window cache, `Stream.evict`)."""

    step = 256

    def __init__(self, arr: mx.array | None = None):
        self.buf = arr
        self.n = 0 if arr is None else arr.shape[2]
        self.lo = 0

    def extend(self, a: mx.array) -> None:
        k = a.shape[2]
        if k == 0 and self.buf is not None:
            return
        if self.buf is None or self.n + k > self.buf.shape[2]:
            new = self._alloc(a, self.n + k)
            if self.n:
                new[:, :, : self.n] = self.buf[:, :, : self.n]
            self.buf = new
        if k:
            self.buf[:, :, self.n : self.n + k] = a
        self.n += k

    def reserve(self, a: mx.array) -> list[tuple[mx.array, mx.array]]:
        """`extend` for a caller that stores the rows itself (accelerated.kernels.commit): grows the
        buffer if needed and returns the (destination view, source) pairs to copy (old rows into a grown
        buffer, then `a`); the row count counts them already."""
        k = a.shape[2]
        writes = []
        if self.buf is None or self.n + k > self.buf.shape[2]:
            new = self._alloc(a, self.n + k)
            if self.n:
                writes.append((new[:, :, : self.n], self.buf[:, :, : self.n]))
            self.buf = new
        if k:
            writes.append((self.buf[:, :, self.n : self.n + k], a))
        self.n += k
        return writes

    def compact(self, room: int = 0) -> None:
        """Drop the evicted rows (a copy of the valid ones); `room`: rows the new buffer leaves space for past them
        (rounded up to whole steps, as a growth would be)."""
        live = self.n - self.lo
        if room:
            new = self._alloc(self.buf, live + room + 1)
            new[:, :, :live] = self.buf[:, :, self.lo : self.n]
        else:
            new = mx.contiguous(self.buf[:, :, self.lo : self.n])
        self.buf, self.n, self.lo = new, live, 0

    def view(self, lo: int = 0, hi: int | None = None) -> mx.array:
        return self.buf[:, :, self.lo + lo : self.n if hi is None else self.lo + hi]

    def _alloc(self, like: mx.array, rows: int) -> mx.array:
        """A zero buffer shaped as `like` holding at least `rows` rows, in whole steps."""
        cap = -(-rows // self.step) * self.step
        return mx.zeros((*like.shape[:2], cap, *like.shape[3:]), dtype=like.dtype)


def _method_module(method: str, use_kernels):
    """accelerated.ops's module, or accelerated.kernels' (same interface) when use_kernels says so."""
    if use_kernels not in ("auto", True, False):
        raise ValueError(f"use_kernels: must be 'auto', True or False, got {use_kernels!r}")
    if use_kernels is False:
        return ops.method_module(method)
    ok, why = kernels.available()
    if not ok:
        if use_kernels is True:
            raise ValueError(f"use_kernels: kernels unavailable ({why})")
        return ops.method_module(method)
    return kernels.method_module(method)


@dataclasses.dataclass(frozen=True)
class Pending:
    """A checked, encoded chunk waiting for `Stream.commit` (see `Stream.prepare`)."""
    stream: "Stream"
    version: int
    dtype: str
    bhd: tuple[int, int, int]
    fields: dict[str, mx.array] | None   # encoded rows of the flushed tokens, or None
    flushed: int                         # tokens leaving the window
    window: mx.array                     # old window + chunk, before the flush


class Stream:
    """`append(x)`, `trim(n)`, `record()`, `tokens`, `dequantized()`, `nbytes`, `state()`/`from_state`."""

    def __init__(self, params: spec.Params, dtype=None, use_kernels="auto"):
        self.params = record.resolve(params)
        self._method = _method_module(self.params.method, use_kernels)
        self._names = [n for n in record.field_names(self.params) if n != "window"]
        self._dtype = None if dtype is None else numerics.dtype_name(dtype)
        self._bhd: tuple[int, int, int] | None = None
        self._rows = {n: _Rows() for n in self._names}
        self._q = 0                          # encoded tokens
        self._window: mx.array | None = None  # (B, H, r, d) in the input dtype
        # kept tokens (streaming.md "Exact trims"): exact values of tokens Q − L .. Q − 1, L <= C; none where
        # they can never be used (per-token methods with R = 0)
        p = self.params
        self._cap = p.kept_capacity() if (not layouts.of(p).per_token or p.window > 0) else 0
        self._kept: mx.array | None = None
        self._version = 0                    # bumped by every state change (see commit)
        self._epoch = 0                      # bumped by every trim (marks taken before it cannot be restored)
        self._token: mx.array | None = None  # the pending in-place store of the newest rows (see commit)
        # the full window in place (kernels/append.py WINDOWED, _window_buffer): a buffer, the window's first row
        # in it, and the views of it that the state holds while it is there
        self._wbuf: mx.array | None = None
        self._wflat: mx.array | None = None     # _wbuf flattened: in_place.InPlace.windows' views (mx.as_strided)
        self._ws = 0
        self._wview: mx.array | None = None
        self._kview: mx.array | None = None

    # -- sizes -------------------------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        return self._q + (0 if self._window is None else self._window.shape[2])

    @property
    def dtype(self) -> str | None:
        """Input dtype name ("float16", "bfloat16", "float32"), None until known."""
        return self._dtype

    dtype_name = dtype

    def _field_rows(self, name: str, tokens: int) -> int:
        """Rows of a field for a token count (KIVI keys keep one scale/zero row per group of G tokens)."""
        p = self.params
        if name in layouts.of(p).group_rows(p.role):
            return tokens // p.group_size
        return tokens

    def _flush_count(self, r: int) -> int:
        """Tokens leaving a window of r tokens (streaming.md 'Appending a chunk', step 3)."""
        p = self.params
        over = max(r - p.window, 0)
        return over if layouts.of(p).per_token else p.group_size * (over // p.group_size)

    # -- append / trim -------------------------------------------------------------------------------
    def append(self, x: mx.array) -> None:
        self.commit(self.prepare(x))

    def prepare(self, x: mx.array) -> "Pending":
        """Everything `append` does short of changing the state: every check, the flush and its encoding.

        `commit(prepare(x))` is `append(x)`. The split lets a caller accept several streams' chunks
        together (an mlx-lm cache's keys and values) without snapshotting any of them. Inside
        `numerics.deferred_checks()` the data-dependent checks are only recorded (no host sync; the
        caller evaluates them later and restores a `mark()` if one fails, spec/streaming.md).
        """
        p = self.params
        numerics.check_x(x, p, finite=False)     # NaN/Inf: checked by encode_chunk with the flush, one pass
        name = numerics.dtype_name(x.dtype)
        if self._dtype is not None and name != self._dtype:
            raise ValueError(f"x: dtype {name} differs from the stream's {self._dtype}")
        b, h, _, d = x.shape
        if self._bhd is not None and (b, h, d) != self._bhd:
            raise ValueError(f"x: shape {tuple(x.shape)} does not continue (B, H, d) = {self._bhd}")
        if self._wbuf is not None and self._token is not None:
            self.sync()     # the window is rows an in-place launch wrote (_window_buffer): no MLX op orders after it
        win = x if self._window is None or self._window.shape[2] == 0 else mx.concatenate([self._window, x], axis=2)
        f = self._flush_count(win.shape[2])
        if not f and numerics.deferring():
            # nothing leaves the window (a decode step of a windowed stream, kivi keys between groups): only
            # the chunk's NaN/Inf check, recorded for the caller's one check launch; no encode launch
            numerics.fault_nonfinite(x, numerics.NONFINITE)
            fields = None
        else:
            # the flushed tokens' fields and the whole chunk's NaN/Inf check in one call (one launch on a
            # GPU); kernel methods read any input dtype (no float32 copy of the chunk)
            fields = record.encode_chunk(self._method, win, p, f, win.shape[2] - x.shape[2], win.dtype)
        if not f:
            fields = None
        elif not numerics.deferring():
            mx.eval(*fields.values())
        return Pending(self, self._version, name, (b, h, d), fields, f, win)

    def commit(self, pending: "Pending", writes: list | None = None) -> None:
        """Apply a `prepare` result; refused if the state changed since (the flush would be wrong).

        With `writes` (a list), the encoded rows are not stored here: their (destination view, source)
        pairs are appended to `writes` for the caller to store in one launch (accelerated.kernels.commit),
        which must then hand its token to `stored_by`."""
        if pending.stream is not self or pending.version != self._version:
            raise ValueError("pending: prepared for another stream or an earlier state")
        self._dtype, self._bhd = pending.dtype, pending.bhd
        if pending.fields is not None:
            for n in self._names:
                if writes is None:
                    self._rows[n].extend(pending.fields[n])
                else:
                    writes += self._rows[n].reserve(pending.fields[n])
            self._q += pending.flushed
            self._keep(pending.window, pending.flushed)
        self._window = pending.window[:, :, pending.flushed:]
        self._version += 1

    def _keep(self, win: mx.array, f: int) -> None:
        """The flushed tokens win[:, :, :f] join the kept tokens; the newest C stay."""
        if not self._cap:
            return
        if f >= self._cap or self._kept is None or self._kept.shape[2] == 0:
            self._kept = win[:, :, max(f - self._cap, 0):f]
        else:
            kept = mx.concatenate([self._kept, win[:, :, :f]], axis=2)
            self._kept = kept[:, :, max(kept.shape[2] - self._cap, 0):]

    def _window_buffer(self, t: int) -> None:
        """The full window as rows ws..ws+R-1 of a buffer with room for t more rows and the kept tokens just
        before them (the window's earlier tokens), for in-place appends (kernels/append.py WINDOWED): a launch
        encodes rows ws..ws+t-1 and writes the chunk at rows ws+R.., and the state after it is views of the
        buffer (_moved). Rows are only written past the newest window row, so a view taken before (a mark's
        window and kept tokens, a copy's) keeps its values; the buffer is made anew (a copy of those rows, the
        same values) when the window is not its view any more or the room ran out."""
        win, r = self._window, self._window.shape[2]
        if (self._wbuf is not None and win is self._wview and self._kept is self._kview
                and self._ws + r + t <= self._wbuf.shape[2]):
            return
        kept = self._kept if self._kept is not None else win[:, :, :0]
        n = kept.shape[2] + r
        buf = self._new_window_buffer(n, t)
        buf[:, :, :n] = mx.concatenate([kept, win], axis=2) if kept.shape[2] else win
        self._rebuffered(buf, kept.shape[2])

    def _new_window_buffer(self, n: int, t: int) -> mx.array:
        """A zero window buffer for n rows (kept tokens and window) with room for t more: whole steps, one spare."""
        cap = -(-(n + t) // _Rows.step) * _Rows.step + _Rows.step
        w = self._window
        return mx.zeros((*w.shape[:2], cap, w.shape[3]), dtype=w.dtype)

    def _rebuffered(self, buf: mx.array, kn: int) -> None:
        """The kept tokens (kn) and the window are now the first rows of `buf` (filled by the caller)."""
        r = self._window.shape[2]
        self._wbuf, self._wflat, self._ws = buf, buf.reshape(-1), kn
        self._window = self._wview = buf[:, :, kn:kn + r]
        self._kview = None if self._kept is None else buf[:, :, :kn]
        self._kept = self._kview

    def _moved(self, window: mx.array, t: int) -> None:
        """An in-place launch moved the window by t rows of its buffer (InPlace.stored): `window` is the new one."""
        self._ws += t
        self._window = self._wview = window
        if self._cap:       # (the rows of _wbuf[:, :, lo:ws]: mx.as_strided costs the host less than a slice)
            lo, (b, h, cap, d) = max(self._ws - self._cap, 0), self._wbuf.shape
            self._kept = self._kview = mx.as_strided(self._wflat, (b, h, self._ws - lo, d), (h * cap * d, cap * d, d, 1),
                                                     lo * d)

    def stored_by(self, token: mx.array) -> None:
        """The rows of the last `commit(..., writes)` are being stored by the launch that returns `token`."""
        self._token = token

    def sync(self) -> None:
        """Wait for rows stored in place (a host sync; only where an MLX op is about to read the buffers,
        which cannot take the token as an input): trim, save, decode, the ops path."""
        if self._token is not None:
            mx.eval(self._token)
            self._token = None

    def trim(self, n: int) -> int:
        """Remove the newest min(n, T) tokens; returns how many were removed."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n: must be a non-negative integer, got {n!r}")
        t = self.tokens
        n = min(n, t)
        if n == 0:
            return 0
        self.sync()
        self._version += 1
        self._epoch += 1
        p = self.params
        r = self._window.shape[2]
        t_new = t - n
        kept = self._kept if self._kept is not None else self._window[:, :, :0]
        kept_lo = self._q - kept.shape[2]               # kept tokens are kept_lo .. Q − 1
        # 1. window tokens first
        self._window = self._window[:, :, : max(r - n, 0)]
        q_new = self._q
        if n > r:
            # 2. encoded tokens: per-token methods drop records; kivi truncates to whole groups and puts
            # tokens q_new..t_new-1 back: kept values if held, else decoded and cast RNE (lossy)
            if not layouts.of(p).per_token:
                q_new = p.group_size * (t_new // p.group_size)
                if t_new > q_new and q_new >= kept_lo:
                    self._window = kept[:, :, q_new - kept_lo : t_new - kept_lo]
                elif t_new > q_new:
                    grp = {k: self._rows[k].view(self._field_rows(k, q_new),
                                                 self._field_rows(k, q_new + p.group_size))
                           for k in self._names}
                    dec = self._method.decode_tokens(grp, p, self._bhd[2])[:, :, : t_new - q_new]
                    self._window = dec.astype(numerics.DTYPES[self._dtype])
            else:
                q_new = t_new
            kept = kept[:, :, : max(q_new - kept_lo, 0)]
        # 3. refill: the newest kept tokens (whole groups for kivi) go back to the front of the window
        g = 1 if layouts.of(p).per_token else p.group_size
        back = min(max(p.window - self._window.shape[2], 0), kept.shape[2])
        back = g * -(-back // g) if back else 0             # whole groups, while the window is short of R
        back = min(back, g * (kept.shape[2] // g))
        if back:
            self._window = mx.concatenate([kept[:, :, kept.shape[2] - back :], self._window], axis=2)
            kept = kept[:, :, : kept.shape[2] - back]
            q_new -= back
        for k in self._names:
            self._rows[k].n = self._rows[k].lo + self._field_rows(k, q_new)
        self._q = q_new
        self._kept = kept if self._cap else None
        mx.eval(self._window, *([] if self._kept is None else [self._kept]))
        return n

    def __deepcopy__(self, memo) -> "Stream":
        """An independent stream in the same state (mlx-lm deep-copies prompt caches: LRUPromptCache,
        the batch caches' merge/extract). The valid rows are copied into new buffers: the kernels store
        rows in place (accelerated.kernels.commit), so two streams must never share a buffer."""
        self.sync()
        new = copy.copy(self)           # params, method module and the (never written) window are shared
        new._rows = {}
        for k, r in self._rows.items():
            new._rows[k] = _Rows()
            if r.buf is not None:
                new._rows[k].extend(r.view())
        new._token = None
        new._wbuf = new._wflat = new._wview = new._kview = None     # its own buffer at its first in-place append
        memo[id(self)] = new
        return new

    # -- marks (rollback of chunks whose deferred checks fail) ------------------------------------------
    def mark(self) -> tuple:
        """The current state, restorable while no trim happens: appends only write rows past the valid
        ones (a buffer that grows keeps them), so the row counts and the window array are the state."""
        return (self._epoch, self._version, self._q, {k: (r.lo, r.n) for k, r in self._rows.items()},
                self._window, self._dtype, self._bhd, self._kept)

    def restore(self, mark: tuple) -> None:
        epoch, _, q, rows, window, dtype, bhd, kept = mark
        if epoch != self._epoch:
            raise ValueError("mark: taken before a trim; it can no longer be restored")
        if type(rows) is int:       # (decode_step's marks: lo, each field's rows for q tokens from it; KIVI: lo % G 0)
            rows = {k: (self._field_rows(k, rows), self._field_rows(k, rows + q)) for k in self._names}
        for k, (lo, n) in rows.items():
            self._rows[k].lo, self._rows[k].n = lo, n
        self._q, self._window, self._dtype, self._bhd, self._kept = q, window, dtype, bhd, kept
        self._version += 1

    # -- eviction (sliding-window caches, accelerated/cache/rotating.py) ------------------------------------
    def evict(self, n: int) -> None:
        """Remove the oldest n tokens (kivi: n a multiple of G while they are encoded). Encoded rows are
        only skipped (no copy; a `mark()` taken before stays restorable), so the state is the one-shot
        record of the remaining tokens: every record depends on its own token only (kivi: its group)."""
        p = self.params
        if n <= 0:
            return
        ne = min(n, self._q)
        if not layouts.of(p).per_token and ne % p.group_size:
            raise ValueError(f"n: {p.method} evicts whole groups of {p.group_size} encoded tokens, got {ne}")
        for k in self._names:
            self._rows[k].lo += self._field_rows(k, ne)
        self._q -= ne
        if n > ne:      # the window loses tokens too; else it stays the buffer's view (in_place.InPlace.evicted)
            self._window = self._window[:, :, n - ne :]
        if self._kept is not None:
            self._kept = self._kept[:, :, max(self._kept.shape[2] - self._q, 0) :]
        self._version += 1

    def dead_rows(self) -> int:
        """Rows skipped by `evict` and still held in the buffers."""
        return max((r.lo for r in self._rows.values()), default=0)

    def compact(self, room: int = 0) -> None:
        """Free the evicted rows (a copy of the valid ones); marks taken before cannot be restored. `room`: tokens
        the new buffers leave space for past the valid rows, rounded up to whole growth steps as _Rows.extend grows
        (a sliding-window cache: the rows it appends before its next compaction, so that no append in between grows
        a buffer, which would take that step off the decode step). The stored rows are the same either way."""
        self.sync()
        for k, r in self._rows.items():
            if r.buf is not None and r.lo:
                r.compact(self._field_rows(k, room) if room else 0)
                mx.eval(r.buf)
        self._version += 1
        self._epoch += 1

    # -- views -------------------------------------------------------------------------------------
    def packed(self) -> "PackedRecord":
        """What attention reads: views of the encoded fields (no copy, no decode) and the exact window.
        Called once per layer and decode step, so it builds views only (no shape bookkeeping); fields with
        nothing encoded yet are left out (attention reads none while Q = 0)."""
        if self._bhd is None:
            raise ValueError("stream: no tokens appended yet")
        # buffers from their first valid row: rows before `lo` were evicted (a sliding-window cache; a slice
        # only then, so the usual decode step still hands the kernels whole buffers)
        fields = Views({k: r.buf if not r.lo else r.buf[:, :, r.lo:] for k, r in self._rows.items()
                        if r.buf is not None}, {k: r.n - r.lo for k, r in self._rows.items()})
        return PackedRecord(self.params, fields, self._window, self._q, self._method.decode_tokens, self._token)

    def record(self) -> dict[str, mx.array]:
        """The record of the current state ({} before the first append)."""
        if self._bhd is None:
            return {}
        self.sync()
        b, h, d = self._bhd
        shapes = record.expected_shapes(self.params, b, h, self.tokens, d, self._q)
        out = {}
        for name, dt, _ in record.layout(self.params):
            if name == "window":
                out[name] = self._window
            elif self._rows[name].buf is None:
                dt = self._window.dtype if dt == "input" else record.FIELD_DTYPES[dt]
                out[name] = mx.zeros(shapes[name], dtype=dt)
            else:
                out[name] = self._rows[name].view()
        return out

    def dequantized(self) -> mx.array:
        """float32 (B, H, T, d): encoded prefix decoded, then the window upcast."""
        if self._bhd is None:
            raise ValueError("stream: no tokens appended yet")
        return self._method.decode(self.record(), self.params)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.record().values()) + (0 if self._kept is None else self._kept.nbytes)

    # -- save / load -------------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, mx.array], dict]:
        """(record arrays plus "kept" where tokens are kept, metadata of str/int): enough to continue
        exactly (streaming.md)."""
        meta = {k: v for k, v in self.params.to_dict().items()}
        meta.update(tokens=self.tokens, spec_version=spec.SPEC_VERSION)
        if self._dtype is not None:
            meta["dtype"] = self._dtype
        arrays = self.record()
        if arrays and self._kept is not None and self._kept.shape[2]:   # no kept tokens = none (a file drops
            arrays["kept"] = self._kept                                  # empty arrays; from_state: None)
        return arrays, meta

    @classmethod
    def from_state(cls, arrays, meta: dict | None = None, use_kernels="auto") -> "Stream":
        """Restore from `state()`'s (arrays, meta), given as two arguments or as the one tuple."""
        if meta is None and isinstance(arrays, (tuple, list)) and len(arrays) == 2:
            arrays, meta = arrays
        if not isinstance(meta, dict):
            raise ValueError("meta: must be the dict returned by state()")
        keys = ("method", "bits", "bits2", "group_size", "window", "seed", "layer", "head_offset", "role",
                "exact_trim")
        try:
            p = spec.Params(**{k: meta[k] for k in keys if k in meta})
        except TypeError as e:
            raise ValueError(f"meta: {e}") from None
        s = cls(p, meta.get("dtype"), use_kernels)
        if not arrays:
            if meta.get("tokens", 0):
                raise ValueError("arrays: empty but meta says tokens > 0")
            return s
        arrays = dict(arrays)
        kept = arrays.pop("kept", None)
        b, h, t, q, d = record.check_record(arrays, s.params)
        if meta.get("tokens") != t:
            raise ValueError(f"meta: tokens {meta.get('tokens')} does not match the arrays ({t})")
        win = arrays["window"]
        name = numerics.dtype_name(win.dtype)
        if s._dtype is not None and s._dtype != name:
            raise ValueError(f"meta: dtype {s._dtype} does not match the window's {name}")
        s._dtype, s._bhd, s._q = name, (b, h, d), q
        for k in s._names:
            s._rows[k].extend(arrays[k])
        s._window = win
        if kept is not None or s._cap:
            kept = win[:, :, :0] if kept is None else kept
            if (not isinstance(kept, mx.array) or kept.dtype != win.dtype or kept.ndim != 4
                    or (*kept.shape[:2], kept.shape[3]) != (b, h, d) or kept.shape[2] > min(s._cap, q)):
                raise ValueError(f"arrays: kept tokens {getattr(kept, 'shape', kept)} do not fit the record "
                                 f"(at most {min(s._cap, q)} tokens of {win.dtype}, (B, H, d) = {(b, h, d)})")
            s._kept = kept if s._cap else None
        return s
