"""Adapters: each turns one implementation into `base.Implementation` (numpy interchange).

`load(name)` accepts the built-in names or `module:factory` (factory() returns an Implementation).
"""
from __future__ import annotations

import importlib

from .base import Implementation, StreamHandle, Unsupported

BUILTIN = {
    "reference": "veloxquant.conformance.adapters.reference:ReferenceImpl",
    "mlx_ops": "veloxquant.conformance.adapters.mlx_ops:MlxOpsImpl",
    "mlx_kernels": "veloxquant.conformance.adapters.mlx_kernels:MlxKernelsImpl",
    "mlx_native": "veloxquant.conformance.adapters.mlx_native:MlxNativeImpl",
}


def load(spec: str) -> Implementation:
    """An Implementation from a built-in name or `package.module:factory`."""
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"--impl: {spec!r} is neither one of {sorted(BUILTIN)} nor 'module:factory'")
    modname, attr = target.split(":", 1)
    try:
        factory = getattr(importlib.import_module(modname), attr)
    except ImportError as e:
        raise ImportError(f"--impl: cannot import {modname!r} ({e})") from None
    except AttributeError:
        raise AttributeError(f"--impl: module {modname!r} has no factory {attr!r}") from None
    impl = factory()
    if not isinstance(impl, Implementation):
        raise TypeError(f"--impl: {spec} returned {type(impl).__name__}, not conformance.adapters.base.Implementation")
    return impl


__all__ = ["Implementation", "StreamHandle", "Unsupported", "load", "BUILTIN"]
