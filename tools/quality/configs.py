"""The configurations `veloxquant distortion` sweeps, and one configuration's encode/decode round trip through
accelerated.ops (shared by the sweep, tools/quality/distortion_measure.py, and the budget recommendation, budget.py)."""
from __future__ import annotations

import numpy as np

# (method, bits, bits2): turboquant_rvq as bits + bits2; turboquant_prod's bits count its QJL bit.
GRID = ([("turboquant", b, None) for b in (1, 2, 3, 4)]
        + [("turboquant_rvq", b, b2) for b, b2 in ((1, 1), (2, 1), (2, 2), (3, 1))]
        + [("turboquant_prod", b, None) for b in (2, 3, 4)]
        + [("kivi", b, None) for b in (1, 2, 3, 4)]
        + [("rabitq", 1, None)]
        + [("mlx_affine", b, None) for b in (2, 4, 8)])
KIVI_GROUP, AFFINE_GROUP = 32, 32       # the trained-model sweep's group sizes (tools/quality/caches.py)


def label(method: str, bits: int, bits2) -> str:
    return f"{method} {bits}+{bits2}" if bits2 else f"{method} b{bits}"


def params(method: str, bits: int, bits2, role: str, seed: int = 0, layer: int = 0, group: dict | None = None):
    from ... import spec

    kw = dict(bits=bits, window=0, seed=seed, layer=layer, role=role)
    if bits2:
        kw["bits2"] = bits2
    g = group or {}
    if method == "kivi":
        kw["group_size"] = g.get("kivi", KIVI_GROUP)
    if method == "mlx_affine":
        kw["group_size"] = g.get("mlx_affine", AFFINE_GROUP)
    return spec.Params(method, **kw)


def quantize(x: np.ndarray, p, dtype: str) -> tuple[np.ndarray, float]:
    """x (B, H, T, d) through encode/decode: (x̂ float32, stored bits per coordinate of the record)."""
    import mlx.core as mx
    from ...accelerated import ops

    xm = mx.array(x)
    if dtype == "float16":
        xm = xm.astype(mx.float16)
    rec = ops.encode(xm, p, dtype)
    xh = np.array(ops.decode(rec, p, dtype), dtype=np.float32)
    nbytes = sum(int(v.nbytes) for k, v in rec.items() if k != "window")
    return xh, 8.0 * nbytes / x.size
