"""The retrieval table's model (tools/quality/retrieval.py): the trainer's run loaded as an mlx-lm llama, its
`outliers` variant (a few key channel pairs scaled, the matching query channels by the inverse: the same function,
keys with outlier channels), and the statistics of the keys and values the caches receive.
"""
from __future__ import annotations

import pathlib

import numpy as np

from . import retrieval_train as qrt

OUTLIER_PAIRS, OUTLIER_SCALE = 4, (8.0, 20.0)   # rotation pairs per KV head, factor range


def load_model(model_dir: pathlib.Path, dtype):
    """The exported folder (config.json + model-NN.safetensors) or a training run folder (state.json with
    model.safetensors or checkpoint.safetensors) as an mlx-lm llama (the trainer's load_run), in `dtype`."""
    exported = (model_dir / "config.json").is_file() and sorted(model_dir.glob("model-*.safetensors"))
    trained = (model_dir / "state.json").is_file() and any(
        (model_dir / f).is_file() for f in ("model.safetensors", "checkpoint.safetensors"))
    if not (exported or trained):
        raise FileNotFoundError(f"--model-dir: {model_dir} holds neither config.json with model-NN.safetensors "
                                "(`retrieval_train export`) nor a training run (state.json and weights)")
    model, cfg = qrt.load_run(model_dir)
    model.set_dtype(dtype)
    return model, cfg


def inject_outliers(model, seed: int, pairs: int = OUTLIER_PAIRS, scale=OUTLIER_SCALE) -> list[dict]:
    """Scale `pairs` RoPE channel pairs of every KV head's keys by a fixed random factor in `scale`, in place,
    and the same channels of the queries that read that head by its inverse.

    RoPE rotates each pair (i, i + d/2; (2i, 2i + 1) when traditional) as a 2-D vector, so scaling both
    channels of a pair commutes with it; q.k is unchanged, so the fp16 model computes the same function and
    only the caches see the outliers. Returns the choice per layer."""
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    out = []
    for li, layer in enumerate(model.layers):
        at = layer.self_attn
        d, hk, hq = at.head_dim, at.n_kv_heads, at.n_heads
        traditional = bool(getattr(at.rope, "traditional", False))
        ks = np.ones(hk * d, np.float32)
        chosen = []
        for h in range(hk):
            for i in rng.choice(d // 2, pairs, replace=False):
                f = float(rng.uniform(*scale))
                ch = (2 * i, 2 * i + 1) if traditional else (i, i + d // 2)
                ks[[h * d + c for c in ch]] = f
                chosen.append([h, int(i), round(f, 3)])
        qs = np.concatenate([1.0 / ks[(h * hk // hq) * d : (h * hk // hq + 1) * d] for h in range(hq)])
        for proj, s in ((at.k_proj, ks), (at.q_proj, qs)):
            if "scales" in proj:    # an 8/4-bit export: row r dequantizes to scales*q + biases, so scale those
                for name in ("scales", "biases"):
                    v = proj[name]
                    proj[name] = (v.astype(mx.float32) * mx.array(s)[:, None]).astype(v.dtype)
            else:
                w = proj.weight
                proj.weight = (w.astype(mx.float32) * mx.array(s)[:, None]).astype(w.dtype)
            if "bias" in proj:
                proj.bias = (proj.bias.astype(mx.float32) * mx.array(s)).astype(proj.bias.dtype)
        out.append({"layer": li, "head_channel_factor": chosen})
    mx.eval(model.parameters())
    return out


def key_table(model, seqs: list[dict]) -> list[dict]:
    """Per layer, over the given sequences' tokens (post-RoPE keys and values as the cache receives them):
    median and max Pearson kurtosis over (KV head, channel) (3 for a Gaussian), the largest channel RMS over
    its head's median channel RMS, the channels above 4x, and the median kurtosis across one token's
    coordinates."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from .caches import Float16KV

    acc = [{"k": [], "v": []} for _ in model.layers]
    for s in seqs:
        caches = [KVCache() for _ in model.layers]
        mx.eval(model(mx.array(s["tokens"][None]), cache=[Float16KV(c) for c in caches]))
        for li, c in enumerate(caches):
            for role, arr in zip("kv", c.state[:2]):
                acc[li][role].append(np.array(arr[0, :, : c.offset].astype(mx.float32), dtype=np.float64))
    out = []
    for li, roles in enumerate(acc):
        row = {"layer": li}
        for role, parts in roles.items():
            x = np.concatenate(parts, axis=1)                       # (H, tokens, d)
            mu = x.mean(axis=1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=1)
            kurt = ((x - mu) ** 4).mean(axis=1) / np.maximum(var, 1e-30) ** 2
            rms = np.sqrt((x**2).mean(axis=1))
            ratio = rms / np.maximum(np.median(rms, axis=1, keepdims=True), 1e-30)
            # across the coordinates of each token's vector: what a rotation spreads (a channel's own
            # kurtosis does not change when the channel is scaled)
            mt = x.mean(axis=2, keepdims=True)
            vt = ((x - mt) ** 2).mean(axis=2)
            kt = ((x - mt) ** 4).mean(axis=2) / np.maximum(vt, 1e-30) ** 2
            row[role] = {"kurtosis_median": float(np.median(kurt)), "kurtosis_max": float(kurt.max()),
                         "rms_ratio_max": float(ratio.max()), "outlier_channels": int((ratio > 4).sum()),
                         "token_kurtosis_median": float(np.median(kt)),
                         "channels": int(ratio.size)}
        out.append(row)
    return out
