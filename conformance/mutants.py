"""Deliberately broken implementations, each wrapping the numpy reference with one bug.

test_mutants.py runs the suite's check functions on them and asserts that each check fails: proof that
the suite can catch that class of bug. Bugs are injected by swapping one function of a reference module
for the duration of a call (context manager), so the rest is the real reference.
"""
from __future__ import annotations

import contextlib
import copy

import numpy as np

from .adapters.reference import ReferenceImpl, _RefStream
from .mutant_base import HistoryStream, Patched, patched
# issue 11's mutants (one per added check) live in mutants_suite.py; importable from here with the others
from .mutants_suite import (SUITE, AttentionHeadsTiled, BufferStepRow256, FirstAppendLocksShape,  # noqa: F401 (listed with the others)
                            HeadSignsModulo4, KiviZeroSaturated, MissingLimitChecks, SeedTruncated63)


class OneUlpCodebook(Patched):
    """gaussian[bits] at every d has centroid `entry` one ulp too high (a mis-rounded table)."""
    name = "mutant_one_ulp_codebook"
    entry = 1

    def patch(self):
        from .. import spec
        from ..reference import codebooks as rc
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


class MsbFirstPacking(Patched):
    """Codes packed MSB-first (self-consistent: its own decode reads MSB-first too)."""
    name = "mutant_msb_first_packing"

    def patch(self):
        from ..reference import packing
        stack = contextlib.ExitStack()
        stack.enter_context(patched(packing, "pack", _pack_msb))
        stack.enter_context(patched(packing, "unpack", _unpack_msb))
        return stack


def _norm_sequential(v):
    """sqrt of a left-to-right sum of squares (the bug: not the halving fold)."""
    v = np.asarray(v, dtype=np.float32)
    return np.sqrt(np.cumsum(v * v, axis=-1, dtype=np.float32)[..., -1])


class SequentialNorm(Patched):
    """The norm reduced left to right instead of by the halving fold."""
    name = "mutant_sequential_norm"

    def patch(self):
        from ..reference import numerics
        return patched(numerics, "norm", _norm_sequential)


def _rint_half_away(y):
    y = np.asarray(y, dtype=np.float32)
    return np.floor(y + np.float32(0.5)).astype(np.float32)  # y >= 0 here: half away from zero


class KiviHalfAway(Patched):
    """KIVI rounds half away from zero instead of half to even."""
    name = "mutant_kivi_half_away"

    def patch(self):
        from ..reference import numerics
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
        from ..reference.stream import Stream
        return _ChunkyStream(Stream(params, dtype))


# ---- spec 1.1: the deviations issue 9 lists (each passed every 1.0 golden case) and head-dim bugs --------

class _KiviOriginalsStream(HistoryStream):
    def trim(self, n):
        cut = self.s._window is not None and n > self.s._window.shape[2]   # the trim reaches encoded tokens
        r = super().trim(n)
        if cut and self.s.params.method == "kivi" and self.s._window is not None:
            w = self.s._window.shape[2]
            self.s._window = np.ascontiguousarray(self.orig[:, :, self.s.tokens - w:])   # the bug
        return r


class KiviTrimOriginals(ReferenceImpl):
    """kivi trim puts the original tokens back into the window instead of their decoded values."""
    name = "mutant_kivi_trim_originals"

    def new_stream(self, params, dtype):
        return _RefStream(_KiviOriginalsStream(params, dtype))


class _OneShotStream(HistoryStream):
    def trim(self, n):
        from ..reference.stream import Stream
        r = super().trim(n)
        fresh = Stream(self.s.params, self.s.dtype)
        if self.orig is not None and self.orig.shape[2]:
            fresh.append(self.orig)       # the bug: the state is rebuilt as one-shot encode of the survivors
            self.s = fresh
        return r


class OneShotAfterTrim(ReferenceImpl):
    """After every trim the state is rebuilt as the one-shot encode of the surviving tokens."""
    name = "mutant_one_shot_after_trim"

    def new_stream(self, params, dtype):
        return _RefStream(_OneShotStream(params, dtype))


class _CommitRejectedStream(HistoryStream):
    def append(self, x):
        try:
            super().append(x)
        except ValueError:
            if self.s._window is not None and x.shape[3] == self.s._window.shape[3]:
                self.s._window = np.concatenate([self.s._window, x], axis=2)   # the bug: kept anyway
                self.s._tokens += x.shape[2]
            raise


class RejectedChunkKept(ReferenceImpl):
    """A rejected chunk still lands in the window (the error is raised after the state changed)."""
    name = "mutant_rejected_chunk_kept"

    def new_stream(self, params, dtype):
        return _RefStream(_CommitRejectedStream(params, dtype))


class _CheckOnArrivalStream(HistoryStream):
    def append(self, x):
        import dataclasses
        from ..reference import method_module
        p = dataclasses.replace(self.s.params, window=0)
        if p.method != "kivi":      # the bug: every arriving token is checked as if it were encoded now
            method_module(p).encode(x, p, self.s.dtype)
        super().append(x)


class WindowCheckedOnArrival(ReferenceImpl):
    """Per-method rules (norm overflow, range overflow) applied to window tokens when they arrive."""
    name = "mutant_window_checked_on_arrival"

    def new_stream(self, params, dtype):
        return _RefStream(_CheckOnArrivalStream(params, dtype))


class LoadReencodes(ReferenceImpl):
    """load rebuilds the stream by re-encoding the decoded tokens of the saved record."""
    name = "mutant_load_reencodes"

    def load_stream(self, state):
        from ..reference import numerics
        from ..reference.stream import Stream
        old = Stream.from_state(copy.deepcopy(state))
        s = Stream(old.params, old.dtype)
        if old.tokens:
            s.append(numerics.downcast(old.decode(), old.dtype))
        return _RefStream(s)


class HeadIndexWrap32(Patched):
    """The global head index head_offset + h wrapped to 32 bits."""
    name = "mutant_head_index_wrap32"

    def patch(self):
        import dataclasses
        from ..reference import rotation
        real = rotation.head_signs

        def head_signs(params, n_heads, d, purpose):
            rows = [real(dataclasses.replace(params, head_offset=(params.head_offset + h) & 0xFFFFFFFF), 1, d,
                         purpose) for h in range(n_heads)]
            return np.concatenate(rows, axis=1)
        return patched(rotation, "head_signs", head_signs)


class Bits2DefaultIsDefaultBits(ReferenceImpl):
    """bits2 not given becomes formats.toml's default bits (2), not bits."""
    name = "mutant_bits2_default_bits"

    def _fix(self, params):
        import dataclasses
        if params.method == "turboquant_rvq" and params.bits2 is None:
            return dataclasses.replace(params, bits2=2)
        return params

    def encode(self, x, params, dtype):
        return super().encode(x, self._fix(params), dtype)

    def decode(self, record, params, dtype):
        return super().decode(record, self._fix(params), dtype)


def _check_head_dim_v10(self, d):
    """spec 1.0's group rule, G <= d (the bug at d = m * 2^k: G must divide d)."""
    from .. import spec
    if d not in spec.HEAD_DIMS:
        raise ValueError(f"x: head dim {d} is not supported")
    if self.group_size is not None and self.group_size > d and (self.method == "mlx_affine" or self.role == "v"):
        raise ValueError(f"group_size: {self.group_size} exceeds head dim {d}")


class GroupAtMostHeadDim(Patched):
    """Groups along d checked by G <= d (1.0's wording) instead of G dividing d."""
    name = "mutant_group_at_most_head_dim"

    def patch(self):
        from .. import spec
        return patched(spec.Params, "check_head_dim", _check_head_dim_v10)


class NoGroupCheck(Patched):
    """mlx_affine / kivi values do not check the group size against d at all."""
    name = "mutant_no_group_check"

    def patch(self):
        from .. import spec

        def check(self, d):
            if d not in spec.HEAD_DIMS:
                raise ValueError(f"x: head dim {d} is not supported")
        return patched(spec.Params, "check_head_dim", check)


class ValuesBeforeGroupSize(Patched):
    """x's values (NaN/Inf) checked before the group size against d (1.0 reference order)."""
    name = "mutant_values_before_group_size"

    def patch(self):
        from ..reference import numerics
        real = numerics.check_x

        def check_x(x, dtype, params=None):
            xf = real(x, dtype)          # finiteness first ...
            if params is not None:
                params.check_head_dim(x.shape[3])   # ... then the group size
            return xf
        return patched(numerics, "check_x", check_x)


def _hadamard_variant(bug):
    """reference.rotation.hadamard with one of the head-dim bugs."""
    from .. import spec
    from ..reference import rotation

    def hadamard(v, transpose=False):
        v = np.asarray(v, dtype=np.float32)
        d = v.shape[-1]
        lead = v.shape[:-1]
        m, n = spec.split_head_dim(d)
        if m == 1:
            return rotation.butterfly(v)
        hm = spec.hadamard_matrix(m)
        if transpose and bug != "inverse_uses_h":
            hm = hm.T
        w = v.reshape(lead + (m, n))
        if bug != "stages_swapped":
            w = rotation.butterfly(w)
        if bug == "first_term":
            acc = hm[:, 0][:, None] * w[..., 0:1, :]
            ks = range(1, m)
        else:
            acc = np.zeros(lead + (m, n), np.float32)
            ks = range(m)
        for k in ks:
            acc = np.where((hm[:, k] > 0)[:, None], acc + w[..., k:k + 1, :], acc - w[..., k:k + 1, :])
        if bug == "stages_swapped":
            acc = rotation.butterfly(acc)
        return acc.reshape(lead + (d,))
    return hadamard


class _HadamardBug(Patched):
    bug = ""

    def patch(self):
        from ..reference import rotation
        return patched(rotation, "hadamard", _hadamard_variant(self.bug))


class InverseUsesH(_HadamardBug):
    """RHT_inverse applies H instead of Hᵀ (wrong at m = 20, 28, where H_m is not symmetric)."""
    name = "mutant_inverse_uses_h"
    bug = "inverse_uses_h"


class StageBFirstTerm(_HadamardBug):
    """Stage B sums start from the first term (±w_0), as MLX's CUDA codelet does, not from +0."""
    name = "mutant_stage_b_first_term"
    bug = "first_term"


class StagesSwapped(_HadamardBug):
    """Stage B (H_m across blocks) before stage A (the butterflies)."""
    name = "mutant_stages_swapped"
    bug = "stages_swapped"


def _fold_halving_first(v):
    """The bug: halving fold inside each block first, then the m block sums left to right."""
    from .. import spec
    v = np.asarray(v, dtype=np.float32)
    m, n = spec.split_head_dim(v.shape[-1])
    w = v.reshape(v.shape[:-1] + (m, n))
    while n > 1:
        n //= 2
        w = w[..., :n] + w[..., n:]
    acc = w[..., 0, 0]
    for k in range(1, m):
        acc = acc + w[..., k, 0]
    return acc


class FoldHalvingFirst(Patched):
    """The reduction tree at d = m * 2^k: halving inside blocks, then the block sums (not the spec's)."""
    name = "mutant_fold_halving_first"

    def patch(self):
        from ..reference import numerics
        return patched(numerics, "fold", _fold_halving_first)   # norm() looks fold up at call time


class ExactTrimIgnored(ReferenceImpl):
    """`exact_trim` accepted but ignored: no kept tokens, so a trim never refills the window and kivi's trim
    always decodes (spec 1.0's trim; streaming.md "Exact trims")."""
    name = "mutant_exact_trim_ignored"

    def new_stream(self, params, dtype):
        import dataclasses
        from ..reference.stream import Stream
        return _RefStream(Stream(dataclasses.replace(params, exact_trim=0), dtype))


class _DecodedRefillStream(HistoryStream):
    def trim(self, n):
        from ..reference import numerics
        if self.s.tokens == 0:
            return super().trim(n)
        q0 = self.s.tokens - self.s._window.shape[2]
        dec = numerics.downcast(self.s.decode(), self.s.dtype)     # every token as decoded before the trim
        r = super().trim(n)
        q = self.s.tokens - self.s._window.shape[2]
        if q < q0:       # the bug: tokens moved back from the kept ones re-enter as decoded values
            k = min(q0, self.s.tokens) - q
            self.s._window = np.ascontiguousarray(np.concatenate([dec[:, :, q:q + k], self.s._window[:, :, k:]], 2))
        return r


class KeptTokensDecoded(ReferenceImpl):
    """A trim refills the window with the decoded values of the records it drops, not the kept tokens."""
    name = "mutant_kept_tokens_decoded"

    def new_stream(self, params, dtype):
        return _RefStream(_DecodedRefillStream(params, dtype))


ALL = (OneUlpCodebook, MsbFirstPacking, SequentialNorm, KiviHalfAway, ChunkingDependent)
SPEC11 = (KiviTrimOriginals, OneShotAfterTrim, RejectedChunkKept, WindowCheckedOnArrival, LoadReencodes,
          HeadIndexWrap32, Bits2DefaultIsDefaultBits, GroupAtMostHeadDim, NoGroupCheck, ValuesBeforeGroupSize,
          InverseUsesH, StageBFirstTerm, StagesSwapped, FoldHalvingFirst, ExactTrimIgnored,
          KeptTokensDecoded)
