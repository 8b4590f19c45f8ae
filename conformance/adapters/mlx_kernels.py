"""Adapter for fused MLX kernels (accelerated.kernels). Skips, with the reason, while they do not exist."""
from __future__ import annotations

import importlib

from .mlx_ops import MlxOpsImpl


class MlxKernelsImpl(MlxOpsImpl):
    name = "mlx_kernels"
    ops_module = "accelerated.kernels"

    def unavailable(self):
        try:
            importlib.import_module(self.ops_module)
        except ImportError as e:
            return f"no fused kernels: accelerated.kernels is not importable ({e})"
        return super().unavailable()
