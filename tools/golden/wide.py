"""Golden cases with many batch rows and heads (B >= 4, H >= 8), in their own files
(`bulk/<method>-wide.npz`) so that every earlier file keeps its bytes: per method one encode case
(B = 4, H = 8) and one chunked stream with a window and a trim (B = 4, H = 9)."""
from __future__ import annotations

from ... import spec

from .cases import CaseDef, _short, _stream_params
from .inputs import InputRng, random_input


def case_defs(method: str) -> list[CaseDef]:
    info = spec.method_info(method)
    b = info["default_bits"]
    file = f"bulk/{method}-wide.npz"
    extra = {"bits2": b} if method == "turboquant_rvq" else {}
    if method == "kivi":
        extra["group_size"] = 16
    elif method == "mlx_affine":
        extra["group_size"] = 32
    out = []
    # encode: B = 4, H = 8, d = 32, float16 (kivi keys: one whole group plus 3 tokens)
    role = "k"
    shape = (4, 8, 19 if method == "kivi" else 3, 32)
    cid = f"{method}-b{b}-d32-{_short('float16')}-wide-000"
    rng = InputRng(cid + "/params")
    params = spec.Params(method=method, bits=b, window=0, **extra, **_stream_params(rng, role)).resolved()
    out.append(CaseDef(cid, "encode", method, params, "float16", random_input(cid, shape, "float16", "normal"),
                       ("wide", "random"), f"B = 4, H = 8 (every head its own signs), shape {shape}", file))
    # stream: B = 4, H = 9, d = 32, bfloat16, window 2, appends, a trim into the encoded prefix, appends
    if method == "kivi":
        ops = (("append", 20), ("append", 1), ("append", 19), ("trim", 12), ("append", 5))
    else:
        ops = (("append", 2), ("append", 1), ("append", 3), ("trim", 4), ("append", 2))
    n_in = sum(n for op, n in ops if op == "append")
    cid = f"{method}-b{b}-d32-{_short('bfloat16')}-wide-stream-000"
    rng = InputRng(cid + "/params")
    params = spec.Params(method=method, bits=b, window=2, **extra, **_stream_params(rng, "v")).resolved()
    desc = " ".join(f"{op[0]}{n}" for op, n in ops)
    out.append(CaseDef(cid, "stream", method, params, "bfloat16",
                       random_input(cid, (4, 9, n_in, 32), "bfloat16", "normal"), ("wide", "chunked", "trim"),
                       f"B = 4, H = 9, stream R=2: {desc} (a=append, t=trim)", file, ops=ops))
    return out
