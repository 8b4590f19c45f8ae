"""The fused in-place append of a (keys, values) stream pair (accelerated.stream.Stream): one launch of
accelerated.kernels.append encodes a chunk and stores it into both streams' buffers (with exact windows, also
moving each window in its buffer), and an `InPlace` plan remembers the checks that allowed it for the next decode
step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from .kernels import append as fused
from .kernels import commit

if TYPE_CHECKING:
    from .stream import Stream

def append_in_place(k: "Stream", v: "Stream", keys: mx.array, values: mx.array, after: mx.array | None,
                    plan: "InPlace | None" = None):
    """A keys/values chunk stored by one launch of accelerated.kernels.append (encode + in-place store +
    deferred checks), where it applies: both streams on the kernels, per-token records (an exact window full, in
    its buffer: Stream._window_buffer), their
    (B, H, d) and dtype already set by an earlier append, room in the buffers. Returns (token, plan): the
    launch's token (both streams now end with the chunk) and the InPlace to pass to the next call, or
    (None, None) with nothing changed (the caller takes the general path).
    The checks an earlier append made (shape, dtype, parameters) hold for a chunk continuing it; the data
    checks are in the token (accelerated.kernels.append.messages). A ragged KIVI pair (cache/ragged.py) takes its own
    plan (cache/ragged_step.py: RaggedStream.append_in_place)."""
    if getattr(k, "ragged", False):
        return k.append_in_place(v, keys, values, after, plan)
    if plan is None or not plan.holds(k, v, keys, values):
        plan = InPlace.check(k, v, keys, values)
        if plan is None:
            return None, None
    w = plan.windows()
    f, own = plan.flushes(), plan.owns()
    token = fused.append(k.params, keys, plan.kbufs, v.params, values, plan.vbufs, plan.base(), after,
                         **({"windows": w} if w else {}),
                         **({"flushed": f if plan.mixed else f[0], "own": own if plan.mixed else own[0]}
                            if plan.group else {}),
                         **({"vbase": plan.base(1)} if plan.mixed else {}))
    plan.stored(token)
    return token, plan


def _view_shapes(s: "Stream", t: int) -> tuple:
    """What InPlace.windows needs of a stream's window buffer (Stream._window_buffer, row-contiguous (B, H, rows, d)):
    its flattened array, rows, d, element strides, and the shapes of the t tokens leaving a full window of R and of
    the window."""
    b, h, cap, d = s._wbuf.shape
    strides = (h * cap * d, cap * d, d, 1)
    # (KIVI's kf where nothing leaves the window: any t rows, never read; one view for every such step)
    idle = mx.as_strided(s._wflat, (b, h, t, d), strides, 0)
    return s._wflat, cap, d, strides, (b, h, t, d), (b, h, s.params.window, d), idle


def _window_room(s: "Stream", t: int) -> tuple:
    """A window buffer as Stream._window_buffer sizes it (room for t more rows) with the copy that fills it, for
    InPlace.grow's one launch: (buffer, [(its first rows, the kept tokens and the window: rows of the current buffer)]
    or [], kept tokens)."""
    kn = 0 if s._kept is None else s._kept.shape[2]
    n = kn + s._window.shape[2]
    buf = s._new_window_buffer(n, t)
    return buf, [(buf[:, :, :n], s._wbuf[:, :, s._ws - kn:s._ws - kn + n])] if n else [], kn


def _views(k: "Stream", v: "Stream", t: int, groups: tuple, wins: tuple) -> tuple:
    """Per role, what InPlace.windows needs: its stream, G, and with a window its buffer's view shapes (_view_shapes)."""
    return tuple((s, g, *(_view_shapes(s, t) if w else (None,) * 7)) for s, g, w in zip((k, v), groups, wins))


def _kivi_flush(r: int, t: int, window: int, g: int) -> int:
    """Tokens a KIVI role's chunk of t encodes with r tokens in its window of R = `window`: a group of G once the
    window reaches R + G, else none."""
    return g if r + t >= window + g else 0


class InPlace:
    """append_in_place's checks of one (keys, values) stream pair, remembered for the next decode step: they
    still hold while both streams are at the versions this append left (every other change of a stream bumps
    its version: commit, trim, restore, evict, compact), the chunk has the same shape and dtype, and the
    buffers have room. Saves the per-step checks' Python (a few us per layer on the host). Where only the room fails,
    `grow` makes it without leaving the plan (the decode step's DecodeStep._grown calls it).

    Each role on its own (`wins`, `groups`: its window, its KIVI group size G or 0): a role with an exact window
    (R > 0, or KIVI) moves it in its buffer. KIVI's windows hold R .. R + G - 1 tokens, so a step (t <= min(R, G)
    tokens) encodes none of them, or, where the window reaches R + G, its oldest G (`flushes`): the host knows which
    from the window's length, no sync. Its keys' scale and zero fields have a row per G tokens (`per`). With R = 0
    (t = 1) the flush's last token is the chunk's own (`owns`): the launch reads it from the chunk and writes it into
    its window buffer row, which is then its whole window (`windows`); the window after it is empty (`held`).
    Where the roles differ (`mixed`: kernels/append.py mixed, e.g. keys turboquant with R = 0 and values KIVI with
    R = 128), their encoded counts differ and each role's first row is its own (`base`)."""

    __slots__ = ("k", "v", "kver", "vver", "kshape", "vshape", "kdt", "vdt", "t", "rooms", "kbufs", "vbufs", "rows",
                 "win", "wins", "next", "group", "groups", "per", "wroom", "flushing", "held", "mixed", "nrows",
                 "views", "most", "fields", "wrows", "wcache")

    @classmethod
    def check(cls, k: "Stream", v: "Stream", keys: mx.array, values: mx.array) -> "InPlace | None":
        if getattr(k, "ragged", False) or getattr(v, "ragged", False):    # (cache/ragged_step.py has their plan)
            return None
        t = keys.shape[2]
        lo = next(iter(k._rows.values())).lo
        kp, vp = k.params, v.params
        wins = (fused.role_window(kp), fused.role_window(vp))
        groups = tuple(p.group_size if p.method == "kivi" else 0 for p in (kp, vp))
        mixed = fused.mixed(kp, vp)
        per, room = [], []
        for s, x, win, group in ((k, keys, wins[0], groups[0]), (v, values, wins[1], groups[1])):
            b, h, _, d = x.shape
            r_ = s.params.window
            w = s._window
            if w is None or (group and t > (min(r_, group) or 1)):
                return None
            full = (r_ <= w.shape[2] < r_ + group) if group else w.shape[2] == r_
            if (s._bhd != (b, h, d) or not hasattr(s._method, "encode_launch") or not fused.applies(s.params)
                    or not full or t > r_ > 0        # a window moves by the chunk: its tokens leave it, none of it
                    or w.dtype != x.dtype or (s._q != k._q and not mixed)):
                return None
            left = None
            for n, r in s._rows.items():
                # r.lo: rows evicted by a sliding-window cache (the same tokens in every field of both streams);
                # the kernel writes at row lo + Q of the buffer (base). KIVI keys' scale and zero: a row per G tokens
                # (room counted in tokens; KIVI evicts whole groups, so such a field's lo is lo / G: Stream.evict)
                g = group if group and s._field_rows(n, group) == 1 else 1
                if r.buf is None or r.lo * g != lo or r.n - r.lo != s._field_rows(n, s._q) \
                        or not fused.fits(b, h, r.buf.shape[2]):
                    return None
                per.append(g)
                room_n = (r.buf.shape[2] - r.n) * g
                left = room_n if left is None else min(left, room_n)
            room.append(left)
        wroom = []
        for s, win in zip((k, v), wins):    # a full window into a buffer with room: the launch moves it in place
            if win:
                s._window_buffer(t)
                wroom.append(s._wbuf.shape[2] - s._ws - s._window.shape[2])
            else:
                wroom.append(None)
        p = cls()
        p.k, p.v, p.kver, p.vver = k, v, k._version, v._version
        p.kshape, p.vshape, p.kdt, p.vdt, p.t = keys.shape, values.shape, keys.dtype, values.dtype, t
        p.kbufs = {n: r.buf for n, r in k._rows.items()}
        p.vbufs = {n: r.buf for n, r in v._rows.items()}
        p.rows = [*k._rows.values(), *v._rows.values()]
        p.nrows = len(k._rows)
        p.wins, p.groups, p.mixed = wins, groups, mixed
        p.win, p.group = any(wins), max(groups)
        p.per, p.rooms, p.wroom = per, room, wroom
        p.next, p.flushing, p.held, p.wrows, p.wcache = None, None, None, None, {}
        # per role: the most tokens a step encodes (t, KIVI's G: `_fits`), and for `windows` its stream, G, and with a
        # window the strides of its buffer's (B, H, rows, d) views
        p.most = tuple(g or t for g in groups)
        p.views = _views(k, v, t, groups, wins)
        p.fields = [(r, g, int(i >= p.nrows)) for i, (r, g) in enumerate(zip(p.rows, per))]
        if not p._fits():
            return None
        return p

    @property
    def room(self) -> int:
        """Tokens the buffers still take (the fuller role's)."""
        return min(self.rooms)

    def _fits(self) -> bool:
        (r0, r1), (w0, w1), t = self.rooms, self.wroom, self.t
        if (w0 is not None and w0 < t) or (w1 is not None and w1 < t):
            return False
        m0, m1 = self.most        # (room for the most a step encodes: no need to ask what this one encodes)
        return (r0 >= m0 and r1 >= m1) or all(r >= f for r, f in zip(self.rooms, self.flushes()))

    def _flush(self, i: int) -> int:
        s, g = (self.k, self.v)[i], self.groups[i]
        if not g:
            return self.t
        return _kivi_flush(s._window.shape[2], self.t, s.params.window, g)

    def flushes(self) -> tuple:
        """Tokens the next chunk encodes per role (leaving its window): t, or with KIVI 0 or G."""
        return self._flush(0), self._flush(1)

    def flush(self) -> int:
        """Tokens the next chunk encodes where both roles encode the same (not `mixed`)."""
        return self._flush(0)

    def owns(self) -> tuple:
        """The chunk's tokens among those the next launch encodes per role (KIVI with R = 0 at a flush: 1)."""
        return tuple(max(self._flush(i) - s._window.shape[2], 0) if self.groups[i] else 0
                     for i, s in enumerate((self.k, self.v)))

    def own(self) -> int:
        return self.owns()[0]

    def __deepcopy__(self, memo):
        return None       # a copied cache has copied buffers: its first append checks again

    def base(self, role: int = 0) -> int:
        """The buffer row of the role's next encoded token: Q past the rows a sliding-window cache evicted (lo)."""
        return self.rows[0].lo + (self.k, self.v)[role]._q

    def evicted(self) -> None:
        """Both streams evicted their oldest tokens (Stream.evict, rows skipped in place: buffers and row ends
        unchanged) since the versions this plan holds for: it holds for the new versions too (not where an
        eviction reached a window: it is no longer the buffer's view)."""
        if not self.win or all(s._window is s._wview for s, w in zip((self.k, self.v), self.wins) if w):
            self.kver, self.vver = self.k._version, self.v._version

    def windows(self, whole: bool = False) -> tuple:
        """The next launch's window views (kernels/append.py WINDOWED): (kf, kw, vf, vw), each stream's t tokens
        leaving its window and its window after the chunk (rows of Stream._wbuf); () without windows; where one role
        has none (`mixed`), the other's pair only (kernels/append.py MIXED). `stored` makes them the streams' state.
        Each view is mx.as_strided over the flattened buffer (Stream._wflat): the same rows as a slice of _wbuf, made
        with less host work (a decode step makes up to four). `whole` (tuning's whole_windows): the launch takes the
        buffers whole (csrc/window_bind.h), so no kf view is made: the windows (kw, vw; the windowed role's where
        `mixed`), and `wrows` (_whole_rows)."""
        if not self.win:
            return ()
        t, out, held, fs, rows = self.t, [], [], [], []
        for s, g, flat, cap, d, strides, kfs, kws, idle in self.views:
            if flat is None:            # (`mixed`: a role without a window encodes the chunk, t tokens)
                fs.append(t)
                held.append(None)
                rows.append(None)
                continue
            ws = s._ws
            if s._wflat is not flat:    # (never while the plan holds: only its check makes a buffer)
                raise ValueError("in-place windows: the window buffer is not the plan's")
            if not g:                   # a full window of R tokens: its oldest t leave it, the chunk joins it
                if ws + kws[2] + t > cap:       # (never while the plan holds: `_fits`)
                    raise ValueError("in-place windows: no room in the window buffer")
                kw = mx.as_strided(flat, kws, strides, (ws + t) * d)
                if whole:
                    out.append(kw)
                    rows.append((ws, t, t, kws[2], t, kws[2]))
                else:
                    out += [mx.as_strided(flat, kfs, strides, ws * d), kw]
                fs.append(t)
                held.append(kw)
                continue
            # KIVI: nothing leaves the window, or its oldest G (with R = 0 the last of them the chunk's); with nothing
            # leaving kf is any rows, never read; with R = 0 at a flush kf's last row and kw are the chunk's row, and
            # the window after the step is empty
            r = s._window.shape[2]
            f = _kivi_flush(r, t, kws[2], g)
            own, n, b, h = f - r if f > r else 0, r + t - f, kfs[0], kfs[1]
            if ws + r + t > cap:
                raise ValueError("in-place windows: no room in the window buffer")
            if whole:
                rows.append((ws, f or t, f - own, n + own, f, n))
            else:
                out.append(mx.as_strided(flat, (b, h, f, d), strides, ws * d) if f else idle)
            out.append(mx.as_strided(flat, (b, h, n + own, d), strides, (ws + f - own) * d))
            fs.append(f)
            held.append(mx.as_strided(flat, (b, h, n, d), strides, (ws + f) * d) if own else out[-1])
        self.next, self.flushing, self.held = tuple(out), tuple(fs), tuple(held)
        if whole:       # (the same rows relative to the counts for the same window lengths until the buffers change)
            key = (self.k._window.shape[2], self.v._window.shape[2])
            self.wrows = self.wcache.get(key) or self.wcache.setdefault(key, self._whole_rows(rows, fs))
        return self.next

    def _whole_rows(self, rows: list, fs: tuple) -> tuple:
        """`windows`' rows as tuning's whole_windows launches take them (csrc/window_bind.h): (the windowed roles'
        buffers, the append's wrow, the attention's with the append inside, the attention's alone), each wrow's rows
        relative to that launch's counts: the append's base (MIXED: the values' vbase), the attention's nenc. Per
        role `rows` holds (its window's first row ws, kf's rows, kw's first row - ws, kw's rows, the window after the
        step's first row - ws, its rows). Relative to the counts they depend on the window lengths only (ws - Q is the
        plan's until `grow`; an eviction moves lo and Q together), so `windows` keeps them per lengths (wcache)."""
        lo, qs = self.rows[0].lo, (self.k._q, self.v._q)
        n0 = (min(q + f for q, f in zip(qs, fs)) if self.mixed else qs[0] + fs[0]) + lo
        append, inside, alone = [], [], []
        for p, q in zip(rows, qs if self.mixed else (qs[0], qs[0])):
            if p is None:
                append += (0, 0, 0, 0)
                inside += (0, 0, 0, 0)
                alone += (0, 0, 0, 0)
                continue
            ws, fr, dw, wr, dh, hr = p
            append += (ws - q - lo, fr, ws + dw - q - lo, wr)
            inside += (ws - n0, fr, ws + dw - n0, wr)
            alone += (0, 0, ws + dh - n0, hr)
        bufs = tuple(s._wbuf for s, w in zip((self.k, self.v), self.wins) if w)
        return bufs, *(fused.window_rows(tuple(x)) for x in (append, inside, alone))

    def stored(self, token: mx.array) -> None:
        """Both streams now end with the chunk the launch of `token` stored (t rows more); the plan follows."""
        k, v, t, win = self.k, self.v, self.t, self.win
        if win and self.next is None:
            self.windows()
        fs = self.flushing if win else (t, t)
        for r, g, i in self.fields:
            r.n += fs[i] // g
        held = self.held if win else (None, None)
        if win:
            self.next = self.held = None
        for i, s in enumerate((k, v)):
            f = fs[i]
            s._q += f
            s._version += 1
            s._token = token
            if held[i] is not None:
                s._moved(held[i], f)
                self.wroom[i] -= t
        self.kver, self.vver = k._version, v._version
        r0, r1 = self.rooms
        self.rooms = [r0 - fs[0], r1 - fs[1]]

    def holds(self, k: "Stream", v: "Stream", keys: mx.array, values: mx.array) -> bool:
        return self.same(k, v, keys, values) and self._fits()

    def same(self, k: "Stream", v: "Stream", keys: mx.array, values: mx.array) -> bool:
        """`holds` but for the room in the buffers (what `grow` makes)."""
        return (k is self.k and v is self.v and k._version == self.kver and v._version == self.vver
                and keys.shape == self.kshape and values.shape == self.vshape
                and keys.dtype == self.kdt and values.dtype == self.vdt)

    def grow(self, after: mx.array | None) -> mx.array | None:
        """Room for the next step without leaving the plan (`_fits` failed, `same` holds): every record buffer and
        window buffer made anew with room (as _Rows and Stream._window_buffer round it: those not short keep their
        size), their rows copied by ONE launch of kernels/commit.py ordered after `after`
        (the cache's last token: no host sync, as the general path's growth would sync a windowed stream). Returns
        that launch's token, now the streams' (every later store and read orders after it), or `after` where nothing
        was copied; None where the plan does not grow (rows evicted: a sliding-window cache's own compaction makes its
        room; a window no longer the buffer's view). Rows, counts and views keep their values, so a mark taken before
        restores the same state (its window a view of the old buffer, which nothing writes any more)."""
        k, v, t = self.k, self.v, self.t
        writes, rows, wins = [], [], []
        # every buffer, short of room or not: one write list per configuration (a KIVI role's group fields and a
        # window buffer run out on schedules of their own), so the kernel warm-up's one growth compiles the copy
        # launch that every later growth takes (cache/warmup.py)
        for r, g, i in self.fields:
            if r.lo:
                return None
            new = r._alloc(r.buf, r.n + -(-self.most[i] // g))
            if r.n:
                writes.append((new[:, :, :r.n], r.buf[:, :, :r.n]))
            rows.append((r, new))
        for s, w in zip((k, v), self.wroom):
            if w is None:
                continue
            if s._window is not s._wview or s._kept is not s._kview:
                return None
            buf, pair, kn = _window_room(s, t)
            writes += pair
            wins.append((s, buf, kn))
        token = commit.commit(writes, [], after) if writes else after
        for r, new in rows:
            r.buf = new
        for s, buf, kn in wins:
            s._rebuffered(buf, kn)
        for s in (k, v):
            s._token = token
        self.kbufs = {n: r.buf for n, r in k._rows.items()}      # new dicts: earlier steps' records keep theirs
        self.vbufs = {n: r.buf for n, r in v._rows.items()}
        rooms = [None, None]
        for r, g, i in self.fields:
            n = (r.buf.shape[2] - r.n) * g
            rooms[i] = n if rooms[i] is None else min(rooms[i], n)
        self.rooms = rooms
        self.wroom = [None if w is None else s._wbuf.shape[2] - s._ws - s._window.shape[2]
                      for s, w in zip((k, v), self.wroom)]
        self.views = _views(k, v, t, self.groups, self.wins)
        self.wcache = {}
        return token
