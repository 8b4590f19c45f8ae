"""The measurement core of `veloxquant distortion` (tools/quality/distortion.py, the command, imports it; this
module imports nothing of the command's): the metrics, the papers' figures, the data and the rows of the sweep.

Every configuration is quantized through the public API (accelerated.ops.encode / decode, window 0) and
compared with its input:
- **D_mse** = mean ‖x̂ − x‖² / ‖x‖²: the *total* squared error of a unit vector, the quantity TurboQuant's
  paper (arXiv 2504.19874, Theorem 1) states (0.36, 0.117, 0.03, 0.009 at b = 1..4); the per-coordinate
  MSE is D_mse / d.
- inner products ⟨q, x̂⟩ against ⟨q, x⟩, both divided by ‖q‖‖x‖: the relative bias is the least-squares
  slope minus 1 (an MSE quantizer shrinks inner products: the paper's 2/π at b = 1, slope − 1 = −0.36);
  the spread is d · Var(error), which for unit q and x is d · D_prod, the paper's Theorem 2 quantity
  (D_prod ≤ √3 π² / d · 4^−b for turboquant_prod).
Data: (1) unit vectors uniform on the sphere (normalised Gaussians), d = 64, 128, 256, float16, random unit
queries (independent ones for the spread, ones correlated 0.5 with x for the slope, where the slope is
well determined); (2) the committed trained byte model's keys and values (tools/quality/trained/, post-RoPE
float16 as the cache receives them) with its own queries for the keys (the attention logits) and random
unit queries for the values; (3) with --retrieval-model, the same of a retrieval_train export.
kivi and mlx_affine also get the round-to-nearest check: the largest |x̂ − x| over half a quantization
step of its group (≤ 1 for exact round-to-nearest; the stored float16 scale and zero move it).
"""
from __future__ import annotations

import math
import pathlib
import time

import numpy as np

from .configs import AFFINE_GROUP, KIVI_GROUP, label, params, quantize
from .papers import SQRT3_PI2, SQRT3_PI_2, TQ_PAPER_DMSE


# ---- metrics ---------------------------------------------------------------------------------------
def mse_metrics(x: np.ndarray, xh: np.ndarray) -> dict:
    d = x.shape[-1]
    n2 = (x.astype(np.float64) ** 2).sum(-1)
    rel = ((xh.astype(np.float64) - x) ** 2).sum(-1) / np.maximum(n2, 1e-30)
    dmse = float(rel.mean())
    return {"d_mse": dmse, "d_mse_se": float(rel.std() / math.sqrt(rel.size)), "mse_per_coord": dmse / d}


def ip_metrics(q: np.ndarray, x: np.ndarray, xh: np.ndarray, d: int) -> dict:
    """Inner products of paired rows q[i], x[i] (any leading shape), each divided by ‖q‖‖x‖."""
    q, x, xh = (a.reshape(-1, a.shape[-1]).astype(np.float64) for a in (q, x, xh))
    s = 1.0 / np.maximum(np.linalg.norm(q, axis=1) * np.linalg.norm(x, axis=1), 1e-30)
    true = (q * x).sum(1) * s
    est = (q * xh).sum(1) * s
    return _ip_stats(true, est, d)


def _ip_stats(true: np.ndarray, est: np.ndarray, d: int) -> dict:
    err = est - true
    slope = float((est * true).sum() / (true * true).sum())
    resid = est - slope * true
    slope_se = float(math.sqrt(resid.var() / (true * true).sum()))
    return {"ip_rel_bias": slope - 1.0, "ip_rel_bias_se": slope_se, "ip_mean_err": float(err.mean()),
            "ip_d_var": float(d * err.var()), "ip_d_mse": float(d * (err * err).mean())}


def rtn_ratio(x: np.ndarray, xh: np.ndarray, bits: int, group: int, axis: str) -> float:
    """max |x̂ − x| / (half a step of its group), step = (max − min) / (2^b − 1); axis "d" groups along
    the head dim per token, "t" groups tokens per channel (kivi keys)."""
    a, e = x.astype(np.float64), np.abs(xh.astype(np.float64) - x)
    if axis == "t":
        a, e = np.swapaxes(a, -1, -2), np.swapaxes(e, -1, -2)
    sh = a.shape[:-1] + (a.shape[-1] // group, group)
    a, e = a.reshape(sh), e.reshape(sh)
    half = (a.max(-1) - a.min(-1)) / (2**bits - 1) / 2
    ok = half > 0
    return float((e.max(-1)[ok] / half[ok]).max())


def paper_figures(method: str, bits: int, d: int) -> dict:
    """The papers' stated figures and bounds for one configuration (None where a paper states none)."""
    out = {"d_mse_paper": None, "d_mse_upper": None, "d_mse_lower": None, "ip_d_var_upper": None,
           "ip_d_var_lower": None, "ip_unbiased": None, "ip_d_var_expected": None}
    if method == "turboquant":
        out.update(d_mse_paper=TQ_PAPER_DMSE[bits], d_mse_upper=SQRT3_PI_2 * 4.0**-bits, d_mse_lower=4.0**-bits,
                   ip_unbiased=False)
    elif method == "turboquant_prod":
        # Theorem 2: unbiased, d·D_prod <= sqrt(3) pi^2 4^-b for unit y (lower bound 4^-b, Theorem 3);
        # expected from the construction: pi/2 · D_mse(b-1) (QJL variance, Lemma 4).
        from ... import spec

        g = spec.gaussian(bits - 1)
        out.update(ip_d_var_upper=SQRT3_PI2 * 4.0**-bits, ip_d_var_lower=4.0**-bits,
                   ip_unbiased=True, ip_d_var_expected=math.pi / 2 * _lloyd_max_d(g))
    elif method == "rabitq":
        # RaBitQ (arXiv 2405.12497): unbiased, error O(1/sqrt(d)); the scale of its bound, with
        # <o_bar, o> ~ sqrt(2/pi): (1 - 2/pi) / (2/pi) · d / (d - 1).
        a2 = 2 / math.pi
        out.update(ip_unbiased=True, ip_d_var_expected=(1 - a2) / a2 * d / (d - 1))
    return out


def _lloyd_max_d(table) -> float:
    """N(0,1) MSE of a codebook (centroids, boundaries), float64 by numeric integration."""
    c = np.asarray(table.centroids if hasattr(table, "centroids") else table["centroids"], dtype=np.float64)
    b = np.asarray(table.boundaries if hasattr(table, "boundaries") else table["boundaries"], dtype=np.float64)
    z = np.linspace(-9, 9, 200001)
    pdf = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    idx = np.searchsorted(b, z)
    return float(np.trapezoid((z - c[idx]) ** 2 * pdf, z))


def qjl_ablation(d: int, mse_bits: int, n: int, reps: int, seed: int) -> dict:
    """turboquant_prod's inner-product bias with the QJL sketch through a Gaussian matrix S (the paper's
    Algorithm 2, ê = √(π/2)/d · γ · Sᵀ sign(S e)) and through a sign-flipped orthonormal Hadamard matrix
    (the spec's, ê = A_d · γ · Hᵀ sign(H e)), on the same unit vectors, numpy, in the rotated domain (the
    data are isotropic, so the first rotation is left out). Bias = slope − 1 as in the sweep, mean ± se of
    `reps` independent draws of the projection."""
    from ... import spec

    if d & (d - 1):
        raise ValueError(f"d: the ablation's Hadamard matrix needs a power of two, got {d}")
    rng = np.random.default_rng(seed)
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    h /= math.sqrt(d)
    cb = spec.gaussian(mse_bits)
    c, b = cb.centroids / math.sqrt(d), cb.boundaries / math.sqrt(d)
    out = {}
    for kind in ("gaussian", "hadamard"):
        slopes = []
        for _ in range(reps):
            u = rng.standard_normal((n, d))
            u /= np.linalg.norm(u, axis=1, keepdims=True)
            xm = c[np.searchsorted(b, u)]
            e = u - xm
            g = np.linalg.norm(e, axis=1, keepdims=True)
            if kind == "hadamard":
                p = h * rng.choice([-1.0, 1.0], size=(1, d))
                eh = math.sqrt(math.pi / (2 * d)) * g * (np.sign(e @ p.T) @ p)
            else:
                sm = rng.standard_normal((d, d))
                eh = math.sqrt(math.pi / 2) / d * g * (np.sign(e @ sm.T) @ sm)
            q = correlated_queries(u, 0.5, rng).astype(np.float64)
            t = (q * u).sum(1)
            est = (q * (xm + eh)).sum(1)
            slopes.append(float((est * t).sum() / (t * t).sum() - 1))
        out[kind] = {"bias": float(np.mean(slopes)), "se": float(np.std(slopes, ddof=1) / math.sqrt(reps))}
    return {"d": d, "bits": mse_bits + 1, "vectors": n, "reps": reps, **out}


# ---- data -------------------------------------------------------------------------------------------
def sphere(n_heads: int, tokens: int, d: int, rng) -> np.ndarray:
    x = rng.standard_normal((1, n_heads, tokens, d))
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def correlated_queries(x: np.ndarray, rho: float, rng) -> np.ndarray:
    """Unit queries with ⟨q, x/‖x‖⟩ = rho exactly (the rest of q uniform orthogonal to x)."""
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    z = rng.standard_normal(x.shape)
    z -= (z * u).sum(-1, keepdims=True) * u
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    return (rho * u + math.sqrt(1 - rho * rho) * z).astype(np.float32)


def trained_activations(head_dim: int, sequences: int, length: int, seed: int) -> dict:
    """Queries, keys and values of the committed trained model on held-out windows, per layer:
    {"q": [(1, Hq, T, d)], "k": [(1, Hkv, T, d)], "v": ...} (float16 arrays as numpy float16)."""
    import mlx.core as mx
    from mlx_lm.models import llama

    from . import trained_model as tm

    model = tm.load_model(head_dim)
    wins = tm.eval_windows(tm.corpus_bytes("heldout"), length, sequences, seed)
    return model_activations(model, wins)


def retrieval_activations(model_dir: pathlib.Path) -> dict:
    """The same for the committed retrieval model (retrieval_train export) on the held-out windows its
    heldout.json carries (so no corpus is needed)."""
    from . import retrieval_train as qrt

    import mlx.core as mx

    model, _ = qrt.load_run(model_dir)
    model.set_dtype(mx.float32)    # computed in float32 (MLX's CPU float16 matmul is ~30x slower), handed on as float16
    return model_activations(model, [w[:-1] for w in qrt.load_record(model_dir)["windows"]])


def model_activations(model, wins) -> dict:
    """Queries, keys and values (post-RoPE, float16) that `model` hands its attention, per layer, over `wins`."""
    import mlx.core as mx
    from mlx_lm.models import llama

    grabbed: list = []
    orig = llama.scaled_dot_product_attention

    def spy(queries, keys, values, *a, **kw):
        grabbed.append((queries, keys, values))
        return orig(queries, keys, values, *a, **kw)

    out = {"q": [], "k": [], "v": []}
    llama.scaled_dot_product_attention = spy
    try:
        per_seq = []
        for w in wins:
            grabbed.clear()
            mx.eval(model(mx.array(w[None].astype(np.int32))))
            per_seq.append([tuple(np.array(a.astype(mx.float16)) for a in g) for g in grabbed])
    finally:
        llama.scaled_dot_product_attention = orig
    for layer in range(len(per_seq[0])):
        for i, role in enumerate("qkv"):     # sequences side by side as extra heads-worth of tokens
            out[role].append(np.concatenate([s[layer][i] for s in per_seq], axis=2))
    return out


# ---- the sweep ----------------------------------------------------------------------------------------
def synthetic_rows(d: int, tokens: int, heads: int, seed: int, grid, progress) -> list[dict]:
    rng = np.random.default_rng(seed + d)
    # float16 as a cache receives it; the rounded vectors are the reference (norms 1 within 1e-3)
    x = sphere(heads, tokens, d, rng).astype(np.float16).astype(np.float32)
    q_ind = sphere(heads, tokens, d, rng)
    q_cor = correlated_queries(x, 0.5, rng)
    rows = []
    for m, b, b2 in grid:
        t0 = time.time()
        p = params(m, b, b2, "k", seed=seed)
        xh, bits = quantize(x, p, "float16")
        r = {"data": "sphere", "d": d, "role": "-", "method": m, "bits": b, "bits2": b2, "label": label(m, b, b2),
             "bits_per_coord": bits, "vectors": int(x.shape[1] * x.shape[2])}
        r.update(mse_metrics(x, xh))
        spread = ip_metrics(q_ind, x, xh, d)
        slope = ip_metrics(q_cor, x, xh, d)
        r.update(ip_d_var=spread["ip_d_var"], ip_d_mse=spread["ip_d_mse"], ip_mean_err=spread["ip_mean_err"],
                 ip_rel_bias=slope["ip_rel_bias"], ip_rel_bias_se=slope["ip_rel_bias_se"])
        r.update(_rtn(m, b, x, xh, "k"))
        r.update(paper_figures(m, b, d))
        r["seconds"] = round(time.time() - t0, 2)
        rows.append(r)
        progress(r)
    return rows


def _rtn(method: str, bits: int, x, xh, role: str) -> dict:
    if method == "kivi":
        return {"rtn_ratio": rtn_ratio(x, xh, bits, KIVI_GROUP, "t" if role == "k" else "d")}
    if method == "mlx_affine":
        return {"rtn_ratio": rtn_ratio(x, xh, bits, AFFINE_GROUP, "d")}
    return {"rtn_ratio": None}


def trained_rows(head_dim: int, acts: dict, seed: int, grid, progress, queries_per_head: int = 256,
                 data: str | None = None) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    n_layers = len(acts["k"])
    for role in ("k", "v"):
        for m, b, b2 in grid:
            t0 = time.time()
            xs, xhs, bits, true_all, est_all, logit_err, logit_sd = [], [], [], [], [], [], []
            for layer in range(n_layers):
                x = acts[role][layer].astype(np.float32)
                p = params(m, b, b2, role, seed=seed, layer=layer)
                xh, bt = quantize(acts[role][layer], p, "float16")
                xs.append(x)
                xhs.append(xh)
                bits.append(bt)
                if role == "k":   # the model's own queries against every key of the same KV head
                    qs = acts["q"][layer].astype(np.float64)[0]          # (Hq, T, d)
                    hkv = x.shape[1]
                    for h in range(hkv):
                        group = qs[h * (qs.shape[0] // hkv) : (h + 1) * (qs.shape[0] // hkv)].reshape(-1, qs.shape[-1])
                        qi = group[rng.choice(group.shape[0], queries_per_head, replace=False)]
                        k, kh = x[0, h].astype(np.float64), xh[0, h].astype(np.float64)
                        s, sh = qi @ k.T, qi @ kh.T
                        nrm = np.linalg.norm(qi, axis=1)[:, None] * np.linalg.norm(k, axis=1)[None, :]
                        true_all.append((s / nrm).ravel())
                        est_all.append((sh / nrm).ravel())
                        logit_err.append((sh - s).ravel())
                        logit_sd.append(s.std(axis=1).mean())
            x, xh = np.concatenate(xs, axis=1), np.concatenate(xhs, axis=1)
            d = x.shape[-1]
            r = {"data": data or f"trained hd{head_dim}", "d": d, "role": role, "method": m, "bits": b, "bits2": b2,
                 "label": label(m, b, b2), "bits_per_coord": float(np.mean(bits)),
                 "vectors": int(x.shape[1] * x.shape[2])}
            r.update(mse_metrics(x, xh))
            if role == "k":
                r.update(_ip_stats(np.concatenate(true_all), np.concatenate(est_all), d))
                # attention-logit error in units of the logits' spread over keys (per query, averaged)
                r["logit_err_rel"] = float(np.sqrt(np.mean(np.concatenate(logit_err) ** 2)) / np.mean(logit_sd))
            else:
                q = sphere(x.shape[1], x.shape[2], d, rng)
                r.update({k: v for k, v in ip_metrics(q, x, xh, d).items() if k in ("ip_d_var", "ip_d_mse", "ip_mean_err")})
                r.update({k: v for k, v in ip_metrics(correlated_queries(x, 0.5, rng), x, xh, d).items()
                          if k in ("ip_rel_bias", "ip_rel_bias_se")})
            r.update(_rtn(m, b, x, xh, role) if m in ("kivi", "mlx_affine") else {"rtn_ratio": None})
            r.update(paper_figures(m, b, d))
            r["seconds"] = round(time.time() - t0, 2)
            rows.append(r)
            progress(r)
    return rows


SPREAD_GRID = [("turboquant", 2, None), ("turboquant_prod", 2, None), ("rabitq", 1, None)]


def seed_spread(head_dim: int, acts: dict, seeds, grid, progress=None) -> list[dict]:
    """The inner-product bias of each configuration under several seeds (other rotation / QJL signs): the
    papers' unbiasedness is an expectation over that randomness, while a cache uses one seed per head."""
    out = []
    for m, b, b2 in grid:
        per = {"k": [], "v": []}
        for sd in seeds:
            for r in trained_rows(head_dim, acts, sd, [(m, b, b2)], lambda r: None):
                per[r["role"]].append((r["ip_rel_bias"], r["ip_rel_bias_se"]))
        for role, v in per.items():
            bias = np.array([x for x, _ in v])
            row = {"data": f"trained hd{head_dim}", "role": role, "label": label(m, b, b2), "seeds": list(seeds),
                   "bias": bias.tolist(), "mean": float(bias.mean()), "sd": float(bias.std(ddof=1)),
                   "within_se": float(np.mean([e for _, e in v]))}
            out.append(row)
            if progress:
                progress(row)
    return out
