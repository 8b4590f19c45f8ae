"""The `Implementation` interface every implementation under test is adapted to (docs/interfaces.md).

Everything crosses this boundary in the numpy interchange of docs/interfaces.md:
- `x`: numpy (B, H, T, d); float16/float32 as themselves, bfloat16 as uint16 bit patterns; the input
  dtype is always passed as a string ("float16" | "bfloat16" | "float32").
- record: dict[str, np.ndarray], field names/order as in spec/formats.toml.
- decoded values: float32 (B, H, T, d).
Errors must be `ValueError` naming the argument (spec/number-model.md, "Special values").

An adapter overrides what its implementation has; everything else raises `Unsupported`, which the suite
turns into a skip with the stated reason (never into a pass).
"""
from __future__ import annotations

import numpy as np
import pytest

from ...spec import METHODS, Params


class Unsupported(pytest.skip.Exception):
    """This implementation does not provide the requested operation.

    A pytest skip (with the reason) wherever it is raised, also inside hypothesis tests: a missing
    operation is reported as skipped, never as passed or failed."""

    def __init__(self, reason: str):
        super().__init__(reason)


class StreamHandle:
    """One live stream (one layer, one role, all heads) of an implementation, in numpy interchange."""

    def append(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def trim(self, n: int) -> int:
        raise NotImplementedError

    def record(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    @property
    def tokens(self) -> int:
        raise NotImplementedError

    def save(self):
        """An opaque, self-contained copy of the state (as if written to disk)."""
        raise NotImplementedError


class Implementation:
    """Base class of adapters. Override `name`, `methods`, and the operations the implementation has."""

    name: str = "unnamed"
    #: methods this implementation claims to support; tests of other methods are skipped
    methods: tuple[str, ...] = METHODS

    def unavailable(self) -> str | None:
        """A reason string if the implementation cannot run at all here (the suite stops with a usage error
        naming it: a run of skips would read as a pass), else None."""
        return None

    def set_device(self, device: str | None) -> None:
        """Select "cpu" or "gpu" (None: the implementation's default); ValueError for a device it cannot
        use. This default runs where it runs (device_name() says "cpu"), so it accepts None and "cpu" only."""
        if device not in (None, "cpu"):
            raise ValueError(f"--device {device}: {self.name} does not select devices (it runs on the CPU)")

    def device_name(self) -> str:
        return "cpu"

    def versions(self) -> dict[str, str]:
        """Extra version strings for the report (e.g. {"mlx": "0.32.4"})."""
        return {}

    # --- bit-exact tier -------------------------------------------------------------------------------
    def encode(self, x: np.ndarray, params: Params, dtype: str) -> dict[str, np.ndarray]:
        raise Unsupported(f"{self.name}: encode not provided")

    def decode(self, record: dict[str, np.ndarray], params: Params, dtype: str) -> np.ndarray:
        raise Unsupported(f"{self.name}: decode not provided")

    def new_stream(self, params: Params, dtype: str) -> StreamHandle:
        raise Unsupported(f"{self.name}: streams not provided")

    def load_stream(self, state) -> StreamHandle:
        """A stream restored from `StreamHandle.save()` of this implementation."""
        raise Unsupported(f"{self.name}: stream load not provided")

    def quantize(self, u: np.ndarray, codebook: tuple, d: int) -> np.ndarray:
        """Indices (uint32) of binary32 values `u` under a codebook scaled to head dim d (codebooks.md).

        `codebook` is ("gaussian", b) or ("residual", b1, b2)."""
        raise Unsupported(f"{self.name}: codebook quantize not provided")

    def dequantize(self, idx: np.ndarray, codebook: tuple, d: int) -> np.ndarray:
        """C_d[idx] as binary32 (codebooks.md)."""
        raise Unsupported(f"{self.name}: codebook dequantize not provided")

    def cast(self, values: np.ndarray, dtype: str) -> np.ndarray:
        """Decoded binary32 values cast to the model dtype "float16" or "bfloat16" (number-model.md
        'Outputs': RNE, overflow to ±Inf), in the numpy interchange (bfloat16 as uint16 patterns).
        Optional: the default raises Unsupported."""
        raise Unsupported(f"{self.name}: cast of decoded values not provided")

    # --- tolerance tier -------------------------------------------------------------------------------
    def attention(self, q: np.ndarray, k_record: dict, v_record: dict, k_params: Params, v_params: Params,
                  dtype: str, scale: float, mask: str | None = None) -> np.ndarray:
        """softmax(scale * q K^T + mask) V over the cache, float32 (B, Hq, Tq, d) (spec/attention.md).

        Hq is a multiple of H (query head i reads KV head i // (Hq // H)). `mask` is None (every token) or
        "causal" (the Tq queries are the last Tq tokens: query i sees tokens 0 .. T - Tq + i). `q` is
        float32 numpy. Optional: the default raises Unsupported."""
        raise Unsupported(f"{self.name}: attention not provided")

    def supports(self, method: str) -> bool:
        return method in self.methods
