"""What the mutants share: a reference with one function swapped during its calls (Patched, patched) and a
reference stream that also keeps every accepted token (HistoryStream), for mutants that put originals back."""
from __future__ import annotations

import contextlib

import numpy as np

from .adapters.reference import ReferenceImpl


@contextlib.contextmanager
def patched(module, name, replacement):
    old = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, old)


class Patched(ReferenceImpl):
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


class HistoryStream:
    """A reference stream that also keeps every accepted token in the input dtype, so a mutant can put
    originals back or rebuild the state from them (what the spec forbids)."""

    def __init__(self, params, dtype):
        from ..reference.stream import Stream
        self.s = Stream(params, dtype)
        self.orig = None

    def append(self, x):
        self.s.append(x)
        self.orig = x.copy() if self.orig is None else np.concatenate([self.orig, x], axis=2)

    def trim(self, n):
        r = self.s.trim(n)
        if self.orig is not None:
            self.orig = self.orig[:, :, :self.s.tokens]
        return r

    def __getattr__(self, name):
        return getattr(self.s, name)
