"""A tiny random mlx-lm llama saved as a model directory that `mlx_lm.load` (and so `mlx_lm.generate`,
`mlx_lm.server`, `veloxquant generate/serve`) reads: config.json, model.safetensors and a byte-level tokenizer
(one token per byte, no merges, `<eos>` = 256), made offline with the `tokenizers` package.

For tests and the command-line tools' examples; the weights are random (tools.quality.tiny_llama), so the text
it writes is noise, but every token is deterministic under greedy sampling.

    python -m veloxquant.tools.cli.tiny_model DIR [--head-dim 64] [--layers 2] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EOS = "<eos>"


def _byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


def _byte_of(ch: str) -> int:
    """GPT-2's byte-to-unicode map, inverted: the byte a ByteLevel alphabet character stands for."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    c = ord(ch)
    if c in printable:
        return c
    others = [b for b in range(256) if b not in printable]
    return others[c - 256]


def save_tiny_llama(path, head_dim: int = 64, layers: int = 2, seed: int = 0, hidden: int = 256,
                    kv_heads: int = 2, heads: int = 4, vocab: int = 512) -> Path:
    """Write a random llama (float16) with a byte-level tokenizer to `path`; returns the path."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-5,
                  vocab_size=vocab, tie_word_embeddings=True, eos_token_id=256)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs(**{k: v for k, v in config.items() if k != "eos_token_id"}))
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    _byte_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "model_max_length": 1 << 20}, indent=2))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m veloxquant.tools.cli.tiny_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from . import extras
    missing = extras.message(ap.prog, "lm")
    if missing:
        print(missing, file=sys.stderr)
        return extras.MISSING_EXTRA_EXIT
    print(save_tiny_llama(a.path, a.head_dim, a.layers, a.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
