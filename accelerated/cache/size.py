"""What a VeloxQuant cache holds, in bytes, split by kind (VeloxKVCache.nbytes_parts / nbytes_for).

A stream's bytes are three parts (spec/streaming.md):
- "encoded": the record fields of the Q encoded tokens (codes, norms, scales ...; formats.toml `record`);
- "window": the newest T - Q tokens, exact in the input dtype (spec `window` R; kivi holds R .. R + G - 1);
- "kept": exact copies of up to C recently flushed tokens, in the input dtype, so that trims of up to E
  tokens are exact ('Exact trims'; C = E, rounded up to whole groups for kivi; none for per-token
  methods with R = 0).
So with R > 0 the first R tokens of a stream cost exactly what float16 costs (for float16 input), and every
token past them costs the encoded bytes plus, while fewer than C have been flushed, an exact copy: with E > 0
a windowed cache is larger than float16 until enough tokens are encoded to pay for the C copies.
"""
from __future__ import annotations

import mlx.core as mx

from ... import spec
from .. import layouts
from ..ops import record

PARTS = ("encoded", "window", "kept")
_FIELD_BYTES = {"uint32": 4, "float32": 4, "float16": 2}


def keeps_copies(p: spec.Params) -> bool:
    """Whether a stream with these (resolved) params stores exact-trim copies (accelerated.stream.Stream)."""
    return not layouts.of(p).per_token or p.window > 0


def stream_parts(p: spec.Params, tokens: int, *, heads: int, head_dim: int, dtype=mx.float16,
                 batch: int = 1) -> dict:
    """{part: bytes} of one stream after `tokens` tokens appended in any chunks and never trimmed."""
    for name, v in (("tokens", tokens), ("heads", heads), ("head_dim", head_dim), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "tokens" else 1):
            raise ValueError(f"{name}: expected a {'non-negative' if name == 'tokens' else 'positive'} int, "
                             f"got {v!r}")
    if dtype not in (mx.float16, mx.bfloat16, mx.float32):
        raise ValueError(f"dtype: expected float16, bfloat16 or float32, got {dtype!r}")
    p = p.resolved()
    item = dtype.size
    q = p.encoded_tokens(tokens)
    shapes = record.expected_shapes(p, batch, heads, tokens, head_dim, q)
    encoded = 0
    for name, dt, _ in record.layout(p):
        if name != "window":
            n = 1
            for s in shapes[name]:
                n *= s
            encoded += n * (item if dt == "input" else _FIELD_BYTES[dt])
    exact = batch * heads * head_dim * item
    kept = min(p.kept_capacity(), q) if keeps_copies(p) else 0
    return {"encoded": encoded, "window": (tokens - q) * exact, "kept": kept * exact}


def held_parts(stream) -> dict:
    """{part: bytes} of a stream as it is now (after any appends and trims)."""
    if stream is None:
        return dict.fromkeys(PARTS, 0)
    rec = stream.record()
    window = int(rec["window"].nbytes) if "window" in rec else 0
    encoded = sum(int(v.nbytes) for k, v in rec.items() if k != "window")
    return {"encoded": encoded, "window": window, "kept": int(stream.nbytes) - encoded - window}


def add(*parts: dict) -> dict:
    return {k: sum(p[k] for p in parts) for k in PARTS}
