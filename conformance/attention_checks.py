"""Tolerance-tier check functions (spec/attention.md): attention against a float64 evaluation of the same
formula within a per-output budget, the GQA head mapping, and the golden attention cases. Like checks.py (the
exact tier), each raises `assertions.Mismatch` (an AssertionError) when the implementation does not conform.
"""
from __future__ import annotations

import numpy as np

from .. import spec

from .assertions import Mismatch, assert_record_exact, call_desc
from .checks import _to_input_dtype

# --- tolerance tier -------------------------------------------------------------------------------------
# Budget for softmax(scale q K^T + mask) V in binary32 against float64 on the same decoded K, V:
# - logits: a d-term dot product, |error| <= d * u * sum|q_j k_j| (u = 2^-24, any summation order);
# - softmax: exp and the normalising sum add a relative error of a few u per term plus T * u for the sum;
# - output: a T-term weighted sum, |error| <= T * u * sum_t p_t |v_t| plus the propagated logit error
#   (d|logit error| of p_t, times |v|).
# ROTATED_DOMAIN_* (spec/attention.md 'Rotated domain'): the rotation family may take scores as
# <RHT(q), y^> and sum values before one RHT_inverse, instead of using the binary32-decoded x^ = RHT_inverse
# (y^). Equal in exact arithmetic; in binary32 each side's log2(d) butterfly stages and two scalings round,
# so a logit moves by up to (2 log2 d + 4) u |q| |k| and an output coordinate by up to
# (log2 d + 2) u sum_t p_t |v_t| (Euclidean norms: the butterfly mixes all coordinates).
# GROUP_DECODE (spec/attention.md 'Budget'): float32 mlx_affine may be decoded inside the attention as one
# fused multiply-add c*S + Bi (contraction is allowed in this tier), which skips the rounding of c*S: a decoded
# coordinate moves by up to u |c S| <= u (|x^| + |Bi|), so a logit gains u sum_j |q_j| |Bi_j| and an output
# coordinate u sum_t p_t |Bi_t| (|x^| is in the terms above). Where x^ = 0 exactly and T = 1 the other terms
# are 0: the H200 kernels returned -2^-25 there (c S = -Bi rounded once). kivi and 16-bit mlx_affine get no
# such term: c*S is exact in binary32 there (c <= 255, S a float16 / bfloat16 value), so a contracted decode
# has the same bits (and mlx_affine's 16-bit decode rounds c*S to T before the add).
# ATTN_SAFETY covers implementations that use a different but legitimate order (tiles, online softmax)
# and exp approximations within a few ulp. The bound is computed per output row from these terms.
U32 = 2.0 ** -24
ATTN_SAFETY = 8.0
ROTATED_METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "rabitq")


def causal_keep(tq: int, t: int) -> np.ndarray:
    """(Tq, T) bool: query i (position T - Tq + i) sees tokens 0 .. T - Tq + i (spec/attention.md)."""
    return np.arange(t)[None, :] <= (t - tq + np.arange(tq))[:, None]


def attention_f64(q, k, v, scale, mask=None):
    """float64 softmax attention, the tolerance tier's oracle; GQA by repeating KV heads."""
    rep = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), rep, axis=1)
    v = np.repeat(v.astype(np.float64), rep, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * float(scale)
    if mask == "causal":
        s = np.where(causal_keep(*s.shape[-2:]), s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v), p, k, v


def group_zero_magnitude(record, params, t: int, dtype: str = "float32") -> np.ndarray | None:
    """|Bi| of each decoded coordinate (B, H, T, d) of a float32 mlx_affine record (0 for window tokens, which
    are exact), for GROUP_DECODE; None for every other method and dtype (their c*S is exact)."""
    if params.method != "mlx_affine" or dtype != "float32":
        return None
    z = np.abs(np.asarray(record["biases" if params.method == "mlx_affine" else "zero"], dtype=np.float64))
    g = params.group_size
    if params.method == "kivi" and params.role == "k":
        z = np.repeat(z, g, axis=2)                      # (B, H, Q/G, d): one zero per channel and G tokens
    else:
        z = np.repeat(z, g, axis=3)                      # (B, H, Q, d/G): one zero per token and G channels
    out = np.zeros(z.shape[:2] + (t, z.shape[3]))
    out[:, :, :z.shape[2]] = z
    return out


def attention_budget(q, k64, v64, p, scale, rotated_k=False, rotated_v=False, kz=None, vz=None):
    d, T = q.shape[-1], k64.shape[2]
    q64 = np.abs(q.astype(np.float64)) * abs(float(scale))
    absdot = np.einsum("bhqd,bhkd->bhqk", q64, np.abs(k64))   # k64, v64: already one head per query head
    if kz is not None:          # GROUP_DECODE, keys: one skipped rounding of c*S per coordinate
        kz = np.repeat(kz, q.shape[1] // kz.shape[1], axis=1)
        absdot = absdot + np.einsum("bhqd,bhkd->bhqk", q64, kz) / (d + 2)
    logit_err = (d + 2) * U32 * absdot.max(axis=-1, keepdims=True)          # (b,h,q,1)
    if rotated_k:
        norms = np.linalg.norm(q64, axis=-1)[..., None] * np.linalg.norm(k64, axis=-1)[:, :, None, :]
        logit_err = logit_err + (2 * np.log2(d) + 4) * U32 * norms.max(axis=-1, keepdims=True)
    vmax = np.abs(v64).max(axis=2, keepdims=True)                            # (b,h,1,d)
    pv = np.einsum("bhqk,bhkd->bhqd", p, np.abs(v64))
    bound = (T + 4) * U32 * pv + 2 * logit_err * vmax + (T + 4) * U32 * vmax
    if vz is not None:          # GROUP_DECODE, values
        bound = bound + U32 * np.einsum("bhqk,bhkd->bhqd", p, np.repeat(vz, q.shape[1] // vz.shape[1], axis=1))
    if rotated_v:
        pnorm = np.einsum("bhqk,bhk->bhq", p, np.linalg.norm(v64, axis=-1))[..., None]
        bound = bound + (np.log2(d) + 2) * U32 * pnorm
    return ATTN_SAFETY * bound + np.finfo(np.float32).tiny


def check_attention(impl, ref, q, k_record, v_record, k_params, v_params, dtype, scale, mask=None) -> float:
    """impl.attention within the budget of the float64 evaluation on the reference-decoded K, V.
    Returns the worst error / budget ratio."""
    k = ref.decode(k_record, k_params, dtype)
    v = ref.decode(v_record, v_params, dtype)
    exp64, p, k64, v64 = attention_f64(q, k, v, scale, mask)
    got = np.asarray(impl.attention(q, k_record, v_record, k_params, v_params, dtype, scale, mask),
                     dtype=np.float64)
    h = k.shape[1]
    what = call_desc(f"{impl.name}.attention", k_params, dtype, q.shape, T=k.shape[2], scale=scale, mask=mask,
                     kv_heads=h, gqa=f"query head i reads KV head i // {q.shape[1] // h}")
    if got.shape != exp64.shape:
        raise Mismatch(f"{what}: shape {got.shape} != {exp64.shape}")
    budget = attention_budget(q, k64, v64, p, scale, k_params.method in ROTATED_METHODS,
                              v_params.method in ROTATED_METHODS,
                              group_zero_magnitude(k_record, k_params, k.shape[2], dtype),
                              group_zero_magnitude(v_record, v_params, v.shape[2], dtype))
    return _within_budget(got, exp64, budget, what, q.shape[1] // h, "")


def _within_budget(got, want, budget, what: str, rep: int, source: str) -> float:
    """The worst error / budget ratio of `got` (same shape as `want`); raises Mismatch when an output is not
    finite or over its budget, naming how many and the worst one with its KV head (`rep` query heads per KV
    head). `source` prefixes the expectation's name in the message ("" or "golden ")."""
    err = np.abs(got - want)
    ratio = err / budget
    if not np.all(np.isfinite(got)) or np.any(~(ratio <= 1)):
        i = tuple(int(j) for j in np.unravel_index(int(np.nanargmax(np.where(np.isfinite(ratio), ratio, np.inf))),
                                                    ratio.shape))
        raise Mismatch(f"{what}: {int((~(ratio <= 1)).sum())} of {ratio.size} outputs exceed the {source}budget; "
                       f"worst at (b, query head, query, coord) {i} (KV head {i[1] // rep}): got {got[i]!r}, "
                       f"{source}float64 {want[i]!r}, error {err[i]:.3e} > budget {budget[i]:.3e}")
    return float(ratio.max())


def check_attention_head_mapping(impl, ref, method: str, rep: int, dtype: str = "float32") -> None:
    """Second check of the GQA mapping, independent of the budget: KV heads whose values are constant and
    different (head j's values are all 8(j + 1)) make query head i's output KV head i // rep's decoded
    constant, whatever the softmax weights; another mapping returns another head's constant."""
    h, t, d = 3, 50, 64
    rng = np.random.default_rng(rep)
    kw = dict(group_size=32) if method in ("kivi", "mlx_affine") else {}
    kp = spec.Params(method, window=0, role="k", **kw).resolved()
    vp = spec.Params(method, window=0, role="v", **kw).resolved()
    k = rng.standard_normal((1, h, t, d)).astype(np.float32)
    v = np.broadcast_to(8 * np.arange(1, h + 1, dtype=np.float32)[None, :, None, None], (1, h, t, d)).copy()
    if dtype != "float32":
        k, v = _to_input_dtype(k, dtype), _to_input_dtype(v, dtype)
    q = rng.standard_normal((1, h * rep, 2, d)).astype(np.float32)
    krec, vrec = ref.encode(k, kp, dtype), ref.encode(v, vp, dtype)
    got = np.asarray(impl.attention(q, krec, vrec, kp, vp, dtype, 0.125, None))
    vd = ref.decode(vrec, vp, dtype)   # decoded constants (lossy, per head)
    means = [vd[0, j].mean(axis=0) for j in range(h)]
    for i in range(h * rep):
        errs = [float(np.abs(got[0, i] - means[j]).max()) for j in range(h)]
        want = i // rep
        if not errs[want] < 1e-3 * float(np.abs(means[want]).max()):
            raise Mismatch(
                f"{call_desc(impl.name + '.attention', kp, dtype, q.shape, kv_heads=h)}: query head {i} (GQA: "
                f"{rep} query heads per KV head, {h} KV heads) should read KV head {want}; its output is "
                f"closest to KV head {int(np.argmin(errs))} (max error per KV head {[f'{e:.3g}' for e in errs]})")


def check_golden_attention(impl, case) -> float:
    """A golden attention case (golden_format.AttentionCase): impl.attention over the stored records is finite
    and within the stored budget of the stored float64 output (spec/attention.md 'Budget'); stored inputs
    encode to the stored records. Returns the worst error / budget ratio."""
    for role, x, rec, p in (("k", case.k_x, case.k_record, case.k_params), ("v", case.v_x, case.v_record,
                                                                            case.v_params)):
        if x is not None:
            what = call_desc(f"{impl.name}.encode", p, case.dtype, x.shape, golden=case.id, role=role)
            assert_record_exact(impl.encode(np.array(x, copy=True), p, case.dtype), rec, what)
    got = np.asarray(impl.attention(np.array(case.q, copy=True), {k: v.copy() for k, v in case.k_record.items()},
                                    {k: v.copy() for k, v in case.v_record.items()}, case.k_params, case.v_params,
                                    case.dtype, case.scale, case.mask), dtype=np.float64)
    h = case.k_record["window"].shape[1]
    rep = case.q.shape[1] // h
    what = call_desc(f"{impl.name}.attention", case.k_params, case.dtype, case.q.shape, golden=case.id,
                     scale=case.scale, mask=case.mask, kv_heads=h, gqa=f"query head i reads KV head i // {rep}")
    if got.shape != case.out.shape:
        raise Mismatch(f"{what}: shape {got.shape} != {case.out.shape}")
    return _within_budget(got, case.out, case.budget, what, rep, "golden ")
