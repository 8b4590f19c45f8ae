"""The fused in-place append of a (keys, values) stream pair (accelerated.stream.Stream): one launch of
accelerated.kernels.append encodes a chunk and stores it into both streams' buffers (with exact windows, also
moving each window in its buffer), and an `InPlace` plan remembers the checks that allowed it for the next decode
step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from .kernels import append as fused

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
    checks are in the token (accelerated.kernels.append.messages)."""
    if plan is None or not plan.holds(k, v, keys, values):
        plan = InPlace.check(k, v, keys, values)
        if plan is None:
            return None, None
    w = plan.windows()
    token = fused.append(k.params, keys, plan.kbufs, v.params, values, plan.vbufs, plan.base(), after,
                         **({"windows": w} if w else {}))
    plan.stored(token)
    return token, plan


class InPlace:
    """append_in_place's checks of one (keys, values) stream pair, remembered for the next decode step: they
    still hold while both streams are at the versions this append left (every other change of a stream bumps
    its version: commit, trim, restore, evict, compact), the chunk has the same shape and dtype, and the
    buffers have room. Saves the per-step checks' Python (a few us per layer on the host)."""

    __slots__ = ("k", "v", "kver", "vver", "kshape", "vshape", "kdt", "vdt", "t", "room", "kbufs", "vbufs", "rows",
                 "win", "next")

    @classmethod
    def check(cls, k: "Stream", v: "Stream", keys: mx.array, values: mx.array) -> "InPlace | None":
        t = keys.shape[2]
        room = None
        lo = next(iter(k._rows.values())).lo
        win = k.params.window > 0
        for s, x in ((k, keys), (v, values)):
            b, h, _, d = x.shape
            if (s._bhd != (b, h, d) or not hasattr(s._method, "encode_launch") or not fused.applies(s.params)
                    or s._window is None or s._window.shape[2] != s.params.window or (s.params.window > 0) != win
                    or t > s.params.window > 0        # a window moves by the chunk: its tokens leave it, none of it
                    or s._window.dtype != x.dtype or s._q != k._q):
                return None
            for r in s._rows.values():
                # r.lo: rows evicted by a sliding-window cache (the same in every per-token field of both
                # streams); the kernel writes at row lo + Q of the buffer (base)
                if r.buf is None or r.lo != lo or r.n - lo != k._q or r.n + t > r.buf.shape[2] \
                        or not fused.fits(b, h, r.buf.shape[2]):
                    return None
                room = r.buf.shape[2] - r.n if room is None else min(room, r.buf.shape[2] - r.n)
        if win:         # both windows full (checked above) into buffers with room: the launch moves them in place
            for s in (k, v):
                s._window_buffer(t)
                room = min(room, s._wbuf.shape[2] - s._ws - s.params.window)
        p = cls()
        p.k, p.v, p.kver, p.vver = k, v, k._version, v._version
        p.kshape, p.vshape, p.kdt, p.vdt, p.t, p.room = keys.shape, values.shape, keys.dtype, values.dtype, t, room
        p.kbufs = {n: r.buf for n, r in k._rows.items()}
        p.vbufs = {n: r.buf for n, r in v._rows.items()}
        p.rows = [*k._rows.values(), *v._rows.values()]
        p.win, p.next = win, None
        return p

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
        t, out = self.t, []
        for s in (self.k, self.v):
            ws, r = s._ws, s.params.window
            out += [s._wbuf[:, :, ws:ws + t], s._wbuf[:, :, ws + t:ws + t + r]]
        self.next = tuple(out)
        return self.next

    def stored(self, token: mx.array) -> None:
        """Both streams now end with the chunk the launch of `token` stored (t rows more); the plan follows."""
        k, v, t = self.k, self.v, self.t
        for r in self.rows:
            r.n += t
        for s in (k, v):
            s._q += t
            s._version += 1
            s._token = token
        if self.win:
            nxt = self.next if self.next is not None else self.windows()
            self.next = None
            for s, w in ((k, nxt[1]), (v, nxt[3])):
                s._moved(w, t)
        self.kver, self.vver, self.room = k._version, v._version, self.room - t

    def holds(self, k: "Stream", v: "Stream", keys: mx.array, values: mx.array) -> bool:
        return (k is self.k and v is self.v and k._version == self.kver and v._version == self.vver
                and self.room >= self.t and keys.shape == self.kshape and values.shape == self.vshape
                and keys.dtype == self.kdt and values.dtype == self.vdt)
