"""Record layout (spec/formats.toml) and the one-shot encode/decode frame shared by every method.

A method module provides `encode_tokens(x32, p, dtype)` (fields of the encoded prefix, window excluded;
dtype is the input dtype; it applies the method's rejection rules, e.g. norm overflow, to exactly the
tokens it encodes) and `decode_tokens(fields, p, d)` (float32 (B, H, Q, d)). This module adds the window (streaming.md: tokens
Q..T-1 kept exactly in the input dtype) and the validation of x and of records.
"""
from __future__ import annotations

import re

import mlx.core as mx

from ... import spec
from .. import layouts
from . import numerics, packing

FIELD_DTYPES = {"uint32": mx.uint32, "float32": mx.float32, "float16": mx.float16}


def resolve(params) -> spec.Params:
    if not isinstance(params, spec.Params):
        raise ValueError(f"params: must be a spec.Params, got {type(params).__name__}")
    return params.resolved()


def layout(p: spec.Params) -> list[tuple[str, str, str]]:
    """[(name, dtype, shape)] in record order (formats.toml through accelerated.layouts; KIVI's depends on the
    role)."""
    return [(f.name, f.dtype, ",".join(f.shape)) for f in layouts.of(p).record(p.role)]


def field_names(p: spec.Params) -> list[str]:
    return [r[0] for r in layout(p)]


def _dim(term: str, env: dict) -> int:
    """One axis of a formats.toml shape: B, H, Q, d, T-Q, Q/G, d/G, W(bits), W(bits-1), W(bits2), W(1)."""
    m = re.fullmatch(r"W\((\w+)(?:-(\d+))?\)", term)
    if m:
        b = env[m.group(1)] if m.group(1) in env else int(m.group(1))
        return packing.words(env["d"], b - int(m.group(2) or 0))
    if "/" in term:
        a, b = term.split("/")
        return env[a] // env[b]
    if "-" in term:
        a, b = term.split("-")
        return env[a] - env[b]
    return env[term]


def expected_shapes(p: spec.Params, b: int, h: int, t: int, d: int, q: int | None = None) -> dict:
    env = {"B": b, "H": h, "T": t, "d": d, "Q": p.encoded_tokens(t) if q is None else q,
           "G": p.group_size or 1, "bits": p.bits, "bits2": p.bits2 or 0}
    return {name: tuple(_dim(s, env) for s in shape.split(",")) for name, _, shape in layout(p)}


def check_record(record, p: spec.Params) -> tuple[int, int, int, int, int]:
    """Validate field names, dtypes and shapes (ValueError naming record); return (B, H, T, Q, d)."""
    if not isinstance(record, dict):
        raise ValueError(f"record: must be a dict of mx arrays, got {type(record).__name__}")
    names = field_names(p)
    if set(record) != set(names):
        raise ValueError(f"record: fields {sorted(record)} do not match {p.method}'s {names}")
    ranks = {f.name: len(f.shape) for f in layouts.of(p).record(p.role)}
    for k, v in record.items():
        if not isinstance(v, mx.array) or v.ndim != ranks[k]:
            raise ValueError(f"record: field {k} must be an mx.array of the record's rank")
    win = record["window"]
    if win.dtype not in numerics.DTYPES.values():
        raise ValueError(f"record: window dtype {win.dtype} is not an input dtype")
    b, h, r, d = win.shape
    p.check_head_dim(d)
    q = record[names[0]].shape[2] * (p.group_size if names[0] in layouts.of(p).group_rows(p.role) else 1)
    if not layouts.of(p).per_token and q % p.group_size:
        raise ValueError(f"record: {p.method} encoded tokens {q} not a multiple of group_size {p.group_size}")
    want = expected_shapes(p, b, h, q + r, d, q)
    for name, dt, _ in layout(p):
        v = record[name]
        want_dt = win.dtype if dt == "input" else FIELD_DTYPES[dt]
        if v.dtype != want_dt or tuple(v.shape) != want[name]:
            raise ValueError(f"record: field {name} is {v.dtype} {tuple(v.shape)}, expected "
                             f"{want_dt} {want[name]}")
    return b, h, q + r, q, d


def encode_with(method, x, params, dtype=None) -> dict[str, mx.array]:
    """The one-shot frame for every method object (an accelerated.ops module or an accelerated.kernels
    KernelMethod): params and x checked, tokens 0..Q-1 encoded, tokens Q..T-1 kept as the window.
    A method with its own `encode_chunk` (the kernels) checks x's data in the same launch as it encodes."""
    p = resolve(params)
    if p.method != method.NAME:
        raise ValueError(f"params: method {p.method!r} given to {method.NAME}.encode")
    q = p.encoded_tokens(x.shape[2])
    if hasattr(method, "encode_chunk"):
        numerics.check_x(x, p, dtype, finite=False)   # shape, dtype, parameters; the data: in the kernel
        fields = method.encode_chunk(x, p, q, 0, x.dtype)   # x itself, not an upcast copy
    else:
        numerics.check_x(x, p, dtype)
        fields = method.encode_tokens(numerics.upcast(x)[:, :, :q], p, x.dtype)
    fields["window"] = x[:, :, q:]
    return {name: fields[name] for name in field_names(p)}


def encode_chunk(method, x: mx.array, p: spec.Params, q: int, check_from: int = 0, dtype=None) -> dict[str, mx.array]:
    """Fields of tokens 0..q-1 of x (zero-length fields when q = 0), rejecting first NaN/Inf in tokens
    0..q-1 and check_from..T-1, then (encode_tokens) the method's rule on tokens 0..q-1, all through
    numerics.fault. A stream appending chunk c to window w calls it with x = w ++ c, check_from = len(w)
    and q = the flush. A method object with its own `encode_chunk` (accelerated.kernels: one launch, no
    extra pass over x) is handed the call; for accelerated.ops modules it is the check, then encode_tokens."""
    if hasattr(method, "encode_chunk"):
        return method.encode_chunk(x, p, q, check_from, dtype)
    # two records, one message: deferred, they are reduced with the chunk's other checks in one launch
    numerics.fault_nonfinite(x[:, :, :q], numerics.NONFINITE)
    numerics.fault_nonfinite(x[:, :, check_from:], numerics.NONFINITE)
    dt = x.dtype if dtype is None else numerics.DTYPES[numerics.dtype_name(dtype)]
    if q == 0:
        b, h, _, d = x.shape
        shapes = expected_shapes(p, b, h, 0, d, 0)
        return {name: mx.zeros(shapes[name], dtype=dt if kind == "input" else FIELD_DTYPES[kind])
                for name, kind, _ in layout(p) if name != "window"}
    return method.encode_tokens(numerics.upcast(x[:, :, :q]), p, dt)


def decode_with(method, record, params, dtype=None) -> mx.array:
    """The one-shot decode frame for every method object: the record checked, the encoded prefix decoded
    (method.decode_tokens), then the window upcast."""
    p = resolve(params)
    if p.method != method.NAME:
        raise ValueError(f"params: method {p.method!r} given to {method.NAME}.decode")
    check_record(record, p)
    if dtype is not None and numerics.dtype_name(record["window"].dtype) != numerics.dtype_name(dtype):
        raise ValueError(f"record: window dtype {record['window'].dtype} differs from the declared {dtype}")
    win = numerics.upcast(record["window"])
    fields = {k: v for k, v in record.items() if k != "window"}
    prefix = method.decode_tokens(fields, p, win.shape[-1])
    if win.shape[2] == 0:   # no window: the prefix is the whole result (no concatenate copy)
        return prefix
    return mx.concatenate([prefix, win], axis=2)
