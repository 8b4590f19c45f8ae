"""A ragged pair's in-place plan (cache/ragged_step.py) grows its buffers on the decode step (issue 29): the
counterpart of in_place.InPlace.grow for kernels/decode_step.DecodeStep._grown. Where only the room fails, every field
buffer of both streams and each window buffer is made anew with room (as `reserve` rounds it: ROOM positions past the
next step), their rows copied by ONE kernels/commit.py launch ordered after the cache's last token: no host sync
(`reserve`'s MLX slice updates read rows the in-place launches wrote, which MLX does not order after them, so it
syncs), and no general-path step.
"""
from __future__ import annotations

import mlx.core as mx

from .. import layouts
from ..kernels import append as fused
from ..kernels import commit


def need(s, name: str, positions: int) -> int:
    """Rows field `name` of ragged stream s needs to hold `positions` positions (group rows: one per G)."""
    p = s.params
    return positions // p.group_size + 1 if name in layouts.of(p).group_rows(p.role) else positions


def _flat(s) -> tuple:
    """What a plan's window views need of ragged stream s's window buffer (`reserve`: row-contiguous (B, H, rows, d),
    `_wflat` its flattening): made once per plan (and per growth)."""
    b, h, cap, d = s._wbuf.shape
    return s._wflat, b, h, cap, d, (h * cap * d, cap * d, d, 1)


def _held(s, name: str) -> int:
    """Rows of field `name` that some row of s has written: up to the largest row's boundary (group rows: its groups
    from its phase). Past them the buffer holds nothing any row reads."""
    p = s.params
    grouped = name in layouts.of(p).group_rows(p.role)
    g = p.group_size
    return max(max((b - x % g) // g if grouped else b, 0) for b, x in zip(s.bounds(), s._pads))


def grow(plan, after: mx.array | None, room: int) -> mx.array | None:
    """Room for the next step without leaving `plan` (its `same` holds, its room does not): every field of both
    streams made anew with rows for `room` positions past the next step (`reserve`'s rounding), each window buffer
    with `room` rows past the window and the chunk, the window copied to its first rows; the rows every row holds
    copied by one commit launch ordered after `after`. Every buffer is copied, short of room or not: one write list
    per configuration (the warm-up compiles one growth's copy; its batch never grows a ragged cache). Returns that launch's token (now the streams'), or None where
    the plan does not grow (a window no longer its buffer's view; rows past the kernels' int32 addressing). The
    streams' rows, bounds and windows keep their values, so a mark taken before restores the old buffers (nothing
    writes them any more)."""
    k, v, t = plan.k, plan.v, plan.t
    b, h, _, _ = plan.shape
    end = k._idx + t
    if any(s._window is not s._wview or s._wbuf is None for s in (k, v)):
        return None
    sizes = {(i, n): max(a.shape[2], need(s, n, end + room)) for i, s in enumerate((k, v)) for n, a in s._f.items()}
    if not fused.fits(b, h, max([end + 2 * room, *sizes.values()])):
        return None
    writes, fields, wins = [], [], []
    for i, s in enumerate((k, v)):
        f = {}
        for n, a in s._f.items():
            new = mx.zeros((*a.shape[:2], sizes[(i, n)], *a.shape[3:]), dtype=a.dtype)
            rows = _held(s, n)
            if rows:
                writes.append((new[:, :, :rows], a[:, :, :rows]))
            f[n] = new
        fields.append(f)
        n, ws = s._idx - s._lo, s._ws
        buf = mx.zeros((*s._wbuf.shape[:2], n + t + room, s._wbuf.shape[3]), dtype=s._wbuf.dtype)
        wins.append((buf, n, [(buf[:, :, :n], s._wbuf[:, :, ws:ws + n])] if n else []))
    # (the windows after every field, as in_place.InPlace.grow orders its writes: the same copy variant where the
    # fields' dtypes are a single cache's)
    writes += [w for _, _, pair in wins for w in pair]
    token = commit.commit(writes, [], after) if writes else after
    for s, f, (buf, n, _) in zip((k, v), fields, wins):
        s._f = f
        s._wbuf, s._ws, s._wflat = buf, 0, buf.reshape(-1)
        s._window = s._wview = buf[:, :, :n]
        s._token = token
    plan.kbufs, plan.vbufs = dict(k._f), dict(v._f)     # new dicts: earlier steps' records keep theirs
    plan.kview, plan.vview = _flat(k), _flat(v)
    return token


__all__ = ["grow", "need"]
