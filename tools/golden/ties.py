"""Golden tie cases' inputs: x = (p, q, 0, ...) at d = 16 whose rotated coordinates land exactly on a codebook
value (or a midpoint between two), so an implementation that rounds a tie the wrong way fails. The case tables
(cases.py) take the inputs from here; `verify_tie` re-checks each one on the reference."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ... import spec
from .inputs import InputRng, bf16_to_f32, cast_input, upcast


def _h(*hexes: str) -> list[float]:
    return [float.fromhex(h) for h in hexes]


# Inputs with two non-zero coordinates at d = 16 land u exactly on a codebook value: the RHT of
# x = (p, q, 0, ..., 0) has |y_j| = |p ± q| × s_16 in every coordinate (all other butterfly steps add
# zeros), so u_j = fl(fl(|p ± q| × 0.25) × fl(1/n)). The pairs below were found by an exhaustive search
# over the input dtype's values (`find_tie_inputs`); the generator re-checks each one on the reference's
# own intermediate u (`reference.turboquant.rotate_to_unit`) and refuses to write a case that misses.
TIE_INPUTS = {
    # (table, dtype): (p, q)                    target: u on a boundary of gaussian[b] at d = 16
    ("gaussian2", "float16"): _h("0x1.268p+0", "-0x1.57cp-6"),
    ("gaussian4", "float16"): _h("0x1.2e8p+0", "0x1.fep-4"),
    ("gaussian4", "bfloat16"): _h("0x1.e4p+0", "0x1.98p-3"),
    ("gaussian2", "float32"): _h("0x1.1f68c6p+0", "-0x1.4f790ep-6"),
    ("gaussian3", "float32"): _h("0x1.e61950p+0", "-0x1.b66128p-1"),
    ("gaussian4", "float32"): _h("0x1.c38382p+0", "-0x1.854f64p-1"),
    # turboquant_rvq: u on a stage-1 centroid (residual e = ±0) / residual on a stage-2 boundary
    ("centroid1", "float16"): _h("0x1.154p+0", "-0x1.a14p-3"),
    ("centroid2", "float32"): _h("0x1.2b845cp+0", "-0x1.286a2p-1"),
    ("residual2.2", "float16"): _h("0x1.514p+0", "0x1.6a4p-3"),
}


def _tie_x(p: float, q: float, dtype: str) -> np.ndarray:
    """Two tokens per head, two heads: (p, q), (q, p), and both scaled by 2^3 (u is scale invariant)."""
    x = np.zeros((1, 2, 2, 16), dtype=np.float64)
    x[0, 0, 0, :2] = (p, q)
    x[0, 0, 1, :2] = (q, p)
    x[0, 1, 0, :2] = (8 * p, 8 * q)
    x[0, 1, 1, 0], x[0, 1, 1, 9] = p, q     # positions 0 and 9: same magnitudes through H
    return cast_input(x, dtype)


def _tie_targets(table: str) -> tuple[np.ndarray, Callable]:
    """(values u may hit, predicate on u) for a tie table name."""
    from ...reference import codebooks as rcb
    if table.startswith("gaussian"):
        b = int(table[-1])
        _c, bd = rcb.gaussian(b, 16)
        return bd, lambda u: np.isin(u, bd[bd != 0])
    if table.startswith("centroid"):
        b = int(table[-1])
        cd, _b = rcb.gaussian(b, 16)
        return cd, lambda u: np.isin(u, cd)
    b, b2 = (int(v) for v in table[len("residual"):].split("."))
    c1, b1 = rcb.gaussian(b, 16)
    _c2, bb2 = rcb.residual(b, b2, 16)

    def pred(u):
        e = u - c1[rcb.quantize(u, b1)]
        return np.isin(e, bb2[bb2 != 0])
    return bb2, pred


def verify_tie(x: np.ndarray, dtype: str, params: spec.Params, table: str) -> int:
    """Number of coordinates whose reference-computed u hits the tie target (0 means no tie)."""
    from ...reference import turboquant as rtq
    p = params.resolved()
    xf = upcast(x, dtype)
    _n, _r, _y, u, _s = rtq.rotate_to_unit(xf, p)
    _vals, pred = _tie_targets(table)
    return int(pred(u).sum())


# ----------------------------------------------------------------------------------------------------
# Offline helper: the search that picked TIE_INPUTS (not run by regen/check)

def find_tie_inputs(table: str, dtype: str, limit: int = 8) -> list[tuple[float, float]]:
    """Pairs (p, q) of `dtype` values with u of x = (p, q, 0, ...) at d = 16 on the tie target of `table`.
    Exhaustive over p in [1, 2) and |q| in [2^-6, 2) for float16/bfloat16, sampled for float32."""
    _vals, pred = _tie_targets(table)
    if dtype == "float16":
        allv = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    elif dtype == "bfloat16":
        allv = bf16_to_f32(np.arange(0, 0x7F80, dtype=np.uint16))
    else:
        rng = InputRng(f"ties-{table}")
        allv = (rng.ints(1 << 15, 1 << 22, 1 << 25).astype(np.float64) * 2.0 ** -24).astype(np.float32)
    ps = allv[(allv >= 1) & (allv < 2)]
    qs = allv[(allv >= 2.0 ** -6) & (allv < 2)]
    qs = np.concatenate([qs, -qs])
    s, one = np.float32(0.25), np.float32(1)
    hits = []
    for p in ps:
        n = np.sqrt(p * p + qs * qs)
        r = one / n
        for v in (np.abs(p + qs), np.abs(p - qs)):
            u = (v * s) * r
            for q in qs[pred(u) | pred(-u)]:
                hits.append((float(p), float(q)))
        if len(hits) >= limit:
            break
    return hits[:limit]
