"""`veloxquant distortion`'s recommendation by bit budget: per budget and head dim, the key and value
configurations with the least KL of the trained model (docs/quality-trained.json) whose stored bits fit."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from . import speed as speed_src
from .configs import GRID, label, params, quantize
from .papers import MIXED_MARGIN

# ---- recommendation -------------------------------------------------------------------------------------
# Methods the caches offer (tools/cli/kv_flags.py CACHE_METHODS): mlx_affine is an external format only.
CACHE_METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "kivi", "rabitq")


def cache_flags(ck, cv) -> str:
    """`veloxquant generate` flags of a key/value configuration (window 0)."""
    (km, kb, kb2), (vm, vb, vb2) = ck, cv
    f = [f"--kv-key-method {km} --kv-key-bits {kb}", f"--kv-value-method {vm} --kv-value-bits {vb}"]
    if kb2 or vb2:
        f.append(f"--kv-bits2 {kb2 or vb2}")
    return " ".join(f + ["--kv-window 0"])


def trained_kl(path: pathlib.Path) -> dict:
    """{(method, bits, bits2, role): kl_mean} of the one-role rows (variants k, v) and both-role rows (kv),
    hd64, the first context, from quality-trained JSON; empty if the file is absent."""
    if not path.is_file():
        return {}
    res = json.loads(path.read_text())
    out = {}
    for r in res["results"]:
        if r.get("head_dim") == 64 and r.get("context") == 1024 and r["variant"] in ("k", "v", "kv"):
            out[(r["method"], r["bits"], r["bits2"], r["variant"])] = r["kl_mean"]
    return out


def steady_bits(method: str, bits: int, bits2, d: int, role: str) -> float:
    """Stored bits per coordinate of a long context, window 0, from the record layout of encode."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 128, d)).astype(np.float32)
    return quantize(x, params(method, bits, bits2, role), "float32")[1]


def speed_of(k: tuple, v: tuple, head_dim: int, sources: list[dict]) -> str:
    """The measured speed of keys k and values v (window 0) from the benchmark sources (speed.load), × fp16 per
    suite and context; the benchmarks' layers have head dim speed.BENCH_HEAD_DIM only."""
    if head_dim != speed_src.BENCH_HEAD_DIM:
        return f"{speed_src.NOT_MEASURED} (the benchmarks' head dim is {speed_src.BENCH_HEAD_DIM})"
    got = speed_src.lookup(sources, k, v)
    return "; ".join(f"{suite.replace('_', ' ')} {speed_src.cell(got[suite], False)}" for suite in speed_src.SUITES)


def recommend(kl: dict, budgets, head_dims, rows: list[dict], speed_sources: list[dict] | None = None) -> list[dict]:
    """Per budget and head dim: the best (key config, value config) by KL_k + KL_v (equal KL: fewer bits),
    the best single configuration on both roles, and the recommendation: the pair only if its KL sum is
    below MIXED_MARGIN times the single configuration's, else the single one; its speed from `speed_sources`
    (speed.load; default: the committed sources, speed.COMMITTED)."""
    if speed_sources is None:
        speed_sources = speed_src.load(speed_src.committed())
    cfgs = [c for c in GRID if (c + ("k",)) in kl and (c + ("v",)) in kl and c[0] in CACHE_METHODS]
    dist = {(r["data"], r["role"], r["label"]): r for r in rows}
    out = []
    for d in head_dims:
        bk = {c: steady_bits(*c, d, "k") for c in cfgs}
        bv = {c: steady_bits(*c, d, "v") for c in cfgs}
        for budget in budgets:
            best = None
            for ck in cfgs:
                for cv in cfgs:
                    mean_bits = (bk[ck] + bv[cv]) / 2
                    if mean_bits > budget + 1e-9 or (ck[2] and cv[2] and ck[2] != cv[2]):
                        continue                    # over budget, or two bits2 (the caches take one)
                    score = kl[ck + ("k",)] + kl[cv + ("v",)]
                    key = (score, mean_bits)
                    if best is None or key < best[0]:
                        best = (key, ck, cv, mean_bits)
            if best is None:
                out.append({"budget": budget, "head_dim": d, "keys": None})
                continue
            (score, _), ck, cv, mean_bits = best
            same = [c for c in cfgs if (bk[c] + bv[c]) / 2 <= budget + 1e-9]
            best_same = min(same, key=lambda c: (kl[c + ("k",)] + kl[c + ("v",)], bk[c])) if same else None
            mixed_wins = best_same is None or score < MIXED_MARGIN * (kl[best_same + ("k",)] + kl[best_same + ("v",)])
            rk, rv = (ck, cv) if mixed_wins else (best_same, best_same)
            dk = dist.get((f"trained hd{d}", "k", label(*ck)), {})
            dv = dist.get((f"trained hd{d}", "v", label(*cv)), {})
            out.append({"budget": budget, "head_dim": d, "keys": label(*ck), "values": label(*cv),
                        "key_bits": bk[ck], "value_bits": bv[cv], "mean_bits": mean_bits, "kl_sum": score,
                        "kl_kv_measured": kl.get(ck + ("kv",)) if ck == cv else None,
                        "same_method": label(*best_same) if best_same else None,
                        "same_method_kl_sum": (kl[best_same + ("k",)] + kl[best_same + ("v",)]) if best_same else None,
                        "same_method_kl_kv": kl.get(best_same + ("kv",)) if best_same else None,
                        "key_logit_err_rel": dk.get("logit_err_rel"), "value_d_mse": dv.get("d_mse"),
                        "recommended_keys": label(*rk), "recommended_values": label(*rv),
                        "recommended_bits": (bk[rk] + bv[rv]) / 2,
                        "recommended_kl_sum": kl[rk + ("k",)] + kl[rv + ("v",)],
                        "flags": cache_flags(rk, rv),
                        "speed": speed_of(rk, rv, d, speed_sources)})
    return out


def additivity(kl: dict) -> list[dict]:
    """How well KL_k + KL_v predicts the both-roles KL (same configuration on both roles)."""
    out = []
    for c in GRID:
        if all((c + (v,)) in kl for v in ("k", "v", "kv")):
            s = kl[c + ("k",)] + kl[c + ("v",)]
            out.append({"label": label(*c), "kl_k": kl[c + ("k",)], "kl_v": kl[c + ("v",)], "sum": s,
                        "kv": kl[c + ("kv",)], "ratio": kl[c + ("kv",)] / s})
    return out
