"""More deliberately broken implementations (the reference with one bug each), one per check added for
issue 11: each passes every older check it could have met and fails the new one (test_mutants.py)."""
from __future__ import annotations

import numpy as np

from .adapters.reference import ReferenceImpl, _RefStream
from .mutant_base import HistoryStream, Patched, patched


class _LockingStream(HistoryStream):
    def __init__(self, params, dtype):
        super().__init__(params, dtype)
        self.lock = None

    def append(self, x):
        key = (x.shape[:2], x.shape[3:], x.dtype)
        if self.lock is None:
            self.lock = key          # the bug: fixed by the first chunk *before* it is validated
        elif key != self.lock:
            raise ValueError(f"x: chunk {x.shape} {x.dtype} does not continue the stream")
        super().append(x)


class FirstAppendLocksShape(ReferenceImpl):
    """A stream takes B, H, d and the dtype from its first chunk even when that chunk is rejected."""
    name = "mutant_first_append_locks_shape"

    def new_stream(self, params, dtype):
        return _RefStream(_LockingStream(params, dtype))


def _flip_low_bit(a: np.ndarray, index) -> None:
    u = a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
    u[index] ^= 1


class _StepStream(_RefStream):
    """Row 256 of every token-axis field comes back with its lowest bit flipped once a second chunk arrived:
    what a cache that grows its buffer in 256-row steps and mis-copies the first row of a new step does."""

    def __init__(self, s):
        super().__init__(s)
        self.appends = 0

    def append(self, x):
        super().append(x)
        self.appends += 1

    def record(self):
        rec = super().record()
        if self.appends > 1:
            for v in rec.values():
                if v.ndim >= 3 and v.shape[2] > 256:
                    _flip_low_bit(v, (0, 0, 256) + (0,) * (v.ndim - 3))
        return rec


class BufferStepRow256(ReferenceImpl):
    """Streams longer than 256 tokens, appended in several chunks, corrupt row 256."""
    name = "mutant_buffer_step_row256"

    def new_stream(self, params, dtype):
        from ..reference.stream import Stream
        return _StepStream(Stream(params, dtype))


class MissingLimitChecks(Patched):
    """window not checked against window_max, layer not against 0, head_offset not against its max."""
    name = "mutant_missing_limit_checks"

    def patch(self):
        from .. import spec
        real = spec._check_int

        def check(name, v, *, allowed=None, lo=None, hi=None):
            if name == "window":
                hi = None if lo is None else 1 << 62
            elif name == "layer":
                lo = None if lo is None else -(1 << 62)
            elif name == "head_offset":
                hi = None if lo is None else 1 << 62
            return real(name, v, allowed=allowed, lo=lo, hi=hi)
        return patched(spec, "_check_int", check)


class SeedTruncated63(Patched):
    """The seed reduced to 63 bits (a signed 64-bit integer somewhere): wrong only for seeds >= 2^63."""
    name = "mutant_seed_truncated63"

    def patch(self):
        from ..reference import prng
        real = prng.sign_vector     # (stream_key sits behind sign_vector's cache)
        return patched(prng, "sign_vector", lambda seed, *a: real(seed & ((1 << 63) - 1), *a))


class KiviZeroSaturated(Patched):
    """KIVI's float16 zero point saturates to -65504 instead of being rejected as -Inf (the scale, never
    negative, is still checked)."""
    name = "mutant_kivi_zero_saturated"

    def patch(self):
        from ..reference import numerics
        real = numerics.to_float16

        def to_float16(v):
            out = real(v)
            return np.where(np.isneginf(out), np.float16(-65504.0), out).astype(np.float16)
        return patched(numerics, "to_float16", to_float16)


class HeadSignsModulo4(Patched):
    """Sign vectors of local heads h >= 4 repeat those of h - 4 (a sign table sized for 4 heads)."""
    name = "mutant_head_signs_modulo4"

    def patch(self):
        import dataclasses
        from ..reference import rotation
        real = rotation.head_signs

        def head_signs(params, n_heads, d, purpose):
            rows = [real(dataclasses.replace(params, head_offset=params.head_offset + h % 4), 1, d, purpose)
                    for h in range(n_heads)]
            return np.concatenate(rows, axis=1)
        return patched(rotation, "head_signs", head_signs)


class AttentionHeadsTiled(ReferenceImpl):
    """GQA: query head i reads KV head i % H (np.tile) instead of i // (Hq / H) (np.repeat)."""
    name = "mutant_attention_heads_tiled"

    def attention(self, q, k_record, v_record, k_params, v_params, dtype, scale, mask=None):
        k = self.decode(k_record, k_params, dtype)
        v = self.decode(v_record, v_params, dtype)
        rep = q.shape[1] // k.shape[1]
        k, v = np.tile(k, (1, rep, 1, 1)), np.tile(v, (1, rep, 1, 1))
        s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float32), k) * np.float32(scale)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=-1, keepdims=True)
        return np.einsum("bhqk,bhkd->bhqd", p, v).astype(np.float32)


SUITE = (FirstAppendLocksShape, BufferStepRow256, MissingLimitChecks, SeedTruncated63, KiviZeroSaturated,
         HeadSignsModulo4, AttentionHeadsTiled)
