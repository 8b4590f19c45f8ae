"""Adapter for MLX's own `mx.quantize` / `mx.dequantize` (affine mode) as the `mlx_affine` format.

spec/methods/mlx_affine.md pins the format to what MLX's CPU backend computes; running MLX's own ops
through the suite on each device shows, case by case, where a backend differs from that. Only the record
math is MLX's: the window split (streaming.md) is done here, and MLX does no input validation, so the
rejection tests are expected to fail (conformance/xfail/mlx_native-*.toml says why).
"""
from __future__ import annotations

from . import _mx
from .base import Unsupported
from .mlx_ops import MlxOpsImpl


class MlxNativeImpl(MlxOpsImpl):
    name = "mlx_native"
    methods = ("mlx_affine",)

    def encode(self, x, params, dtype):
        import mlx.core as mx
        p = params.resolved()
        xm = _mx.to_mx(x, dtype)
        q = p.encoded_tokens(x.shape[2])
        b, h, _t, d = x.shape
        if q:
            codes, scales, biases = mx.quantize(xm[:, :, :q], group_size=p.group_size, bits=p.bits)
        else:  # nothing encoded yet: empty fields of the record's shapes
            codes = mx.zeros((b, h, 0, d * p.bits // 32), dtype=mx.uint32)
            scales = biases = mx.zeros((b, h, 0, d // p.group_size), dtype=xm.dtype)
        return _mx.record_to_np({"codes": codes, "scales": scales, "biases": biases, "window": xm[:, :, q:]})

    def decode(self, record, params, dtype):
        import mlx.core as mx
        p = params.resolved()
        r = _mx.record_to_mx(record, dtype)
        parts = []
        if r["codes"].shape[2]:
            parts.append(mx.dequantize(r["codes"], r["scales"], r["biases"], group_size=p.group_size,
                                       bits=p.bits).astype(mx.float32))
        parts.append(r["window"].astype(mx.float32))
        return _mx.to_np(mx.concatenate(parts, axis=2))

    def new_stream(self, params, dtype):
        raise Unsupported("mlx_native: MLX has no streaming API; streams are covered by mlx_ops")

    def load_stream(self, state):
        raise Unsupported("mlx_native: MLX has no streaming API")

    def quantize(self, u, codebook, d):
        raise Unsupported("mlx_native: mx.quantize has no codebook op")

    def dequantize(self, idx, codebook, d):
        raise Unsupported("mlx_native: mx.quantize has no codebook op")

    def attention(self, *args, **kwargs):
        raise Unsupported("mlx_native: attention is covered by mlx_ops")
