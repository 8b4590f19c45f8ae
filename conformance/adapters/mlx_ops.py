"""Adapter for the MLX implementation built from mx ops (accelerated.ops, accelerated.stream)."""
from __future__ import annotations

import importlib

import numpy as np

from . import _mx
from .base import Implementation, StreamHandle, Unsupported


class _MxStream(StreamHandle):
    def __init__(self, s, dtype):
        self._s = s
        self._dtype = dtype

    def append(self, x):
        self._s.append(_mx.to_mx(x, self._dtype))

    def trim(self, n):
        return int(self._s.trim(n))

    def record(self):
        return _mx.record_to_np(self._s.record())

    @property
    def tokens(self):
        return int(self._s.tokens)

    def save(self):
        return _mx.tree_to_np(self._s.state())


class MlxOpsImpl(Implementation):
    name = "mlx_ops"
    ops_module = "veloxquant.accelerated.ops"

    def __init__(self):
        self._device = None

    def _ops(self):
        return importlib.import_module(self.ops_module)

    def unavailable(self):
        try:
            import mlx.core  # noqa: F401
        except ImportError as e:
            return f"mlx not importable: {e}"
        try:
            self._ops()
        except ImportError as e:
            return f"{self.ops_module} not importable: {e}"
        if self._device == "gpu":
            import mlx.core as mx
            if not mx.is_available(mx.gpu):
                return "--device gpu: this mlx build has no GPU backend"
        return None

    def set_device(self, device):
        import mlx.core as mx
        self._device = device
        if device == "gpu" and mx.is_available(mx.gpu):
            mx.set_default_device(mx.gpu)
        elif device == "cpu":
            mx.set_default_device(mx.cpu)

    def device_name(self):
        import mlx.core as mx
        return str(mx.default_device())

    def versions(self):
        import mlx.core as mx
        return {"mlx": mx.__version__}

    def encode(self, x, params, dtype):
        # the declared dtype travels too, so a mismatching array is the implementation's to reject
        return _mx.record_to_np(self._ops().encode(_mx.to_mx(x, dtype), params, dtype))

    def decode(self, record, params, dtype):
        return _mx.to_np(self._ops().decode(_mx.record_to_mx(record, dtype), params, dtype))

    def _stream_cls(self):
        try:
            return importlib.import_module("veloxquant.accelerated.stream").Stream
        except (ImportError, AttributeError) as e:
            raise Unsupported(f"accelerated.stream.Stream not available: {e}")

    def new_stream(self, params, dtype):
        # ops alone: Stream's default ('auto') would route the per-token math to fused kernels on a GPU
        return _MxStream(self._stream_cls()(params, dtype, use_kernels=False), dtype)

    def load_stream(self, state):
        arrays, meta = _mx.tree_to_mx(state)   # accelerated.stream.Stream.state() = (arrays, meta)
        s = self._stream_cls().from_state(arrays, meta, use_kernels=False)
        return _MxStream(s, meta.get("dtype"))

    def _codebooks(self):
        try:
            return importlib.import_module(f"{self.ops_module}.codebooks")
        except ImportError:
            raise Unsupported(f"{self.ops_module} has no codebooks module (quantize/dequantize)")

    def _table(self, codebook, d):
        """(C_d, B_d) as mx arrays from the implementation's own scaled tables."""
        kind, *bits = codebook
        cb = self._codebooks()
        return cb.gaussian(*bits, d) if kind == "gaussian" else cb.residual(*bits, d)

    def quantize(self, u, codebook, d):
        return _mx.to_np(self._codebooks().quantize(_mx.to_mx(u), self._table(codebook, d)[1]))

    def dequantize(self, idx, codebook, d):
        return _mx.to_np(self._codebooks().dequantize(_mx.to_mx(idx), self._table(codebook, d)[0]))

    def cast(self, values, dtype):
        # the cast a model applies to decoded values: mx's astype on the selected device
        import mlx.core as mx
        target = {"float16": mx.float16, "bfloat16": mx.bfloat16}.get(dtype)
        if target is None:
            raise ValueError(f"dtype: cast to float16 or bfloat16, got {dtype!r}")
        return _mx.to_np(mx.array(np.asarray(values, dtype=np.float32)).astype(target))

    def attention(self, q, k_record, v_record, k_params, v_params, dtype, scale, mask=None):
        # Attention over the packed records, as the caches run it (spec/attention.md): the MLX ops path
        # here; mlx_kernels takes the fused kernels where they apply.
        import mlx.core as mx
        k = self._packed(k_record, k_params, dtype)
        v = self._packed(v_record, v_params, dtype)
        out = self._attend(mx.array(q.astype(np.float32)), k, v, float(scale), mask)
        return _mx.to_np(out)

    def _attend(self, q, k, v, scale, mask):
        from ...accelerated.ops.attention import attention
        return attention(q, k, v, scale, mask)

    def _packed(self, rec, params, dtype):
        from ...accelerated.ops.attention import PackedRecord
        r = _mx.record_to_mx(rec, dtype)
        win = r.pop("window")
        q = r["codes" if "codes" in r else "codes1"].shape[2]    # codes are per token for every method
        method = self._ops().method_module(params.method)
        return PackedRecord(params.resolved(), r, win, q, method.decode_tokens)

