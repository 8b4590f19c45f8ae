"""Golden attention cases (spec 1.2, spec/attention.md): `bulk/attention.npz` plus one `[[attention]]` entry
per case in the manifest.

Each case: queries q (float32), the key and value records (from the reference's encode of inputs made here;
the inputs are stored too, except for the long case, whose records alone are what attention reads), the
scale (a binary32 value), the mask, and per output the float64 value of spec/attention.md's formula on the
decoded records and its budget (attention.md 'Budget'). Both are computed with exactly rounded sums
(`math.fsum`) of exact float64 products and `math.exp`, so they do not depend on numpy's summation order.

Cases: every method with GQA (2 query heads per KV head), a causal mask over 3 query rows and windows in
both records; every method without a mask with 3 query heads per KV head; and one record of 2080 tokens
(longer than one 2048-token block of the MLX ops path) whose largest logit is at token 2070, so an online
softmax that merges blocks without rescaling the earlier block fails it.
"""
from __future__ import annotations

import math

import numpy as np

from ... import spec
from .inputs import InputRng, cast_input, random_input

FILE = "bulk/attention.npz"
U = 2.0 ** -24
SAFETY = 8.0
TINY = 2.0 ** -126
ROTATED = ("turboquant", "turboquant_rvq", "turboquant_prod", "rabitq")
LONG_T, LONG_PEAK = 2080, 2070


class AttentionCase:
    """One golden attention case (what the generator makes and the manifest/npz hold)."""

    def __init__(self, id, method, k_params, v_params, dtype, scale, mask, flags, comment, q, k_x=None,
                 v_x=None, k_record=None, v_record=None, out=None, budget=None):
        self.id, self.method, self.k_params, self.v_params = id, method, k_params, v_params
        self.dtype, self.scale, self.mask, self.flags, self.comment = dtype, scale, mask, tuple(flags), comment
        self.q, self.k_x, self.v_x, self.k_record, self.v_record = q, k_x, v_x, k_record, v_record
        self.out, self.budget = out, budget
        self.file = FILE


def _params(method, role, window, **kw):
    g = {"group_size": 16} if method == "kivi" else ({"group_size": 32} if method == "mlx_affine" else {})
    return spec.Params(method, window=window, role=role, seed=0x5EED, layer=3, head_offset=1, **g, **kw).resolved()


def case_defs(methods) -> list[AttentionCase]:
    out = []
    dts = ("float16", "bfloat16", "float32")
    for i, m in enumerate(methods):
        d = 32 if m == "mlx_affine" else 16
        dt = dts[i % 3]
        cid = f"attention-{m}-gqa-causal-000"
        h, rep, t, tq = 2, 2, 24, 3
        q = InputRng(cid + "/q").normalish((1, h * rep, tq, d)).astype(np.float32)
        out.append(AttentionCase(cid, m, _params(m, "k", 5), _params(m, "v", 5), dt,
                                 float(np.float32(1 / math.sqrt(d))), "causal",
                                 ("attention-gqa", "attention-causal", "window"),
                                 f"spec/attention.md: GQA (query head i reads KV head i // {rep}), causal mask over "
                                 f"the last {tq} of T = {t} tokens, window R = 5 in both records, {dt}", q,
                                 random_input(cid + "/k", (1, h, t, d), dt, "normal"),
                                 random_input(cid + "/v", (1, h, t, d), dt, "normal")))
        dt2 = dts[(i + 1) % 3]
        cid = f"attention-{m}-plain-001"
        h, rep, t, tq = 2, 3, 20, 2
        q = (InputRng(cid + "/q").normalish((1, h * rep, tq, d)) * 2.0).astype(np.float32)
        out.append(AttentionCase(cid, m, _params(m, "k", 0), _params(m, "v", 0), dt2, 0.3, None,
                                 ("attention-gqa", "attention-plain"),
                                 f"spec/attention.md: no mask, {rep} query heads per KV head, T = {t}, scale 0.3 "
                                 f"(rounded to binary32), {dt2}", q,
                                 random_input(cid + "/k", (1, h, t, d), dt2, "outliers"),
                                 random_input(cid + "/v", (1, h, t, d), dt2, "normal")))
    if "turboquant" in methods:
        cid = "attention-turboquant-long-002"
        d = 16
        rng = InputRng(cid)
        k = rng.normalish((1, 1, LONG_T, d))
        v = rng.normalish((1, 1, LONG_T, d))
        q = rng.normalish((1, 2, 1, d))
        k[0, 0, LONG_PEAK] = q[0, 0, 0] * 3.0              # the largest logit of query head 0, in block 2
        k[0, 0, LONG_PEAK - 1] = q[0, 1, 0] * 3.0          # the largest logit of query head 1
        v[0, 0, LONG_PEAK] = 4.0
        kp = spec.Params("turboquant", bits=2, window=0, role="k", seed=7).resolved()
        vp = spec.Params("turboquant", bits=2, window=0, role="v", seed=7).resolved()
        from ... import reference
        kx, vx = cast_input(k, "float16"), cast_input(v, "float16")
        c = AttentionCase(cid, "turboquant", kp, vp, "float16", 0.5, None, ("attention-long",),
                          f"spec/attention.md over T = {LONG_T} > 2048 tokens (two blocks of the MLX ops path): "
                          f"the largest logit of each query head is at token {LONG_PEAK} or {LONG_PEAK - 1}, in "
                          "the second block, so merging blocks without rescaling the first block's sums fails "
                          "(records only: the inputs are not stored)", q.astype(np.float32))
        c.k_record, c.v_record = reference.encode(kx, kp, "float16"), reference.encode(vx, vp, "float16")
        out.append(c)
    return out


def _fsum_rows(a: np.ndarray) -> np.ndarray:
    """math.fsum over the last axis (exactly rounded, order-independent)."""
    flat = a.reshape(-1, a.shape[-1])
    return np.array([math.fsum(r) for r in flat.tolist()], dtype=np.float64).reshape(a.shape[:-1])


def _group_bias(record, params, dtype, t):
    """|Bi| per decoded coordinate (H, T, d) for float32 mlx_affine (GROUP_DECODE), else None."""
    if params.method != "mlx_affine" or dtype != "float32":
        return None
    z = np.repeat(np.abs(np.asarray(record["biases"], np.float64)), params.group_size, axis=3)[0]
    out = np.zeros((z.shape[0], t, z.shape[2]))
    out[:, :z.shape[1]] = z
    return out


def evaluate(c: AttentionCase) -> None:
    """Fill c.out and c.budget (float64, (1, Hq, Tq, d)) from the records (spec/attention.md)."""
    from ... import reference
    if c.k_x is not None:
        c.k_record = reference.encode(c.k_x, c.k_params, c.dtype)
        c.v_record = reference.encode(c.v_x, c.v_params, c.dtype)
    kd = reference.decode(c.k_record, c.k_params, c.dtype)[0].astype(np.float64)     # (H, T, d)
    vd = reference.decode(c.v_record, c.v_params, c.dtype)[0].astype(np.float64)
    kz = _group_bias(c.k_record, c.k_params, c.dtype, kd.shape[1])
    vz = _group_bias(c.v_record, c.v_params, c.dtype, vd.shape[1])
    q = c.q[0].astype(np.float64)
    hq, tq, d = q.shape
    h, t = kd.shape[0], kd.shape[1]
    rep = hq // h
    scale = float(np.float32(c.scale))
    out = np.zeros((hq, tq, d))
    budget = np.zeros((hq, tq, d))
    log2d = math.log2(d)
    for i in range(hq):
        kh, vh = kd[i // rep], vd[i // rep]
        knorm_max = max(math.sqrt(math.fsum((r * r).tolist())) for r in kh)
        vnorm = np.array([math.sqrt(math.fsum((r * r).tolist())) for r in vh])
        for l in range(tq):
            qt = abs(scale) * np.abs(q[i, l])
            logits = _fsum_rows(q[i, l][None, :] * kh) * scale          # exact products, one rounding
            visible = t if c.mask is None else t - tq + l + 1
            mx = max(logits[:visible].tolist())
            e = np.array([math.exp(x - mx) for x in logits[:visible].tolist()] + [0.0] * (t - visible))
            p = e / math.fsum(e.tolist())
            out[i, l] = _fsum_rows((p[:, None] * vh).T)
            absdot = _fsum_rows(qt[None, :] * np.abs(kh))
            if kz is not None:
                absdot = absdot + _fsum_rows(qt[None, :] * kz[i // rep]) / (d + 2)
            err = (d + 2) * U * float(absdot.max())
            if c.k_params.method in ROTATED:
                err += (2 * log2d + 4) * U * math.sqrt(math.fsum((qt * qt).tolist())) * knorm_max
            vmax = np.abs(vh).max(axis=0)
            pv = _fsum_rows((p[:, None] * np.abs(vh)).T)
            b = (t + 4) * U * pv + 2 * err * vmax + (t + 4) * U * vmax
            if vz is not None:
                b = b + U * _fsum_rows((p[:, None] * vz[i // rep]).T)
            if c.v_params.method in ROTATED:
                b = b + (log2d + 2) * U * math.fsum((p * vnorm).tolist())
            budget[i, l] = SAFETY * b + TINY
    c.out, c.budget = out[None], budget[None]


def generate(methods) -> list[AttentionCase]:
    cases = case_defs(methods)
    for c in cases:
        evaluate(c)
    _check(cases)
    return cases


def _check(cases) -> None:
    """The long case's largest logits are in the second 2048-token block (else it pins nothing)."""
    from ... import reference
    from .cases import GenerationError
    for c in cases:
        if "attention-long" not in c.flags:
            continue
        kd = reference.decode(c.k_record, c.k_params, c.dtype)[0, 0].astype(np.float64)
        for i in range(c.q.shape[1]):
            if int(np.argmax(kd @ c.q[0, i, 0].astype(np.float64) * c.scale)) < 2048:
                raise GenerationError(f"{c.id}: query head {i}'s largest logit is in the first block")


def arrays(c: AttentionCase) -> dict[str, np.ndarray]:
    out = {"q": c.q}
    for role, x, rec in (("k", c.k_x, c.k_record), ("v", c.v_x, c.v_record)):
        if x is not None:
            out[f"{role}/x"] = x
        for f, a in rec.items():
            out[f"{role}/record/{f}"] = a
    out["out"] = c.out
    out["budget"] = c.budget
    return out


def manifest_entry(c: AttentionCase) -> dict:
    from ...conformance.golden_format import params_to_toml
    return {"id": c.id, "method": c.method, "file": c.file, "dtype": c.dtype,
            "scale": float(np.float32(c.scale)).hex(), "mask": c.mask or "none",
            "q_shape": list(c.q.shape), "kv_shape": _kv_shape(c.k_record),
            "flags": list(c.flags), "comment": c.comment,
            "k_params": params_to_toml(c.k_params), "v_params": params_to_toml(c.v_params)}


def _kv_shape(rec) -> list[int]:
    """(B, H, T, d): the first field is per-token codes for every method, so T = its rows + the window's."""
    w = rec["window"]
    q = next(v for k, v in rec.items() if k != "window").shape[2]
    return [int(w.shape[0]), int(w.shape[1]), int(q + w.shape[2]), int(w.shape[3])]
