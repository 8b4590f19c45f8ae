"""`veloxquant distortion`'s recommendation by bit budget: per budget and head dim, the key and value
configurations with the least KL of the trained model (docs/quality-trained.json) whose stored bits fit."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from .configs import GRID, label, params, quantize
from .papers import MIXED_MARGIN

# ---- recommendation -------------------------------------------------------------------------------------
# Speed from docs/benchmarks.md where it measured the configuration (H200, random Llama-3-8B-shaped model,
# d = 128). Only these widths were benchmarked; the others run the same kernels with other code widths.
SPEED = {
    ("turboquant", 4, None): "generate_step 1.48x / 1.22x fp16's tokens/s at 8k / 32k (thirteenth pass, e2e)",
    ("rabitq", 1, None): "generate_step 1.47x / 1.15x fp16's tokens/s at 8k / 32k (thirteenth pass, e2e)",
    ("turboquant_rvq", 2, 2): "decode-step GPU time 2.10x / 2.05x / 2.31x fp16's at 4k / 32k / 128k (scalar loop)",
    ("kivi", 4, None): "decode-step GPU time 2.91x / 3.92x / 3.81x fp16's at 4k / 32k / 128k (window 128)",
    ("turboquant_prod", 4, None): "decode-step GPU time 3.91x / 4.60x / 5.68x fp16's at 4k / 32k / 128k",
}
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


def recommend(kl: dict, budgets, head_dims, rows: list[dict]) -> list[dict]:
    """Per budget and head dim: the best (key config, value config) by KL_k + KL_v (equal KL: fewer bits),
    the best single configuration on both roles, and the recommendation: the pair only if its KL sum is
    below MIXED_MARGIN times the single configuration's, else the single one."""
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
                        "speed": (SPEED.get(rk) or "not measured") if rk == rv else
                                 "not measured (keys and values configured differently)"})
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
