"""Adapter for the numpy reference (reference/): already in the numpy interchange, so mostly pass-through."""
from __future__ import annotations

import copy

import numpy as np

from ... import spec

from .base import Implementation, StreamHandle


class _RefStream(StreamHandle):
    def __init__(self, s):
        self._s = s

    def append(self, x):
        self._s.append(x)

    def trim(self, n):
        return int(self._s.trim(n))

    def record(self):
        r = self._s.record()
        return {} if r is None else {k: np.array(v, copy=True) for k, v in r.items()}

    @property
    def tokens(self):
        return int(self._s.tokens)

    def save(self):
        return copy.deepcopy(self._s.state())


class ReferenceImpl(Implementation):
    name = "reference"

    def unavailable(self):
        try:
            from ... import reference  # noqa: F401
            from ...reference import stream as _reference_stream
        except ImportError as e:
            return f"reference implementation not importable: {e}"
        return None

    def versions(self):
        return {"numpy": np.__version__}

    def encode(self, x, params, dtype):
        from ... import reference
        return dict(reference.encode(x, params, dtype))

    def decode(self, record, params, dtype):
        from ... import reference
        return reference.decode(record, params, dtype)

    def new_stream(self, params, dtype):
        from ...reference.stream import Stream
        return _RefStream(Stream(params, dtype))

    def load_stream(self, state):
        from ...reference.stream import Stream
        return _RefStream(Stream.from_state(copy.deepcopy(state)))

    # Codebooks: reference.codebooks.scaled(book, d) -> (C_d, B_d); quantize(u, B_d); dequantize(i, C_d).
    def _table(self, codebook, d):
        from ...reference import codebooks as rc
        kind, *bits = codebook
        return rc.scaled(spec.gaussian(*bits) if kind == "gaussian" else spec.residual(*bits), d)

    def quantize(self, u, codebook, d):
        from ...reference import codebooks as rc
        return np.asarray(rc.quantize(u, self._table(codebook, d)[1]), dtype=np.uint32)

    def dequantize(self, idx, codebook, d):
        from ...reference import codebooks as rc
        return np.asarray(rc.dequantize(idx, self._table(codebook, d)[0]))

    def cast(self, values, dtype):
        from ...reference import numerics
        if dtype not in ("float16", "bfloat16"):
            raise ValueError(f"dtype: cast to float16 or bfloat16, got {dtype!r}")
        return numerics.downcast(np.asarray(values, dtype=np.float32), dtype)

    def attention(self, q, k_record, v_record, k_params, v_params, dtype, scale, mask=None):
        # The reference's own float32 evaluation: decode, then plain numpy float32 attention.
        k = self.decode(k_record, k_params, dtype)
        v = self.decode(v_record, v_params, dtype)
        rep = q.shape[1] // k.shape[1]
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float32), k) * np.float32(scale)
        if mask == "causal":
            tq, t = s.shape[-2:]
            s = np.where(np.arange(t)[None] <= (t - tq + np.arange(tq))[:, None], s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=-1, keepdims=True)
        return np.einsum("bhqk,bhkd->bhqd", p, v).astype(np.float32)
