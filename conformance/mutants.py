"""Deliberately broken implementations, each wrapping the numpy reference with one bug.

test_mutants.py runs the suite's check functions on them and asserts that each check fails: proof that
the suite can catch that class of bug. Bugs are injected by swapping one function of a reference module
for the duration of a call (context manager), so the rest is the real reference.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .adapters.reference import ReferenceImpl, _RefStream


@contextlib.contextmanager
def patched(module, name, replacement):
    old = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, old)


class _Patched(ReferenceImpl):
    """Reference with `self.patch()` active around encode, decode and codebook calls."""

    def patch(self):
        return contextlib.nullcontext()

    def encode(self, x, params, dtype):
        with self.patch():
            return super().encode(x, params, dtype)

    def decode(self, record, params, dtype):
        with self.patch():
            return super().decode(record, params, dtype)

    def quantize(self, u, codebook, d):
        with self.patch():
            return super().quantize(u, codebook, d)

    def dequantize(self, idx, codebook, d):
        with self.patch():
            return super().dequantize(idx, codebook, d)


class OneUlpCodebook(_Patched):
    """gaussian[bits] at every d has centroid `entry` one ulp too high (a mis-rounded table)."""
    name = "mutant_one_ulp_codebook"
    entry = 1

    def patch(self):
        import spec
        from reference import codebooks as rc
        real_scaled = rc.scaled
        gaussians = [spec.gaussian(b) for b in (1, 2, 3, 4)]

        def scaled(book, d):  # reference.codebooks.gaussian(bits, d) goes through scaled()
            c, b = real_scaled(book, d)
            if any(book is g for g in gaussians):
                c = c.copy()
                c[self.entry] = np.nextafter(c[self.entry], np.float32(np.inf))
            return c, b
        return patched(rc, "scaled", scaled)


def _pack_msb(codes, bits):
    """Packing with code 0 in the HIGHEST bits of each word (the bug)."""
    codes = np.asarray(codes, dtype=np.uint32)
    k = 32 // bits
    n = codes.shape[-1]
    w = -(-n // k)
    padded = np.zeros(codes.shape[:-1] + (w * k,), dtype=np.uint32)
    padded[..., :n] = codes
    shifts = np.uint32(32) - np.uint32(bits) * (np.arange(k, dtype=np.uint32) + np.uint32(1))
    return np.bitwise_or.reduce(padded.reshape(codes.shape[:-1] + (w, k)) << shifts, axis=-1).astype(np.uint32)


def _unpack_msb(words, bits, n):
    words = np.asarray(words, dtype=np.uint32)
    k = 32 // bits
    shifts = np.uint32(32) - np.uint32(bits) * (np.arange(k, dtype=np.uint32) + np.uint32(1))
    slots = (words[..., :, None] >> shifts) & np.uint32((1 << bits) - 1)
    return slots.reshape(words.shape[:-1] + (words.shape[-1] * k,))[..., :n]


class MsbFirstPacking(_Patched):
    """Codes packed MSB-first (self-consistent: its own decode reads MSB-first too)."""
    name = "mutant_msb_first_packing"

    def patch(self):
        from reference import packing
        stack = contextlib.ExitStack()
        stack.enter_context(patched(packing, "pack", _pack_msb))
        stack.enter_context(patched(packing, "unpack", _unpack_msb))
        return stack


def _norm_sequential(v):
    """sqrt of a left-to-right sum of squares (the bug: not the halving fold)."""
    v = np.asarray(v, dtype=np.float32)
    return np.sqrt(np.cumsum(v * v, axis=-1, dtype=np.float32)[..., -1])


class SequentialNorm(_Patched):
    """The norm reduced left to right instead of by the halving fold."""
    name = "mutant_sequential_norm"

    def patch(self):
        from reference import numerics
        return patched(numerics, "norm", _norm_sequential)


def _rint_half_away(y):
    y = np.asarray(y, dtype=np.float32)
    return np.floor(y + np.float32(0.5)).astype(np.float32)  # y >= 0 here: half away from zero


class KiviHalfAway(_Patched):
    """KIVI rounds half away from zero instead of half to even."""
    name = "mutant_kivi_half_away"

    def patch(self):
        from reference import numerics
        return patched(numerics, "rint", _rint_half_away)


class _ChunkyStream(_RefStream):
    """Wraps the reference stream; the first token of every chunk after the first gets its stored norm
    one ulp up: what a kernel carrying state across chunk boundaries wrongly might do."""

    def __init__(self, s):
        super().__init__(s)
        self._marks = []

    def append(self, x):
        if self.tokens:
            self._marks.append(self.tokens)
        super().append(x)

    def record(self):
        rec = super().record()
        if "norm" in rec:
            q = rec["norm"].shape[2]
            for t in self._marks:
                if t < q:
                    rec["norm"][:, :, t] = np.nextafter(rec["norm"][:, :, t], np.float32(np.inf))
        return rec

    def trim(self, n):
        r = super().trim(n)
        self._marks = [t for t in self._marks if t < self.tokens]
        return r


class ChunkingDependent(ReferenceImpl):
    """One-shot encode is right; the stream's bytes depend on how tokens were chunked."""
    name = "mutant_chunking_dependent"

    def new_stream(self, params, dtype):
        from reference.stream import Stream
        return _ChunkyStream(Stream(params, dtype))


ALL = (OneUlpCodebook, MsbFirstPacking, SequentialNorm, KiviHalfAway, ChunkingDependent)
