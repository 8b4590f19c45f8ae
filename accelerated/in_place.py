"""The fused in-place append of a (keys, values) stream pair (accelerated.stream.Stream): one launch of
accelerated.kernels.append encodes a chunk and stores it into both streams' buffers (with exact windows, also
moving each window in its buffer), and an `InPlace` plan remembers the checks that allowed it for the next decode
step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from veloxquant.accelerated.kernels import append as fused

if TYPE_CHECKING:
    from veloxquant.accelerated.stream import Stream

def append_in_place(k: "Stream", v: "Stream", keys: mx.array, values: mx.array, after: mx.array | None,
                    plan: "InPlace | None" = None):
    """A keys/values chunk stored by one launch of accelerated.kernels.append (encode + in-place store +
    deferred checks), where it applies: both streams on the kernels, per-token records (an exact window full, in
    its buffer: Stream._window_buffer), their
    (B, H, d) and dtype already set by an earlier append, room in the buffers. Returns (token, plan): the
    launch's token (both streams now end with the chunk) and the InPlace to pass to the next call, or
    (None, None) with nothing changed (the caller takes the general path).
    The checks an earlier append made (shape, dtype, parameters) hold for a chunk continuing it; the data
    checks are in the token (accelerated.kernels.append.messages)."""
    if plan is None or not plan.holds(k, v, keys, values):
        plan = InPlace.check(k, v, keys, values)
        if plan is None:
            return None, None
    w = plan.windows()
    token = fused.append(k.params, keys, plan.kbufs, v.params, values, plan.vbufs, plan.base(), after,
                         **({"windows": w} if w else {}),
                         **({"flushed": plan.flushing, "own": plan.own()} if plan.group else {}))
    plan.stored(token)
    return token, plan


class InPlace:
    """append_in_place's checks of one (keys, values) stream pair, remembered for the next decode step: they
    still hold while both streams are at the versions this append left (every other change of a stream bumps
    its version: commit, trim, restore, evict, compact), the chunk has the same shape and dtype, and the
    buffers have room. Saves the per-step checks' Python (a few us per layer on the host).

    KIVI with an exact window (`group` = G; both roles KIVI with the same R and G): the windows hold R .. R + G - 1
    tokens, so a step (t <= min(R, G) tokens) encodes none of them, or, where the windows reach R + G, their oldest
    G (`flush`): the host knows which from the window's length, no sync. Its keys' scale and zero fields have a row
    per G tokens (`per`). With R = 0 (t = 1) the flush's last token is the chunk's own (`own`): the launch reads it
    from the chunk and writes it into its window buffer row, which is then its whole window (`windows`); the window
    after it is empty (`held`)."""

    __slots__ = ("k", "v", "kver", "vver", "kshape", "vshape", "kdt", "vdt", "t", "room", "kbufs", "vbufs", "rows",
                 "win", "next", "group", "per", "wroom", "flushing", "held")

    @classmethod
    def check(cls, k: "Stream", v: "Stream", keys: mx.array, values: mx.array) -> "InPlace | None":
        t = keys.shape[2]
        room = None
        lo = next(iter(k._rows.values())).lo
        kp, vp = k.params, v.params
        kivi = "kivi" in (kp.method, vp.method)
        win = k.params.window > 0 or kivi
        group = kp.group_size if kivi else 0
        if kivi and (kp.method != vp.method or kp.group_size != vp.group_size or kp.window != vp.window
                     or lo or t > (min(kp.window, group) or 1) or k._window is None or v._window is None
                     or k._window.shape[2] != v._window.shape[2]):
            return None
        per = []
        for s, x in ((k, keys), (v, values)):
            b, h, _, d = x.shape
            r_ = s.params.window
            full = s._window is not None and (r_ <= s._window.shape[2] < r_ + group if kivi
                                              else s._window.shape[2] == r_)
            if (s._bhd != (b, h, d) or not hasattr(s._method, "encode_launch") or not fused.applies(s.params)
                    or not full or (s.params.window > 0 or kivi) != win
                    or t > s.params.window > 0        # a window moves by the chunk: its tokens leave it, none of it
                    or s._window.dtype != x.dtype or s._q != k._q):
                return None
            for n, r in s._rows.items():
                # r.lo: rows evicted by a sliding-window cache (the same in every per-token field of both
                # streams); the kernel writes at row lo + Q of the buffer (base). KIVI keys' scale and zero: a row
                # per G tokens (room counted in tokens)
                g = group if kivi and s._field_rows(n, group) == 1 else 1
                if r.buf is None or r.lo != lo or r.n - lo != s._field_rows(n, k._q) \
                        or not fused.fits(b, h, r.buf.shape[2]):
                    return None
                per.append(g)
                left = (r.buf.shape[2] - r.n) * g
                room = left if room is None else min(room, left)
        wroom = 0
        if win:         # both windows full (checked above) into buffers with room: the launch moves them in place
            wroom = None
            for s in (k, v):
                s._window_buffer(t)
                left = s._wbuf.shape[2] - s._ws - s._window.shape[2]
                wroom = left if wroom is None else min(wroom, left)
        p = cls()
        p.k, p.v, p.kver, p.vver = k, v, k._version, v._version
        p.kshape, p.vshape, p.kdt, p.vdt, p.t, p.room = keys.shape, values.shape, keys.dtype, values.dtype, t, room
        p.kbufs = {n: r.buf for n, r in k._rows.items()}
        p.vbufs = {n: r.buf for n, r in v._rows.items()}
        p.rows = [*k._rows.values(), *v._rows.values()]
        p.win, p.next, p.group, p.per, p.wroom, p.flushing, p.held = win, None, group, per, wroom, None, None
        if p.room < p.flush() or p.wroom < (t if win else 0):
            return None
        return p

    def flush(self) -> int:
        """Tokens the next chunk encodes (leaving the windows): t, or with KIVI (`group`) 0 or G."""
        if not self.group:
            return self.t
        w = self.k._window.shape[2] + self.t
        return self.group if w >= self.k.params.window + self.group else 0

    def own(self) -> int:
        """The chunk's tokens among those the next launch encodes (KIVI with R = 0 at a flush: 1)."""
        return max(self.flush() - self.k._window.shape[2], 0) if self.group else 0

    def __deepcopy__(self, memo):
        return None       # a copied cache has copied buffers: its first append checks again

    def base(self) -> int:
        """The buffer row of the next token: Q past the rows a sliding-window cache evicted (lo)."""
        return self.rows[0].n

    def evicted(self) -> None:
        """Both streams evicted their oldest tokens (Stream.evict, rows skipped in place: buffers and row ends
        unchanged) since the versions this plan holds for: it holds for the new versions too (not where an
        eviction reached a window: it is no longer the buffer's view)."""
        if not self.win or all(s._window is s._wview for s in (self.k, self.v)):
            self.kver, self.vver = self.k._version, self.v._version

    def windows(self) -> tuple:
        """The next launch's window views (kernels/append.py WINDOWED): (kf, kw, vf, vw), each stream's t tokens
        leaving its window and its window after the chunk (rows of Stream._wbuf); () without windows. `stored`
        makes them the streams' state."""
        if not self.win:
            return ()
        t, f, own, out, held = self.t, self.flush(), self.own(), [], []
        for s in (self.k, self.v):
            ws, r = s._ws, s._window.shape[2]
            # (KIVI with nothing leaving: kf is any rows, never read; with R = 0 at a flush kf's last row and kw are
            # the chunk's row, and the window after the step is empty)
            out += [s._wbuf[:, :, ws:ws + (f or t)], s._wbuf[:, :, ws + f - own:ws + r + t]]
            held.append(s._wbuf[:, :, ws + f:ws + r + t] if own else out[-1])
        self.next, self.flushing, self.held = tuple(out), f, tuple(held)
        return self.next

    def stored(self, token: mx.array) -> None:
        """Both streams now end with the chunk the launch of `token` stored (t rows more); the plan follows."""
        k, v, t = self.k, self.v, self.t
        if self.win and self.next is None:
            self.windows()
        f = self.flushing if self.win else t
        for r, g in zip(self.rows, self.per):
            r.n += f // g
        for s in (k, v):
            s._q += f
            s._version += 1
            s._token = token
        if self.win:
            held, self.next, self.held = self.held, None, None
            for s, w in zip((k, v), held):
                s._moved(w, f)
            self.wroom -= t
        self.kver, self.vver, self.room = k._version, v._version, self.room - f

    def holds(self, k: "Stream", v: "Stream", keys: mx.array, values: mx.array) -> bool:
        return (k is self.k and v is self.v and k._version == self.kver and v._version == self.vver
                and self.room >= self.flush() and self.wroom >= (self.t if self.win else 0)
                and keys.shape == self.kshape and values.shape == self.vshape
                and keys.dtype == self.kdt and values.dtype == self.vdt)
