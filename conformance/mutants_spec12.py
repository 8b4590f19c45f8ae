"""Spec 1.2's mutants: one deliberate bug per rule that no golden case pinned before spec 1.2 (issue 30).

Each passes every golden case of spec 1.1 (tests/test_mutants_spec12.py re-checks a sample; the full run is
in its docstring) and fails the 1.2 cases aimed at it (test_mutants.py, RULE12_TARGETS).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .adapters.reference import ReferenceImpl, _RefStream
from .mutant_base import Patched, patched


def _stream_cls():
    from ..reference.stream import Stream
    return Stream


def _refill(s, kept, window_target: int):
    """streaming.md 'Trim' 3 on a reference Stream `s` with the given kept tokens, up to `window_target`."""
    g = s.params.group_size if s.params.method == "kivi" else 1
    q = s.tokens - s._window.shape[2]
    while s._window.shape[2] < window_target and kept.shape[2] >= g:
        n = kept.shape[2]
        s._window = np.ascontiguousarray(np.concatenate([kept[:, :, n - g:], s._window], axis=2))
        kept = kept[:, :, :n - g]
        q -= g
        s._prefix = s._slice_prefix(0, q)
    s._kept = np.ascontiguousarray(kept)


def _trim_without_refill(s, n):
    """The reference trim's steps 1-2 only (R = 0 makes step 3 a no-op)."""
    real = s.params
    s.params = dataclasses.replace(real, window=0)
    try:
        return real, _stream_cls().trim(s, n)
    finally:
        s.params = real


class _RefillAllStream:
    def __init__(self, params, dtype):
        self.s = _stream_cls()(params, dtype)

    def trim(self, n):
        real, r = _trim_without_refill(self.s, n)
        if r:
            _refill(self.s, self.s._kept, 1 << 40)   # the bug: every kept token, not just up to R
        return r

    def __getattr__(self, name):
        return getattr(self.s, name)


class RefillAllKept(ReferenceImpl):
    """A trim's refill moves every kept token back into the window, not only until it holds R tokens
    (invisible when an append follows: the flush moves them out again)."""
    name = "mutant_refill_all_kept"

    def new_stream(self, params, dtype):
        return _RefStream(_RefillAllStream(params, dtype))


class _KeptNotDroppedStream(_RefillAllStream):
    def trim(self, n):
        old = self.s._kept
        real, r = _trim_without_refill(self.s, n)
        if r:
            _refill(self.s, old, real.window)   # the bug: kept tokens the trim removed are still there
        return r


class KeptNotDropped(ReferenceImpl):
    """A trim into the encoded prefix does not drop the kept tokens it removed, so the refill brings back
    removed tokens."""
    name = "mutant_kept_not_dropped"

    def new_stream(self, params, dtype):
        return _RefStream(_KeptNotDroppedStream(params, dtype))


class _LenientChunkStream(_RefillAllStream):
    def append(self, x):
        w = self.s._window
        if w is not None:
            from ..reference import numerics
            b, h, _t, d = w.shape
            x = np.ascontiguousarray(x[:b, :h, :, :d])               # the bug: a larger chunk is cut to fit
            if x.dtype != w.dtype:                                    # ... and another dtype converted
                x = numerics.downcast(x.astype(np.float32), self.s.dtype)
        self.s.append(x)

    def trim(self, n):
        return self.s.trim(n)


class ChunkMismatchAccepted(ReferenceImpl):
    """A chunk whose dtype, B, H or d differ from the stream's is converted / cut to fit, not rejected."""
    name = "mutant_chunk_mismatch_accepted"

    def new_stream(self, params, dtype):
        return _RefStream(_LenientChunkStream(params, dtype))


class _NegativeTrimStream(_RefillAllStream):
    def trim(self, n):
        return self.s.trim(max(n, 0) if isinstance(n, int) else n)   # the bug: negative n trims nothing

    def append(self, x):
        self.s.append(x)


class NegativeTrimIsZero(ReferenceImpl):
    """trim(-n) returns 0 instead of raising ValueError naming n."""
    name = "mutant_negative_trim_is_zero"

    def new_stream(self, params, dtype):
        return _RefStream(_NegativeTrimStream(params, dtype))

    def load_stream(self, state):
        import copy
        s = _NegativeTrimStream.__new__(_NegativeTrimStream)
        s.s = _stream_cls().from_state(copy.deepcopy(state))
        return _RefStream(s)


class EmptySaveFails(ReferenceImpl):
    """Loading a state saved before the first append fails (a loader that needs a record)."""
    name = "mutant_empty_save_fails"

    def load_stream(self, state):
        if state.get("record") is None:
            raise ValueError("state: the saved stream has no record")
        return super().load_stream(state)


class ParamTypesLenient(Patched):
    """Integral floats (4.0) and bools (True) accepted as integers; role compared case-insensitively."""
    name = "mutant_param_types_lenient"

    def patch(self):
        import contextlib
        from .. import spec
        real = spec._check_int

        def check(name, v, **kw):
            if isinstance(v, (bool, float)) and float(v).is_integer():
                v = int(v)
            return real(name, v, **kw)
        real_resolved = spec.Params.resolved

        def resolved(self):
            p = self
            for f in ("bits", "bits2", "group_size", "window", "seed", "layer", "head_offset", "exact_trim"):
                v = getattr(p, f)
                if isinstance(v, (bool, float)) and float(v).is_integer():
                    p = dataclasses.replace(p, **{f: int(v)})
            if isinstance(p.role, str):
                p = dataclasses.replace(p, role=p.role.lower())
            return real_resolved(p)
        stack = contextlib.ExitStack()
        stack.enter_context(patched(spec, "_check_int", check))
        stack.enter_context(patched(spec.Params, "resolved", resolved))
        return stack


class ExactTrimUnbounded(Patched):
    """exact_trim checked for type only: no range check (0 .. exact_trim_max)."""
    name = "mutant_exact_trim_unbounded"

    def patch(self):
        from .. import spec
        real = spec._check_int

        def check(name, v, *, allowed=None, lo=None, hi=None):
            if name == "exact_trim":
                lo, hi = None, None
            return real(name, v, allowed=allowed, lo=lo, hi=hi)
        return patched(spec, "_check_int", check)


class DecodeRecordUnchecked(Patched):
    """decode trusts the record: no check of missing fields or field dtypes (arrays are converted)."""
    name = "mutant_decode_record_unchecked"

    def patch(self):
        from ..reference import record as rec_mod
        real = rec_mod.geometry

        def geometry(record, params, dtype):
            for name, dt in rec_mod.fields(params):
                if name not in record:
                    raise KeyError(name)                                   # the bug: no "record: ..." error
                if True:
                    want = np.dtype(np.uint16) if dt == "input" and dtype == "bfloat16" else (
                        np.dtype(dtype) if dt == "input" else np.dtype(dt))
                    record[name] = np.asarray(record[name]).astype(want)   # the bug: converted, not rejected
            return real(record, params, dtype)
        return patched(rec_mod, "geometry", geometry)


class AffineMagicRint(Patched):
    """mlx_affine's step 5 rounds with number-model.md's magic-constant formula, exact only below 2^22."""
    name = "mutant_affine_magic_rint"

    def patch(self):
        from ..reference import mlx_affine, numerics

        class _Np:      # np with rint replaced, as mlx_affine.encode sees it
            def __getattr__(self, k):
                return numerics.rint if k == "rint" else getattr(np, k)
        return patched(mlx_affine, "np", _Np())


class AffineMaxFromZero(Patched):
    """mlx_affine's running maximum starts at 0 (MLX's GPU backends), not at -inf."""
    name = "mutant_affine_max_from_zero"

    def patch(self):
        from ..reference import mlx_affine

        class _Grouped(np.ndarray):
            def max(self, *a, **kw):
                return np.maximum(np.asarray(self).max(*a, **kw), np.float32(0))

        real = mlx_affine._groups
        return patched(mlx_affine, "_groups", lambda v, g: real(v, g).view(_Grouped))


def _attention_f32(impl, q, k_record, v_record, k_params, v_params, dtype, scale, mask, merge_bug, block=2048):
    """float32 attention in blocks of `block` tokens with an online softmax; `merge_bug`: the running sums are
    not rescaled when a later block raises the maximum."""
    k = impl.decode(k_record, k_params, dtype)
    v = impl.decode(v_record, v_params, dtype)
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float32), k) * np.float32(scale)
    if mask == "causal":
        tq, t = s.shape[-2:]
        s = np.where(np.arange(t)[None] <= (t - tq + np.arange(tq))[:, None], s, np.float32(-np.inf))
    m = np.full(s.shape[:-1] + (1,), -np.inf, np.float32)
    acc = np.zeros(q.shape, np.float32)
    den = np.zeros(s.shape[:-1] + (1,), np.float32)
    for lo in range(0, s.shape[-1], block):
        sb = s[..., lo:lo + block]
        m_new = np.maximum(m, sb.max(axis=-1, keepdims=True))
        e = np.exp(sb - m_new)
        if not merge_bug:
            f = np.exp(m - m_new)
            acc, den = acc * f, den * f
        acc = acc + np.einsum("bhqk,bhkd->bhqd", e, v[:, :, lo:lo + block])
        den = den + e.sum(axis=-1, keepdims=True)
        m = m_new
    return (acc / den).astype(np.float32)


class AttentionMergeNoRescale(ReferenceImpl):
    """Attention in 2048-token blocks with an online softmax that does not rescale the earlier blocks' sums
    when a later block holds a larger logit (right whenever T <= 2048 or the maximum is in the first block)."""
    name = "mutant_attention_merge_no_rescale"

    def attention(self, q, k_record, v_record, k_params, v_params, dtype, scale, mask=None):
        return _attention_f32(self, q, k_record, v_record, k_params, v_params, dtype, scale, mask, True)


class AttentionNoCausalMask(ReferenceImpl):
    """The causal mask ignored: every query row sees every token."""
    name = "mutant_attention_no_causal_mask"

    def attention(self, q, k_record, v_record, k_params, v_params, dtype, scale, mask=None):
        return _attention_f32(self, q, k_record, v_record, k_params, v_params, dtype, scale, None, False)


class CastTruncates(ReferenceImpl):
    """bfloat16 cast by dropping the low 16 bits (round toward zero), not RNE."""
    name = "mutant_cast_truncates"

    def cast(self, values, dtype):
        if dtype == "bfloat16":
            return (np.asarray(values, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        return super().cast(values, dtype)


class CastSaturates(ReferenceImpl):
    """float16 cast saturating at ±65504 instead of overflowing to ±Inf."""
    name = "mutant_cast_saturates"

    def cast(self, values, dtype):
        out = super().cast(values, dtype)
        if dtype == "float16":
            out = np.where(np.isinf(out), np.copysign(np.float16(65504), out), out).astype(np.float16)
        return out


class UnknownMethodFallsBack(ReferenceImpl):
    """An unknown method name is served by the first method (a lookup with a default) instead of rejected."""
    name = "mutant_unknown_method_falls_back"

    def _fix(self, params):
        from .. import spec
        return params if params.method in spec.METHODS else dataclasses.replace(params, method=spec.METHODS[0])

    def encode(self, x, params, dtype):
        return super().encode(x, self._fix(params), dtype)

    def decode(self, record, params, dtype):
        return super().decode(record, self._fix(params), dtype)

    def new_stream(self, params, dtype):
        return super().new_stream(self._fix(params), dtype)


class MessageNotLeading(ReferenceImpl):
    """Errors whose message mentions the argument but does not start with it ("invalid input: x: ...")."""
    name = "mutant_message_not_leading"

    def encode(self, x, params, dtype):
        try:
            return super().encode(x, params, dtype)
        except ValueError as e:
            raise ValueError(f"invalid input: {e}") from None


ATTENTION = (AttentionMergeNoRescale, AttentionNoCausalMask)

SPEC12 = (RefillAllKept, KeptNotDropped, ChunkMismatchAccepted, NegativeTrimIsZero, EmptySaveFails,
          ParamTypesLenient, ExactTrimUnbounded, DecodeRecordUnchecked, AffineMagicRint, AffineMaxFromZero)
