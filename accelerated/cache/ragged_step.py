"""The in-place decode step of a ragged KIVI batch (cache/ragged.py's RaggedStream pair, KIVI in both roles with one
group size G and one window R; or RaggedMixedInPlace: turboquant keys with R = 0 beside KIVI values with R > 0): the
counterpart of accelerated/in_place.py's InPlace for kernels/decode_step.py.

A step of one token per row stores, in one launch (kernels/append.py with `rphase`, or inside the attention's partial
launch: attention_source.append_block's ragged scopes), the chunk into every row's window and, where the rows of one
phase f flush (f = (idx' - R) mod G and x = idx' - R - G >= f: cache/ragged.py), their group x .. x + G - 1 into
the fields (the kernel's rows read their phase: only those rows encode). The host knows the flush, x and the rows'
least boundary after the step (the attention's nenc) from the paddings and the step count, no device read.

Buffers (no full-size copy per flush; on a GPU the general path's commit writes into the same arrays where they have
room: RaggedStream.commit's `writes`): each field of a stream is one array with
room past every row's boundary (rows from position 0, group rows from group 0), written in place; the window is a view
of a buffer (`_wbuf`, its first row `_ws` at position `_lo`) that a step extends by the chunk's row and whose first
row moves by the change of the least boundary (the views: mx.as_strided over `_wflat`, the buffer flattened where
`reserve` makes it, shapes and strides once per plan: `_flat`, `_views`). Rows are only written past the state a mark
or a view holds, so marks restore by their row counts. Where only the room runs out the plan grows on the decode step
(`grow`: cache/ragged_growth.py, one copy launch, no host sync). Anything else (another shape, a trim, the general
path's commit) leaves the plan; the next check makes new buffers (`reserve`: one copy) where the old have no room.
"""
from __future__ import annotations

import mlx.core as mx

from ..kernels import append as fused
from ..kernels.ragged_support import keyed_mixed, kivi_keyed
from ..ops import record
from . import ragged_growth
from .ragged_growth import _flat, need

ROOM = 256          # positions a buffer grows by past what it must hold (as stream._Rows.step)


def _grown(a: mx.array, rows: int) -> mx.array:
    out = mx.zeros((*a.shape[:2], rows, *a.shape[3:]), dtype=a.dtype)
    if a.shape[2]:
        out[:, :, :a.shape[2]] = a
    return out


def reserve(s, t: int) -> None:
    """Give ragged stream s room for t more positions in place: its fields and its window in a buffer."""
    s.sync()
    p, (b, h, d), end = s.params, s._bhd, s._idx + t
    shapes = record.expected_shapes(p, b, h, 0, d, 0)
    kinds = {n: k for n, k, _ in record.layout(p)}
    f = dict(s._f)
    for name in record.field_names(p):
        if name == "window":
            continue
        a = f.get(name)
        if a is None:
            a = mx.zeros(shapes[name], dtype=record.FIELD_DTYPES[kinds[name]])
        if a.shape[2] < need(s, name, end):
            a = _grown(a, need(s, name, end + ROOM))
        f[name] = a
    s._f = f
    w, n = s._window, s._idx - s._lo
    if s._wbuf is None or w is not s._wview or s._ws + n + t > s._wbuf.shape[2]:
        s._wbuf, s._ws = _grown(w, n + t + ROOM), 0
        s._wflat = s._wbuf.reshape(-1)
        s._window = s._wview = s._wbuf[:, :, :n]
    mx.eval(s._wbuf, s._wflat, *s._f.values())


class _NoEviction:
    lo = 0          # (decode_step reads the rows a sliding-window cache evicted: none here)


def _pair(k, v, keys: mx.array, values: mx.array) -> bool:
    """What every ragged plan needs of the pair and the chunk: ragged streams of one layout (paddings, shape, step
    count), both with a window array, one token per row, keys and values of one shape and dtype."""
    b, h, t, d = keys.shape
    return (getattr(v, "ragged", False) and k._pads == v._pads and t == 1 and values.shape == keys.shape
            and values.dtype == keys.dtype and k._bhd == v._bhd == (b, h, d) and k._window is not None
            and v._window is not None and k._idx == v._idx)


class RaggedInPlace:
    """A ragged pair's in-place plan (the module): what kernels/decode_step.DecodeStep reads of in_place.InPlace."""

    ragged = True
    mixed = False
    win = True
    wins = (True, True)
    rows = (_NoEviction(),)

    __slots__ = ("k", "v", "kver", "vver", "shape", "dt", "t", "g", "r", "group", "groups", "kbufs", "vbufs",
                 "phases", "phase_set", "next", "held", "flushing", "encoded", "idx1", "kview", "vview")

    @classmethod
    def check(cls, k, v, keys: mx.array, values: mx.array) -> "RaggedInPlace | None":
        kp, vp = k.params, v.params
        if kp.method != "kivi":
            return RaggedMixedInPlace.check(k, v, keys, values)
        if vp.method != "kivi":
            return RaggedKiviKeysInPlace.check(k, v, keys, values)
        if not (_pair(k, v, keys, values) and vp.method == "kivi" and kp.group_size == vp.group_size
                and kp.window == vp.window and k._window.dtype == v._window.dtype == keys.dtype and k._lo == v._lo
                and k._window.shape[2] > 0):
            return None
        g = kp.group_size
        phases = [x % g for x in k._pads]
        if kp.window == 0 and len(set(phases)) < 2:     # (a flush could leave no window: the launch needs one)
            return None
        return cls._made(k, v, keys, g, kp.window, (g, g), k.phase_array(), k._pads)

    @classmethod
    def _made(cls, k, v, keys: mx.array, g: int, r: int, groups: tuple, phases: mx.array, pads: list):
        """The plan over both streams' buffers, each given room first (`reserve`); None where a buffer's rows would
        not fit the body's int32 addressing. g, r: the flushing role's G and R; groups: (keys', values') G, 0 for a
        per-token role (DecodeStep's consts); phases: the rows' group phases (input rphase), from the paddings
        `pads`."""
        b, h, t, _ = keys.shape
        if not fused.fits(b, h, max(k._idx, *(a.shape[2] for a in (*k._f.values(), *v._f.values()))) + 2 * ROOM):
            return None
        for s in (k, v):
            reserve(s, t)
        p = cls()
        p.k, p.v, p.kver, p.vver = k, v, k._version, v._version
        p.shape, p.dt, p.t, p.g, p.r = keys.shape, keys.dtype, t, g, r
        p.group, p.groups = g, groups
        p.kbufs, p.vbufs = dict(k._f), dict(v._f)
        p.phases, p.phase_set = phases, frozenset(x % g for x in pads)
        p.next = p.held = p.flushing = None
        p.kview, p.vview = _flat(k), _flat(v)
        return p

    def __deepcopy__(self, memo):
        return None       # a copied cache has its own buffers: its next append checks again

    def _room(self, s) -> bool:
        end = s._idx + self.t
        return (s._window is s._wview and s._ws + s._idx - s._lo + self.t <= s._wbuf.shape[2]
                and all(a.shape[2] >= need(s, n, end) for n, a in s._f.items()))

    def holds(self, k, v, keys: mx.array, values: mx.array) -> bool:
        return self.same(k, v, keys, values) and self._fits()

    def same(self, k, v, keys: mx.array, values: mx.array) -> bool:
        """`holds` but for the room in the buffers (what `grow` makes)."""
        return (k is self.k and v is self.v and k._version == self.kver and v._version == self.vver
                and keys.shape == self.shape and values.shape == self.shape and keys.dtype == self.dt
                and values.dtype == self.dt)

    def _fits(self) -> bool:
        return self._room(self.k) and self._room(self.v)

    def grow(self, after: mx.array | None) -> mx.array | None:
        """Room for the next step on the decode step, no host sync (DecodeStep._grown): ragged_growth.grow."""
        return ragged_growth.grow(self, after, ROOM)

    def base(self, role: int = 0) -> int:
        """x: the first position of the group the next step's flushing rows encode (0 where none flushes)."""
        return max(self.k._idx + self.t - self.r - self.g, 0)

    def counts(self) -> tuple[int, int]:
        """(keys', values') encoded counts after the next step as the attention reads them: the rows' least boundary."""
        return self.encoded, self.encoded

    def flushes(self) -> bool:
        """Whether the next step flushes a group in some rows (of phase (idx' - R) mod G, where x >= it)."""
        idx1 = self.k._idx + self.t
        f = (idx1 - self.r) % self.g
        return f in self.phase_set and idx1 - self.r - self.g >= f

    def windows(self) -> tuple:
        """The next launch's (kf, kw, vf, vw): each role's tokens at x .. x + G - 1 (where rows flush; else any row,
        never read) and its window after the step (positions lo' .. idx'; lo' the rows' least boundary after it)."""
        flush = self._next(self.k)
        kf, kw = self._kivi(self.k, self.kview, flush)
        vf, vw = self._kivi(self.v, self.vview, flush)
        g = self.g if flush else 0
        self.next, self.held, self.flushing = (kf, kw, vf, vw), (kw, vw), (g, g)
        return self.next

    def _next(self, s) -> bool:
        """The next step's idx' and least boundary (`encoded`) from the KIVI role s's rows; whether some rows flush."""
        self.idx1 = idx1 = s._idx + self.t
        self.encoded = min(s.bounds(idx1))
        return self.flushes()

    def _kivi(self, s, view: tuple, flush: bool) -> tuple:
        """(kf, kw) of the KIVI role s (every ragged plan's one flush rule): its tokens at x .. x + G - 1 where rows
        flush (else the chunk's row, never read) and its window after the step (positions lo' .. idx'). Not
        in_place._kivi_flush: a single sequence flushes by its window's length, a ragged role's rows by phase."""
        ws, lo, n, t, lo1 = s._ws, s._lo, s._idx - s._lo, self.t, self.encoded
        first = ws + RaggedInPlace.base(self) - lo if flush else ws + n
        return _views(s, view, first, self.g if flush else t, ws + lo1 - lo, n + t + lo - lo1)

    def own(self) -> int:
        """The chunk's tokens among those the next flush encodes (R = 0: its last, read from the chunk)."""
        return self.t if self.r == 0 else 0

    def stored(self, token: mx.array) -> None:
        """Both streams now end with the chunk the launch of `token` stored; the plan follows."""
        if self.next is None:
            self.windows()
        for s, w in zip((self.k, self.v), self.held):
            s._ws += self.encoded - s._lo
            s._window = s._wview = w
            s._lo, s._idx = self.encoded, self.idx1
            s._version += 1
            s._token = token
        self.kver, self.vver = self.k._version, self.v._version
        self.next = self.held = None


class RaggedMixedInPlace(RaggedInPlace):
    """The mixed pair's plan (the recommended quality configuration: turboquant keys per token with R = 0, phase 0 in
    every row, beside KIVI values with R > 0 of each row's own phase): per step the keys encode the chunk's token in
    every row at position idx (no window), the values flush per phase as KIVI's plan does (append.MIXED with rphase:
    the values' pair (vf, vw), then their first row vbase = x; RAGGED_ENCODES gates the keys' rows by x >= the
    row's phase only: its group test is KIVI scopes'). In the attention launch the partial is MIXED (HASWIN 3) with the
    append inside."""

    mixed = True
    wins = (False, True)

    @classmethod
    def check(cls, k, v, keys: mx.array, values: mx.array) -> "RaggedMixedInPlace | None":
        kp, vp = k.params, v.params
        if kp.window > 0 and cls is RaggedMixedInPlace:
            return RaggedMixedWindowsInPlace.check(k, v, keys, values)
        if not (_pair(k, v, keys, values) and keyed_mixed(kp) and kp.window == 0 and vp.method == "kivi"
                and v._window.dtype == keys.dtype and k._idx == k._lo
                and k._window.shape[2] == 0 and v._window.shape[2] > 0):
            return None
        if vp.window == 0 and len({x % vp.group_size for x in v._pads}) < 2:    # (as KIVI's: a flush could leave
            return None                                                         # no window)
        return cls._made(k, v, keys, vp.group_size, vp.window, (0, vp.group_size), v.phase_array(), v._pads)

    def base(self, role: int = 0) -> int:
        """The keys' first row: the chunk's position (role 1: the values' x, as KIVI's plan). Read by the append
        launched alone (a fused step's too, where a read of the cache flushes it: DecodeStep.flush); the partial with
        the append inside takes no base and derives both rows from nenc and the windows."""
        return super().base() if role else self.k._idx

    def counts(self) -> tuple[int, int]:
        return self.idx1, self.encoded

    def windows(self) -> tuple:
        """The next launch's (vf, vw) (KIVI's plan for the values); held: (the keys' window of no rows, vw)."""
        flush = self._next(self.v)
        vf, vw = self._kivi(self.v, self.vview, flush)
        self.next, self.held, self.flushing = (vf, vw), (self.k._window, vw), (self.t, self.g if flush else 0)
        return self.next

    def own(self) -> int:
        return 0

    def owns(self) -> tuple[int, int]:
        """(keys', values') tokens of the chunk among those the next launch encodes from a window: the values' last
        with R = 0 at a flush (read from the chunk: meta[7]; the partial's OWN texts take it as no window row)."""
        return 0, self.t if self.r == 0 and self.flushing[1] else 0

    def stored(self, token: mx.array) -> None:
        if self.next is None:
            self.windows()
        k, v = self.k, self.v
        k._lo = k._idx = self.idx1
        v._ws += self.encoded - v._lo
        v._window = v._wview = self.held[1]
        v._lo, v._idx = self.encoded, self.idx1
        for s in (k, v):
            s._version += 1
            s._token = token
        self.kver, self.vver = k._version, v._version
        self.next = self.held = None


class _Sliding:
    """The windowed plans' part for their per-token role with a window (`sliding`: 0 the keys, 1 the values): the same
    positions in every row, moved by the chunk each step (`_sliding`, `_slid`), beside the KIVI role's pair."""

    __slots__ = ()
    sliding = 0

    def windows(self) -> tuple:
        """The next launch's (kf, kw, vf, vw): the sliding role's oldest window row and its window after the step (its
        rows past that row, the chunk's last), the KIVI role's pair as the plan without that window makes it; held:
        (kw, vw)."""
        i, pair = self.sliding, super().windows()
        rows = _sliding((self.k, self.v)[i], (self.kview, self.vview)[i], self.t)
        self.next = (*rows, *pair) if i == 0 else (*pair, *rows)
        self.held = self.next[1], self.next[3]
        return self.next

    def stored(self, token: mx.array) -> None:
        if self.next is None:
            self.windows()
        s = (self.k, self.v)[self.sliding]
        window, lo = self.held[self.sliding], s._lo       # (super().stored lets go of held)
        super().stored(token)
        _slid(s, window, lo, self.t)


class RaggedMixedWindowsInPlace(_Sliding, RaggedMixedInPlace):
    """The mixed pair with a window in both roles (one window for the layer, e.g. 32: turboquant keys with R_k > 0
    beside KIVI values with R > 0; the MIXED partial's HASWIN 4). The keys' stream has phase 0 in every row, so its
    window is the same positions in every row (idx - R_k .. idx - 1, taken once full: idx >= R_k) and moves by the
    chunk's token each step: its oldest token, at x_k = idx' - R_k - 1 (kf), is encoded at that position and the
    chunk is copied into the window's last row, as a single sequence's MIXED window does (append.MIXED with both
    roles' pairs: (kf, kw, vf, vw), then vbase); the values as RaggedMixedInPlace's. RAGGED_ENCODES gates the keys'
    rows by the values' phases too: a row skips x_k only where x_k < its phase <= its padding (a position it never
    holds)."""

    wins = (True, True)

    @classmethod
    def check(cls, k, v, keys: mx.array, values: mx.array) -> "RaggedMixedWindowsInPlace | None":
        kp, vp = k.params, v.params
        if not (_pair(k, v, keys, values) and keyed_mixed(kp) and kp.window > 0 and vp.method == "kivi"
                and vp.window > 0 and k._window.dtype == v._window.dtype == keys.dtype
                and k._idx - k._lo == k._window.shape[2] == kp.window and v._window.shape[2] > 0):
            return None
        return cls._made(k, v, keys, vp.group_size, vp.window, (0, vp.group_size), v.phase_array(), v._pads)

    def base(self, role: int = 0) -> int:
        """The keys' first row: their window's oldest token, which leaves it (role 1: the values' x)."""
        return super().base(1) if role else self.k._lo

    def counts(self) -> tuple[int, int]:
        return self.idx1 - self.k.params.window, self.encoded


class RaggedKiviKeysInPlace(RaggedInPlace):
    """KIVI keys of each row's own phase (G, R) beside values of a per-token method with R = 0 (phase 0 in every row,
    no window): RaggedMixedInPlace with the roles' parts swapped. Per step the keys flush per phase as KIVI's plan
    does ((kf, kw), their first row base() = x) and the values encode the chunk's token in every row at position idx
    (vbase); append.MIXED with rphase the keys' phases (RAGGED_ENCODES holds for the values' rows: group size 1,
    x >= the phase). In the attention launch the MIXED partial (HASWIN 2, VQ_RKEYS) with the append inside; with the
    keys' R = 0 its OWN text (a flush's last key the chunk's own, read from the chunk: `owns`)."""

    mixed = True
    wins = (True, False)

    @classmethod
    def check(cls, k, v, keys: mx.array, values: mx.array) -> "RaggedKiviKeysInPlace | None":
        kp, vp = k.params, v.params
        if vp.window > 0 and cls is RaggedKiviKeysInPlace:
            return RaggedKiviKeysWindowsInPlace.check(k, v, keys, values)
        if not (_pair(k, v, keys, values) and kivi_keyed(kp, vp) and vp.window == 0
                and k._window.dtype == keys.dtype and v._idx == v._lo and v._window.shape[2] == 0
                and k._window.shape[2] > 0):
            return None
        if kp.window == 0 and len({x % kp.group_size for x in k._pads}) < 2:    # (as KIVI's: a flush could leave
            return None                                                         # no window)
        return cls._made(k, v, keys, kp.group_size, kp.window, (kp.group_size, 0), k.phase_array(), k._pads)

    def base(self, role: int = 0) -> int:
        """The keys' x, as KIVI's plan (role 1: the values' first row, the chunk's position)."""
        return self.v._idx if role else super().base()

    def counts(self) -> tuple[int, int]:
        return self.encoded, self.idx1

    def windows(self) -> tuple:
        """The next launch's (kf, kw) (KIVI's plan for the keys); held: (kw, the values' window of no rows)."""
        flush = self._next(self.k)
        kf, kw = self._kivi(self.k, self.kview, flush)
        self.next, self.held, self.flushing = (kf, kw), (kw, self.v._window), (self.g if flush else 0, self.t)
        return self.next

    def own(self) -> int:
        return 0

    def owns(self) -> tuple[int, int]:
        """(keys', values') tokens of the chunk among those the next launch encodes from a window: the keys' last with
        R = 0 at a flush (read from the chunk: meta[7]; the partial's OWN texts take it as no window row)."""
        return self.t if self.r == 0 and self.flushing[0] else 0, 0

    def stored(self, token: mx.array) -> None:
        if self.next is None:
            self.windows()
        k, v = self.k, self.v
        k._ws += self.encoded - k._lo
        k._window = k._wview = self.held[0]
        k._lo, k._idx = self.encoded, self.idx1
        v._lo = v._idx = self.idx1
        for s in (k, v):
            s._version += 1
            s._token = token
        self.kver, self.vver = k._version, v._version
        self.next = self.held = None


class RaggedKiviKeysWindowsInPlace(_Sliding, RaggedKiviKeysInPlace):
    """RaggedKiviKeysInPlace with the values' window too (R_v > 0, e.g. one window 32 for the layer; the MIXED
    partial's HASWIN 4): RaggedMixedWindowsInPlace's keys' part for the values. Their window is the same positions in
    every row (idx - R_v .. idx - 1, taken once full) and moves by the chunk's token each step: its oldest token, at
    x_v = idx' - R_v - 1 (vf, `base(1)`), is encoded at that position and the chunk is copied into the window's last
    row (append.MIXED with both roles' pairs (kf, kw, vf, vw)); RAGGED_ENCODES gates the values' rows by the keys'
    phases: a row skips x_v only where x_v < its phase <= its padding (a position it never holds)."""

    wins = (True, True)
    sliding = 1

    @classmethod
    def check(cls, k, v, keys: mx.array, values: mx.array) -> "RaggedKiviKeysWindowsInPlace | None":
        kp, vp = k.params, v.params
        if not (_pair(k, v, keys, values) and kivi_keyed(kp, vp) and vp.window > 0 and kp.window > 0
                and k._window.dtype == v._window.dtype == keys.dtype and k._window.shape[2] > 0
                and v._idx - v._lo == v._window.shape[2] == vp.window):
            return None
        return cls._made(k, v, keys, kp.group_size, kp.window, (kp.group_size, 0), k.phase_array(), k._pads)

    def base(self, role: int = 0) -> int:
        """The keys' x (role 1: the values' window's oldest token, which leaves it)."""
        return self.v._lo if role else super().base()

    def counts(self) -> tuple[int, int]:
        return self.encoded, self.idx1 - self.v.params.window



def _views(s, view: tuple, a: int, m: int, c: int, n: int) -> tuple:
    """Rows a .. a + m - 1 and c .. c + n - 1 of s's window buffer: mx.as_strided over its flattening (`view`: the
    plan's _flat(s)), less host work than a slice. As_strided does not check, so rows outside the plan's buffer (one
    made since, or past its room: never while the plan holds) are refused here rather than read."""
    flat, b, h, cap, d, strides = view
    if s._wflat is not flat:
        raise ValueError("ragged in-place windows: the window buffer is not the plan's")
    if a < 0 or c < 0 or a + m > cap or c + n > cap:
        raise ValueError("ragged in-place windows: rows past the window buffer")
    return mx.as_strided(flat, (b, h, m, d), strides, a * d), mx.as_strided(flat, (b, h, n, d), strides, c * d)


def _sliding(s, view: tuple, t: int) -> tuple:
    """(oldest row, window after the step) of a role whose window is the same positions in every row (phase 0) and
    moves by a chunk of t rows each step: views of its window buffer."""
    ws = s._ws
    return _views(s, view, ws, t, ws + t, s._idx - s._lo)


def _slid(s, window: mx.array, lo: int, t: int) -> None:
    """Such a role after its step stored: its window the held view, its first position (lo before the step) t on."""
    s._ws += t
    s._window = s._wview = window
    s._lo = lo + t


def append_in_place(k, v, keys: mx.array, values: mx.array, after: mx.array | None, plan=None):
    """in_place.append_in_place for a ragged pair: (token, plan), or (None, None) with nothing changed."""
    if plan is None or not plan.holds(k, v, keys, values):
        plan = RaggedInPlace.check(k, v, keys, values)
        if plan is None:
            return None, None
    w = plan.windows()
    if plan.mixed:      # (append.MIXED: each role's tokens encoded, the values' first row)
        token = fused.append(k.params, keys, plan.kbufs, v.params, values, plan.vbufs, plan.base(), after, windows=w,
                             flushed=plan.flushing, own=plan.owns(), vbase=plan.base(1), rphase=plan.phases)
        plan.stored(token)
        return token, plan
    flush = plan.flushing[0]
    token = fused.append(k.params, keys, plan.kbufs, v.params, values, plan.vbufs, plan.base(), after, windows=w,
                         flushed=flush, own=plan.own() if flush else 0, rphase=plan.phases)
    plan.stored(token)
    return token, plan


__all__ = ["RaggedInPlace", "RaggedKiviKeysInPlace", "RaggedKiviKeysWindowsInPlace", "RaggedMixedInPlace",
           "RaggedMixedWindowsInPlace", "append_in_place", "need", "reserve", "ROOM"]
