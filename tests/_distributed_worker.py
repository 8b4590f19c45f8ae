"""One rank of tests/test_distributed_sharding.py, started by MLX's launcher (`mlx.launch --backend ring`).

Usage (per rank; the launcher sets MLX_RANK and MLX_HOSTFILE): python tests/_distributed_worker.py OUT_DIR

Builds the small random llama of `build_model` (the test builds the same one unsharded), shards it with
mlx-lm's `model.shard(group)`, and for every method of SETTINGS makes our caches with
`make_prompt_cache(model, ..., group=group)` (and, as a baseline, mlx-lm's float16 KVCache: "fp16"), runs TOKENS teacher-forced (one prefill chunk, then one token
per step) and writes OUT_DIR/rank{r}_{method}.npz: each cache's stored records as bit patterns, the keys and
values each cache was fed (per chunk), each layer's head_offset and the logits. The last file written is
OUT_DIR/rank{r}.done, so the test can tell a finished rank from one that died (the launcher's exit status
is 0 either way); a rank whose `mx.distributed.init` fails writes OUT_DIR/rank{r}.initfail instead.
"""
from __future__ import annotations

import os
import sys

import mlx.core as mx
import numpy as np

SEED = 7                      # model weights (mx.random.seed) and token draw
CACHE_SEED = 2**64 - 3        # the caches' spec seed: per-head randomness comes from (seed, layer, head)
VOCAB = 512
N_KV_HEADS = 4
HEAD_DIM = 64
PREFILL = 24
DECODE = 5
SETTINGS = {
    "turboquant": dict(bits=3),
    "turboquant_rvq": dict(bits=2, bits2=1),
    "turboquant_prod": dict(bits=3),
    "kivi": dict(bits=2, group_size=16, window=4),
    "rabitq": dict(bits=1),
}


def build_model():
    """Random mlx-lm llama: 2 layers, 8 query heads over 4 KV heads of dim 64, hidden 256, float16."""
    from mlx_lm.models import llama

    mx.random.seed(SEED)
    args = llama.ModelArgs(model_type="llama", hidden_size=256, num_hidden_layers=2, intermediate_size=512,
                           num_attention_heads=8, num_key_value_heads=N_KV_HEADS, head_dim=HEAD_DIM,
                           rms_norm_eps=1e-5, vocab_size=VOCAB)
    model = llama.Model(args)
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    return model


def tokens() -> mx.array:
    return mx.random.randint(0, VOCAB, (PREFILL + DECODE,), key=mx.random.key(SEED))


class Recorder:
    """Wraps one cache: forwards everything, and keeps each (keys, values) chunk it was given."""

    def __init__(self, cache):
        self.cache = cache
        self.chunks = []

    def update_and_fetch(self, keys, values):
        self.chunks.append((keys, values))
        return self.cache.update_and_fetch(keys, values)

    def __getattr__(self, name):
        return getattr(self.cache, name)


def bits(a) -> np.ndarray:
    """The array's bit pattern (uint8/16/32), so comparisons are exact."""
    a = a if isinstance(a, mx.array) else mx.array(a)
    return np.array(a.view({1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[a.itemsize]))


def run(model, caches) -> tuple[list[Recorder], np.ndarray]:
    """TOKENS through the model, teacher-forced: logits (1 + DECODE, VOCAB) float32 after each call."""
    rec = [Recorder(c) for c in caches]
    toks = tokens()
    out = [model(toks[None, :PREFILL], cache=rec)[0, -1]]
    for i in range(PREFILL, PREFILL + DECODE):
        out.append(model(toks[None, i : i + 1], cache=rec)[0, -1])
    logits = mx.stack(out).astype(mx.float32)
    mx.eval(logits)
    return rec, np.array(logits)


def arrays(rec: list[Recorder], logits: np.ndarray) -> dict[str, np.ndarray]:
    """Flat npz content: L{layer}_{k|v}_{field}, L{layer}_in_{k|v}_{chunk}, L{layer}_head_offset, logits."""
    out = {"logits": logits}
    for layer, r in enumerate(rec):
        k_rec, v_rec = r.cache.state[:2]
        for role, record in (("k", k_rec), ("v", v_rec)):
            for name, a in (record.items() if isinstance(record, dict) else [("fp16", record)]):
                out[f"L{layer}_{role}_{name}"] = bits(a)
        for i, (k, v) in enumerate(r.chunks):
            out[f"L{layer}_in_k_{i}"] = bits(k)
            out[f"L{layer}_in_v_{i}"] = bits(v)
        if hasattr(r.cache, "key_params"):
            out[f"L{layer}_head_offset"] = np.array([r.cache.key_params.head_offset,
                                                     r.cache.value_params.head_offset])
    return out


def make_caches(model, method: str, group=None) -> list:
    """Our caches for `method`, or mlx-lm's float16 KVCache for "fp16" (the baseline for the logits)."""
    import veloxquant.accelerated.cache as vc
    from mlx_lm.models.cache import KVCache

    if method == "fp16":
        return [KVCache() for _ in model.layers]
    return vc.make_prompt_cache(model, method=method, seed=CACHE_SEED, group=group, **SETTINGS[method])


def main(out_dir: str) -> None:
    try:
        group = mx.distributed.init(strict=True, backend="ring")
    except RuntimeError as e:  # no ring backend in this MLX build, or no loopback: the test skips with this
        with open(os.path.join(out_dir, f"rank{os.environ.get('MLX_RANK', '?')}.initfail"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n")
        raise
    rank = group.rank()
    model = build_model()
    model.shard(group)
    for method in ("fp16", *SETTINGS):
        rec, logits = run(model, make_caches(model, method, group))
        np.savez(os.path.join(out_dir, f"rank{rank}_{method}.npz"), **arrays(rec, logits))
    with open(os.path.join(out_dir, f"rank{rank}.done"), "w") as f:
        f.write(f"{group.size()}\n")


if __name__ == "__main__":
    main(sys.argv[1])
