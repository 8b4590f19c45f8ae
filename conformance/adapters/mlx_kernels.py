"""Adapter for the fused MLX kernels (accelerated.kernels): encode, decode and streams of all six methods run
through the kernels (input checks included: the encode kernel's fault flags).
Where the kernels cannot run (no Metal/CUDA backend, or --device cpu) the whole suite skips with the reason.
"""
from __future__ import annotations

import importlib

from .base import Unsupported
from .mlx_ops import MlxOpsImpl, _MxStream
from . import _mx


class MlxKernelsImpl(MlxOpsImpl):
    name = "mlx_kernels"
    ops_module = "veloxquant.accelerated.kernels"

    def unavailable(self):
        try:
            kernels = importlib.import_module(self.ops_module)
        except ImportError as e:
            return f"no fused kernels: accelerated.kernels is not importable ({e})"
        why = super().unavailable()
        if why:
            return why
        ok, reason = kernels.available()
        return None if ok else f"no fused kernels here: {reason}"

    def versions(self):
        v = super().versions()
        ok, reason = self._ops().available()
        v["kernels"] = reason if ok else f"unavailable ({reason})"
        return v

    def new_stream(self, params, dtype):
        return _MxStream(self._stream_cls()(params, dtype, use_kernels=True), dtype)

    def load_stream(self, state):
        arrays, meta = _mx.tree_to_mx(state)
        s = self._stream_cls().from_state(arrays, meta, use_kernels=True)
        return _MxStream(s, meta.get("dtype"))

    def _attend(self, q, k, v, scale, mask):
        # what the caches run: the fused kernels wherever they take the call, the ops path otherwise
        from ...accelerated.attention import PackedKV, attend
        return attend(q, PackedKV(k), PackedKV(v), scale, mask)

    def _codebooks(self):
        raise Unsupported("mlx_kernels: quantization is fused into the kernels (no separate codebook op); "
                          "the codebook probes of accelerated.ops run under --impl mlx_ops")
