"""The retrieval model's weights (issue 32 item 1): presets, building a model, loading a run folder or an export,
exporting (float16 or MLX affine 8/4-bit shards), starting a fine-tune from either, and per-layer gradient
checkpointing for long phases. retrieval_train (the CLI: train, eval, export, record) builds on this module."""
from __future__ import annotations

import contextlib
import json
import pathlib
import sys

PRESETS = {
    # name: (model, phases [(steps, batch, length)], lr)
    "retrieval-25m": (dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1536, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=128, rope_theta=500000.0),
                      # run 3's (docs/retrieval-model.md): passkey 100 % at 1k and 4k; lr 1e-3 learned none
                      [(3500, 32, 512), (1200, 16, 2048), (300, 4, 8192)], 3e-4),
    # a quarter of the layers' width: small enough to commit (8-bit export ~4 MB) if it retrieves as well
    "retrieval-4m": (dict(hidden_size=256, num_hidden_layers=6, intermediate_size=768, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=128, rope_theta=500000.0),
                     [(3500, 32, 512), (1200, 16, 2048), (300, 4, 8192)], 3e-4),
    "smoke": (dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, rope_theta=10000.0),
              [(40, 8, 128)], 3e-3),
}


# ---- model ------------------------------------------------------------------------------------------------
def model_args(preset: str):
    from mlx_lm.models import llama

    cfg = PRESETS[preset][0]
    return llama.ModelArgs(model_type="llama", vocab_size=256, rms_norm_eps=1e-5, tie_word_embeddings=True, **cfg)


def new_model(preset: str, seed: int):
    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(seed)
    m = llama.Model(model_args(preset))
    mx.eval(m.parameters())
    return m


def n_params(model) -> int:
    from mlx.utils import tree_flatten

    return int(sum(v.size for _, v in tree_flatten(model.parameters())))


def init_from(model, run: pathlib.Path, preset: str) -> str | None:
    """Start from the weights of an earlier run or export of the same preset (a quantized export dequantized, as
    mlx_lm.utils.dequantize_model does): a fine-tune with new phases, e.g. one longer context. Why not, or None."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model

    src, st = load_run(run)
    if st["preset"] != preset:
        return f"{run} holds preset {st['preset']}, not {preset}"
    if st.get("quantization"):
        src = dequantize_model(src)
    model.load_weights([(k, v.astype(model_dtype(model))) for k, v in tree_flatten(src.parameters())], strict=True)
    return None


def model_dtype(model):
    return model.model.embed_tokens.weight.dtype


@contextlib.contextmanager
def checkpointed_layers(model):
    """Within the block, each transformer block is recomputed in the backward pass (mx.checkpoint) instead of
    keeping its activations: MLX's attention backward keeps the (heads, L, L) scores of every layer, which at 32k
    bytes exceed the GPU's memory (docs/retrieval-model.md, run 1). The patch of mlx_lm.tuner.trainer's
    grad_checkpoint (on the block's class), undone on exit."""
    import mlx.core as mx

    cls = type(model.model.layers[0])
    fn = cls.__call__

    def checkpointed(module, *args, **kwargs):
        def inner(params, *args, **kwargs):
            module.update(params)
            return fn(module, *args, **kwargs)
        return mx.checkpoint(inner)(module.trainable_parameters(), *args, **kwargs)

    cls.__call__ = checkpointed
    try:
        yield model
    finally:
        cls.__call__ = fn


SHARD_BYTES = 15 * 2**20     # the device tool returns files of at most 16 MiB


def load_run(run: pathlib.Path):
    """The model of a run folder: exported float16 shards (model-*.safetensors with config.json), else the
    final model.safetensors, else the checkpoint's weights."""
    import mlx.core as mx

    cfg = run / "config.json"
    st = json.loads((cfg if cfg.is_file() else run / "state.json").read_text())
    model = new_model(st["preset"], 0)
    if st.get("quantization"):     # an export with --bits 8 or 4: mlx-lm's affine layers, as mlx_lm.load builds them
        import mlx.nn as nn

        nn.quantize(model, group_size=st["quantization"]["group_size"], bits=st["quantization"]["bits"])
    shards = sorted(run.glob("model-*.safetensors"))
    if shards:
        weights = [kv for f in shards for kv in mx.load(str(f)).items()]
    elif (run / "model.safetensors").is_file():
        weights = list(mx.load(str(run / "model.safetensors")).items())
    else:
        flat = mx.load(str(run / "checkpoint.safetensors"))
        weights = [(k[6:], v) for k, v in flat.items() if k.startswith("model.")]
    model.load_weights(weights, strict=True)
    return model, st


def export(args) -> int:
    """float16 weights (--bits 8 or 4: MLX affine-quantized linear and embedding layers, group 64, float16 scales)
    in shards of at most SHARD_BYTES, plus config.json (recipe, step, corpus, commands, quantization)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    model, st = load_run(args.run)
    if st.get("quantization"):
        print(f"--run: {args.run} is already a quantized export; export from the training run", file=sys.stderr)
        return 2
    model.set_dtype(mx.float16)
    if args.bits != 16:
        nn.quantize(model, group_size=64, bits=args.bits)
    flat = [(k, v.astype(mx.float16) if mx.issubdtype(v.dtype, mx.floating) else v)
            for k, v in tree_flatten(model.parameters())]
    args.out.mkdir(parents=True, exist_ok=True)
    shards, cur, size = [], {}, 0
    for k, v in flat:
        if cur and size + v.nbytes > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += v.nbytes
    shards.append(cur)
    for i, sh in enumerate(shards):
        mx.save_safetensors(str(args.out / f"model-{i + 1:02d}.safetensors"), sh)
    cfg = {k: st[k] for k in ("preset", "phases", "step", "total", "seed", "lr", "mix", "answer_weight",
                              "copy_alphabet", "corpus", "model_args", "parameters", "init_from", "commands")
           if k in st}
    cfg["dtype"] = "float16"
    if args.bits != 16:
        cfg["quantization"] = {"group_size": 64, "bits": args.bits}
    (args.out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    print(f"wrote {len(shards)} shard(s) and config.json to {args.out} (step {st['step']}/{st['total']})")
    return 0
