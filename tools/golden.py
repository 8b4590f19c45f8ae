"""`veloxquant golden regen|check`: golden vectors, produced only from the numpy reference.

Layout of golden/ (spec/README.md "Versioning"; the manifest records the spec version):

- `manifest.toml`: spec_version, generator_version, per file its sha256, and one `[[case]]` table per
  method case (id, kind, method, params, dtype, shape, flags, comment, file; stream ops; expected error).
- `cases/<method>.toml`: hand-picked edge cases, arrays as hex bit patterns (readable, exact).
- `cases/{prng,rotation,packing,codebooks}.toml`: component vectors of the shared building blocks.
- `bulk/<method>.npz`: random cases, exact bits (bf16 as uint16 bit patterns; stored uncompressed, with a
  fixed zip timestamp, so the bytes are a function of the content alone).
- Added by spec 1.1 (case tables in tools/golden_spec11.py; the 1.0 files above keep their bytes):
  `bulk/<method>-headdims.npz` (the head dims d = m·2^k), `cases/<method>-rules.toml` (one case per rule
  the 1.0 cases did not pin), `cases/headdims.toml` (component vectors at the new head dims).

Case kinds: `encode` (one-shot encode + decode), `stream` (appends/trims/rejected appends/save-load on
reference.stream.Stream, then decode of the final record), `error` (encode must raise the named exception
mentioning the argument).

The case list is code (`_random_cases`, `_edge_cases`, ...); inputs come from a private counter-based RNG with
exact integer arithmetic (not numpy's Generator, whose streams may change between numpy versions), so
`check` can rebuild every input and every expected value in memory and compare bit for bit.
Adding a method: add its name to `METHOD_ORDER` (bits/group sizes come from spec/formats.toml).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import json
import math
import pathlib
import re
import struct
import sys
import time
import zipfile
from typing import Callable, Iterator

import numpy as np

import spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GENERATOR_VERSION = "1"
ROOT = pathlib.Path(__file__).resolve().parent.parent / "golden"
# Methods whose reference module must exist; optional ones are included when their module is present.
METHOD_ORDER = ("turboquant", "turboquant_rvq", "turboquant_prod", "kivi", "rabitq", "mlx_affine")
OPTIONAL_METHODS = ("mlx_affine",)
DT_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
COMPONENT_FILES = ("prng", "rotation", "packing", "codebooks", "headdims")
# Head dims of spec 1.0 (powers of two): the 1.0 component files cover exactly these, byte for byte.
V1_HEAD_DIMS = (16, 32, 64, 128, 256, 512, 1024)

# ----------------------------------------------------------------------------------------------------
# Exact array <-> bit-pattern conversion (numpy interchange of docs/interfaces.md)

_STORAGE = {  # label -> (numpy dtype of the interchange array, unsigned view, hex digits)
    "float16": (np.float16, np.uint16, 4),
    "bfloat16": (np.uint16, np.uint16, 4),
    "float32": (np.float32, np.uint32, 8),
    "float64": (np.float64, np.uint64, 16),
    "uint16": (np.uint16, np.uint16, 4),
    "uint32": (np.uint32, np.uint32, 8),
    "uint64": (np.uint64, np.uint64, 16),
    "int64": (np.int64, np.uint64, 16),
}


def _label(a: np.ndarray, input_dtype: str | None = None) -> str:
    """Storage label of an interchange array; uint16 arrays are bf16 bit patterns when the input is bf16."""
    if a.dtype == np.uint16 and input_dtype == "bfloat16":
        return "bfloat16"
    return a.dtype.name


def _bits(a: np.ndarray, label: str) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=_STORAGE[label][0]).view(_STORAGE[label][1])


def _from_hex(label: str, shape, hexes) -> np.ndarray:
    npdt, view, _ = _STORAGE[label]
    raw = np.array([int(h, 16) for h in hexes], dtype=view)
    return raw.view(npdt).reshape(shape)


def bf16_round(f32: np.ndarray) -> np.ndarray:
    """binary32 -> bfloat16 bit patterns, RNE (finite inputs; used to build inputs only)."""
    b = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def cast_input(v: np.ndarray, dtype: str) -> np.ndarray:
    """float64/float32 values (exactly binary32) to the interchange array of `dtype`, RNE."""
    f32 = np.asarray(v, dtype=np.float32)
    if dtype == "float32":
        return f32.copy()
    if dtype == "float16":
        return f32.astype(np.float16)
    if dtype == "bfloat16":
        return bf16_round(f32)
    raise ValueError(f"dtype: {dtype!r}")


def upcast(x: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_to_f32(x) if dtype == "bfloat16" else np.asarray(x, dtype=np.float32)


# ----------------------------------------------------------------------------------------------------
# Input RNG: SplitMix64 over a counter, integers only, so inputs never depend on numpy's RNG or libm.

_M64 = (1 << 64) - 1


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class InputRng:
    """Deterministic input generator keyed by a string (the case id)."""

    def __init__(self, key: str):
        self.state = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")

    def u64(self, n: int) -> np.ndarray:
        ctr = np.arange(1, n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            out = _mix64(np.uint64(self.state) + ctr * np.uint64(0x9E3779B97F4A7C15))
        self.state = (self.state + n * 0x9E3779B97F4A7C15) & _M64
        return out

    def ints(self, n: int, lo: int, hi: int) -> np.ndarray:
        """n integers in [lo, hi] (modulo bias is irrelevant for test inputs)."""
        return (self.u64(n) % np.uint64(hi - lo + 1)).astype(np.int64) + lo

    def normalish(self, shape) -> np.ndarray:
        """Irwin-Hall sum of four 16-bit uniforms, centred: sd ~1.15, every value exact (19 bits)."""
        n = int(np.prod(shape))
        w = self.u64(n)
        s = sum(((w >> np.uint64(16 * i)) & np.uint64(0xFFFF)).astype(np.int64) for i in range(4))
        return ((s - 131070).astype(np.float64) * 2.0 ** -15).reshape(shape)


def random_input(key: str, shape, dtype: str, profile: str) -> np.ndarray:
    """Random KV-like values; profiles add outlier channels or change the scale, all steps exact."""
    rng = InputRng(key)
    v = rng.normalish(shape)
    d = shape[-1]
    if profile == "outliers":  # a few key channels much larger than the rest, plus a channel offset
        ch = rng.ints(3, 0, d - 1)
        v[..., ch] *= 2.0 ** 5
        v += rng.normalish((1, shape[1], 1, d)) * 0.5
    elif profile == "small":
        v *= 2.0 ** -11
    elif profile == "large":
        v *= 2.0 ** 7
    return cast_input(v, dtype)


PROFILES = ("normal", "outliers", "small", "large")

# ----------------------------------------------------------------------------------------------------
# Case objects


@dataclasses.dataclass(frozen=True)
class ExpectedError:
    type: str       # exception class name, e.g. "ValueError"
    argument: str   # the argument name the message must mention


@dataclasses.dataclass
class GoldenCase:
    id: str
    kind: str                       # "encode" | "stream" | "error"
    method: str
    params: spec.Params
    dtype: str
    shape: tuple
    flags: tuple
    comment: str
    file: str
    x: np.ndarray | None = None
    ops: tuple | None = None        # stream: (("append", n) | ("trim", n), ...)
    record: dict | None = None      # expected record (field -> array)
    decoded: np.ndarray | None = None
    trimmed: np.ndarray | None = None  # stream: return values of trim, in order
    error: ExpectedError | None = None

    def expected_error_matches(self, exc: BaseException) -> bool:
        """The exception is of the expected type and its message names the argument (as a word)."""
        return (type(exc).__name__ == self.error.type
                and re.search(rf"(?<![A-Za-z0-9_]){re.escape(self.error.argument)}(?![A-Za-z0-9_])",
                              str(exc)) is not None)


@dataclasses.dataclass
class CaseDef:
    """What the generator needs to build one case (inputs and params; expected values come later)."""
    id: str
    kind: str
    method: str
    params: spec.Params
    dtype: str
    x: np.ndarray
    flags: tuple
    comment: str
    file: str
    ops: tuple | None = None
    error: ExpectedError | None = None


def _params_to_toml(p: spec.Params) -> dict:
    d = {}
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        if v is None or f.name == "method" or (f.name == "exact_trim" and v == 0):   # default: left out
            continue
        d[f.name] = f"0x{v:X}" if f.name == "seed" and isinstance(v, int) and v >= 0 else v
    return d


def _params_from_toml(method: str, d: dict) -> spec.Params:
    kw = dict(d)
    if isinstance(kw.get("seed"), str):
        kw["seed"] = int(kw["seed"], 16)
    return spec.Params(method=method, **kw)


def _short(dtype: str) -> str:
    return DT_SHORT.get(dtype, dtype)

# ----------------------------------------------------------------------------------------------------
# The case list. Grid of random cases from spec/formats.toml; hand-picked edge cases below.

CORE_DIMS = (16, 64, 128, 256)       # the full method x bits x dtype product runs over these
EXTRA_DIMS = (32, 512, 1024)         # one case per method at its default bits
DTYPES = ("float16", "bfloat16", "float32")


def available_methods() -> tuple[str, ...]:
    """Methods with a reference module (optional ones, e.g. mlx_affine, only when present)."""
    import reference
    out = []
    for m in METHOD_ORDER:
        if m in reference.METHODS:
            out.append(m)
        elif m not in OPTIONAL_METHODS:
            raise RuntimeError(f"reference.{m} is missing; golden vectors need every required method")
    return tuple(out)


def _variants(method: str) -> list[tuple[str, dict, bool]]:
    """(label, params, full grid?) per allowed bits setting; cross rvq combos get a slimmer grid."""
    info = spec.method_info(method)
    out = []
    for b in info["bits"]:
        if method == "turboquant_rvq":
            for b2 in info["bits2"]:
                out.append((f"b{b}.{b2}", {"bits": b, "bits2": b2}, b == b2))
        else:
            out.append((f"b{b}", {"bits": b}, True))
    return out


def _grid_shape(method: str, d: int, variant_index: int) -> tuple[tuple, dict]:
    """(shape, extra params) of a random grid case: per-token methods a few tokens; kivi whole groups."""
    if method == "kivi":
        # Alternate roles over head dims so every bits setting sees both; T = whole groups + a window.
        g_cycle = (16, 32, 64, 128)
        if d == 16:
            g = g_cycle[variant_index % 4]
            return (1, 1, g + 3, d), {"role": "k", "group_size": g}
        if d == 64:
            g = (16, 32, 64)[variant_index % 3]
            return (1, 2, 4, d), {"role": "v", "group_size": g}
        if d == 128:
            return (1, 2, 19, d), {"role": "k", "group_size": 16}
        g = (32, 64, 128, 16)[variant_index % 4]
        return (1, 1, 3, d), {"role": "v", "group_size": g}
    if method == "mlx_affine":
        g = min((32, 64, 128)[variant_index % 3], d) if d >= 32 else None
        extra = {"group_size": g} if g else {}
        if d <= 128:
            return (2, 2, 3, d), extra
        return (1, 1, 2, d), extra
    if d <= 128:
        return (2, 2, 3, d), {}
    if d == 256:
        return (1, 2, 2, d), {}
    return (1, 1, 2, d), {}


def _stream_params(rng: InputRng, role: str | None = None) -> dict:
    """Random stream-key parameters: seeds across the whole uint64 range, layers, head offsets, roles."""
    seed = int(rng.u64(1)[0])
    layer, head_offset, r = (int(v) for v in rng.ints(3, 0, 63))
    return {"seed": seed, "layer": layer, "head_offset": head_offset % 16,
            "role": role or ("k" if r % 2 == 0 else "v")}


def _supports(method: str, d: int) -> bool:
    return not (method == "mlx_affine" and d < 32)


def _random_cases(method: str) -> list[CaseDef]:
    out: list[CaseDef] = []
    file = f"bulk/{method}.npz"
    info = spec.method_info(method)
    variants = _variants(method)
    for vi, (label, vparams, full) in enumerate(variants):
        for di, d in enumerate(CORE_DIMS):
            if not _supports(method, d):
                d = 32      # mlx_affine: G <= d, so its smallest head dim is 32
            for ti, dtype in enumerate(DTYPES):
                if not full and (di + vi) % 4 != ti + 1:   # slim grid: 3 of the 12 (d, dtype) pairs
                    continue
                out.append(_random_case(method, label, vparams, d, dtype, vi + di + ti, file))
    # Extra head dims at the default bits, dtype rotating.
    dv = [v for v in variants if v[1]["bits"] == info["default_bits"]][0]
    for i, d in enumerate(EXTRA_DIMS):
        if _supports(method, d):
            out.append(_random_case(method, dv[0], dv[1], d, DTYPES[i % 3], i, file))
    return out


def _random_case(method, label, vparams, d, dtype, k, file) -> CaseDef:
    shape, extra = _grid_shape(method, d, k)
    cid_prefix = f"{method}-{label}-d{d}-{_short(dtype)}-random"
    cid = f"{cid_prefix}-{k:03d}"
    rng = InputRng(cid + "/params")
    sp = _stream_params(rng, extra.get("role"))
    params = spec.Params(method=method, window=0, **vparams, **{**sp, **extra}).resolved()
    profile = PROFILES[k % len(PROFILES)]
    if method == "kivi" and dtype == "float16" and profile == "large":
        profile = "normal"   # fp16 'large' groups are fine, but keep fp16 scale overflow to edge cases
    x = random_input(cid, shape, dtype, profile)
    extra_txt = f", G={params.group_size}, role {params.role}" if params.group_size else ""
    return CaseDef(cid, "encode", method, params, dtype, x, ("random",),
                   f"random {profile} input, {label}{extra_txt}, shape {shape}", file)


def _window_and_stream_cases(method: str) -> list[CaseDef]:
    """Encode with R > 0, and streams: random chunkings (equal to one-shot), trims."""
    out = []
    file = f"bulk/{method}.npz"
    info = spec.method_info(method)
    b = info["default_bits"]
    kivi = method == "kivi"
    extra = {"bits2": b} if method == "turboquant_rvq" else {}
    dtypes = {"float16": "window-000", "bfloat16": "window-001", "float32": "window-002"}
    for i, (dtype, tag) in enumerate(dtypes.items()):
        d = (64, 128, 32)[i]
        role = "kv"[i % 2]
        if kivi:
            shape, g, r = (1, 2, 40, d), 16, (5, 3, 40)[i]
        else:
            shape, g, r = (1, 2, 6, d), None, (4, 2, 10)[i]
            if method == "mlx_affine":
                g = 32
        cid = f"{method}-b{b}-d{d}-{_short(dtype)}-{tag}"
        rng = InputRng(cid + "/params")
        params = spec.Params(method=method, bits=b, window=r, group_size=g, **extra,
                             **_stream_params(rng, role)).resolved()
        x = random_input(cid, shape, dtype, "normal")
        q = params.encoded_tokens(shape[2])
        out.append(CaseDef(cid, "encode", method, params, dtype, x, ("window", "random"),
                           f"window R={r}, T={shape[2]}: Q={q} encoded, {shape[2] - q} exact tokens", file))
    # Streams. Chunk sizes from the case RNG; ops are stored with the case.
    plans = [
        ("chunked-000", "float16", 0, ("chunked",), None),
        ("chunked-001", "bfloat16", 3, ("chunked", "window"), None),
        ("trim-000", "float32", 0, ("chunked", "trim"), "trim"),
        ("trim-001", "float16", 4, ("chunked", "trim", "window"), "trim"),
    ]
    for j, (tag, dtype, r, flags, mode) in enumerate(plans):
        d = 64 if j % 2 == 0 else 16
        g = 16 if kivi else (32 if method == "mlx_affine" else None)
        if method == "mlx_affine" and d < 32:
            d = 32
        total = 45 if kivi else 13
        cid = f"{method}-b{b}-d{d}-{_short(dtype)}-{tag}"
        rng = InputRng(cid + "/params")
        params = spec.Params(method=method, bits=b, window=r, group_size=g, **extra,
                             **_stream_params(rng, "kv"[j % 2])).resolved()
        sizes = []
        left = total
        while left > 0:
            n = min(left, int(rng.ints(1, 1, 20 if kivi else 5)[0]))
            sizes.append(n)
            left -= n
        ops: list[tuple[str, int]] = [("append", n) for n in sizes]
        if mode == "trim":
            # trim a little (window only), a lot (into the encoded prefix), append again, over-trim.
            ops = ops[:len(ops) // 2] + [("trim", 1)] + ops[len(ops) // 2:] + [("trim", 20 if kivi else 7),
                                                                            ("append", 5), ("append", 19 if kivi else 3)]
            if j == 2:
                ops += [("trim", 1000), ("append", 2)]
        n_in = sum(n for op, n in ops if op == "append")
        x = random_input(cid, (1, 2, n_in, d), dtype, "normal")
        desc = " ".join(f"{op[0]}{n}" for op, n in ops)
        out.append(CaseDef(cid, "stream", method, params, dtype, x, flags,
                           f"stream R={r}: {desc} (a=append, t=trim)", file, ops=tuple(ops)))
    return out


def _h(*hexes: str) -> list[float]:
    return [float.fromhex(h) for h in hexes]


# Inputs with two non-zero coordinates at d = 16 land u exactly on a codebook value: the RHT of
# x = (p, q, 0, ..., 0) has |y_j| = |p ± q| × s_16 in every coordinate (all other butterfly steps add
# zeros), so u_j = fl(fl(|p ± q| × 0.25) × fl(1/n)). The pairs below were found by an exhaustive search
# over the input dtype's values (`find_tie_inputs`); the generator re-checks each one on the reference's
# own intermediate u (`reference.turboquant.rotate_to_unit`) and refuses to write a case that misses.
TIE_INPUTS = {
    # (table, dtype): (p, q)                    target: u on a boundary of gaussian[b] at d = 16
    ("gaussian2", "float16"): _h("0x1.268p+0", "-0x1.57cp-6"),
    ("gaussian4", "float16"): _h("0x1.2e8p+0", "0x1.fep-4"),
    ("gaussian4", "bfloat16"): _h("0x1.e4p+0", "0x1.98p-3"),
    ("gaussian2", "float32"): _h("0x1.1f68c6p+0", "-0x1.4f790ep-6"),
    ("gaussian3", "float32"): _h("0x1.e61950p+0", "-0x1.b66128p-1"),
    ("gaussian4", "float32"): _h("0x1.c38382p+0", "-0x1.854f64p-1"),
    # turboquant_rvq: u on a stage-1 centroid (residual e = ±0) / residual on a stage-2 boundary
    ("centroid1", "float16"): _h("0x1.154p+0", "-0x1.a14p-3"),
    ("centroid2", "float32"): _h("0x1.2b845cp+0", "-0x1.286a2p-1"),
    ("residual2.2", "float16"): _h("0x1.514p+0", "0x1.6a4p-3"),
}


def _tie_x(p: float, q: float, dtype: str) -> np.ndarray:
    """Two tokens per head, two heads: (p, q), (q, p), and both scaled by 2^3 (u is scale invariant)."""
    x = np.zeros((1, 2, 2, 16), dtype=np.float64)
    x[0, 0, 0, :2] = (p, q)
    x[0, 0, 1, :2] = (q, p)
    x[0, 1, 0, :2] = (8 * p, 8 * q)
    x[0, 1, 1, 0], x[0, 1, 1, 9] = p, q     # positions 0 and 9: same magnitudes through H
    return cast_input(x, dtype)


def _tie_targets(table: str) -> tuple[np.ndarray, Callable]:
    """(values u may hit, predicate on u) for a tie table name."""
    import reference.codebooks as rcb
    if table.startswith("gaussian"):
        b = int(table[-1])
        _c, bd = rcb.gaussian(b, 16)
        return bd, lambda u: np.isin(u, bd[bd != 0])
    if table.startswith("centroid"):
        b = int(table[-1])
        cd, _b = rcb.gaussian(b, 16)
        return cd, lambda u: np.isin(u, cd)
    b, b2 = (int(v) for v in table[len("residual"):].split("."))
    c1, b1 = rcb.gaussian(b, 16)
    _c2, bb2 = rcb.residual(b, b2, 16)

    def pred(u):
        e = u - c1[rcb.quantize(u, b1)]
        return np.isin(e, bb2[bb2 != 0])
    return bb2, pred


def verify_tie(x: np.ndarray, dtype: str, params: spec.Params, table: str) -> int:
    """Number of coordinates whose reference-computed u hits the tie target (0 means no tie)."""
    import reference.turboquant as rtq
    p = params.resolved()
    xf = upcast(x, dtype)
    _n, _r, _y, u, _s = rtq.rotate_to_unit(xf, p)
    _vals, pred = _tie_targets(table)
    return int(pred(u).sum())


def _edge_cases(method: str) -> list[CaseDef]:
    """Hand-picked cases: readable TOML, d = 16 unless said otherwise."""
    out: list[CaseDef] = []
    file = f"cases/{method}.toml"
    info = spec.method_info(method)
    b = info["default_bits"]
    kivi = method == "kivi"
    affine = method == "mlx_affine"
    norm_method = not (kivi or affine)
    d0 = 32 if affine else 16
    base = {"bits": b, "window": 0}
    if method == "turboquant_rvq":
        base["bits2"] = b
    if kivi:
        base.update(group_size=16, role="k")
    if affine:
        base.update(group_size=32)

    def P(**kw) -> spec.Params:
        return spec.Params(method=method, **{**base, **kw})

    def add(tag, kind, params, dtype, x, flags, comment, error=None, resolve=True):
        cid = f"{method}-{tag}"
        if resolve:
            params = params.resolved()
        out.append(CaseDef(cid, kind, method, params, dtype, x, tuple(flags), comment, file, error=error))

    T = 16 if kivi else 3     # kivi key groups need G = 16 tokens

    def rows(*token_values, dtype="float16", d=d0, t=T):
        """Build x (1, 1, t, d): given token rows, the rest random normal-ish."""
        v = InputRng(f"{method}-{dtype}-{len(token_values)}-{d}-{t}").normalish((1, 1, t, d))
        for i, tv in enumerate(token_values):
            v[0, 0, i] = tv
        return v

    # --- zero vectors, negative zero
    z = rows(np.zeros(d0), np.full(d0, -0.0))
    if kivi:   # a whole key group (all channels x 16 tokens) of -0 and one of +0: two heads
        z = np.zeros((1, 2, 16, d0)); z[0, 0] = -0.0
    add(f"b{b}-d{d0}-f16-zero-vector-000", "encode", P(), "float16", cast_input(z, "float16"),
        ["zero-vector", "negative-zero"],
        "a -0 group and a +0 group: zero canonicalized to +0, S = 0" if kivi else
        "all +0 and all -0 tokens: the zero path (n = 0, u = ±0)")
    # --- subnormals
    sub16 = rows(np.arange(1, d0 + 1) * 2.0 ** -24 * np.where(np.arange(d0) % 3 == 0, -1, 1),
                 np.where(np.arange(d0) == 5, 1.0, 2.0 ** -20))
    add(f"b{b}-d{d0}-f16-subnormal-000", "encode", P(), "float16", cast_input(sub16, "float16"),
        ["subnormal"], "float16 subnormal inputs (exact in binary32); a token mixing 1.0 and subnormals")
    sub32 = rows(np.full(d0, 2.0 ** -140), np.where(np.arange(d0) % 2 == 0, 2.0 ** -149, -2.0 ** -130),
                 dtype="float32")
    add(f"b{b}-d{d0}-f32-subnormal-001", "encode", P(), "float32", cast_input(sub32, "float32"),
        ["subnormal", "underflow"],
        "binary32 subnormal groups: the float16 scale and zero underflow to 0" if kivi else
        "binary32 subnormal tokens: every square underflows to 0, so n = 0 (zero path) though x != 0")
    subbf = rows(np.full(d0, 2.0 ** -133), np.where(np.arange(d0) < 4, 2.0 ** -126, 2.0 ** -127),
                 dtype="bfloat16")
    add(f"b{b}-d{d0}-bf16-subnormal-002", "encode", P(), "bfloat16", cast_input(subbf, "bfloat16"),
        ["subnormal"], "bfloat16 subnormals and values near the binary32 normal limit")
    # --- float16 extremes
    mx = rows(np.full(d0, 65504.0), np.where(np.arange(d0) % 2 == 0, 65504.0, -65504.0))
    if kivi:
        mx = np.where(np.arange(16)[:, None] % 2 == 0, 65504.0, -65504.0) * np.ones((1, 1, 16, d0))
        add(f"b2-d{d0}-f16-max-fp16-000", "encode", P(bits=2), "float16", cast_input(mx, "float16"),
            ["max-fp16"], "±65504 groups at b=2: s = 131008/3 rounds to a finite float16 scale")
        add(f"b1-d{d0}-f16-max-fp16-error-001", "error", P(bits=1), "float16", cast_input(mx, "float16"),
            ["max-fp16", "error"], "±65504 groups at b=1: s = 131008 overflows float16, rejected",
            ExpectedError("ValueError", "x"))
        zbig = rows(dtype="float32"); zbig[0, 0, 3, 7] = -70000.0
        add(f"b4-d{d0}-f32-zero-overflow-error-000", "error", P(bits=4), "float32", cast_input(zbig, "float32"),
            ["error", "fp16-range"], "float32 group minimum -70000: float16 zero is -Inf, rejected",
            ExpectedError("ValueError", "x"))
        bbig = rows(dtype="bfloat16"); bbig[0, 0, 0, 0] = 2.0 ** 20
        add(f"b1-d{d0}-bf16-scale-overflow-error-000", "error", P(bits=1), "bfloat16",
            cast_input(bbig, "bfloat16"), ["error", "fp16-range"],
            "bfloat16 group with a 2^20 value at b=1: s = 2^20 + O(1) overflows float16, rejected",
            ExpectedError("ValueError", "x"))
        near = rows(dtype="float32"); near[0, 0, :, 0] = np.linspace(-65504.0, 65504.0, 16)
        add(f"b8-d{d0}-f32-near-fp16-range-000", "encode", P(bits=8), "float32", cast_input(near, "float32"),
            ["fp16-range"], "channel 0 spans ±65504 exactly: z16 = -65504, s16 = 131008/255 finite")
    else:
        add(f"b{b}-d{d0}-f16-max-fp16-000", "encode", P(), "float16", cast_input(mx, "float16"),
            ["max-fp16"], "tokens of ±65504 (the largest float16); squares 2^32-ish stay finite in binary32")
    if affine:
        span = rows(dtype="float32"); span[0, 0, 0, 0] = 3e38; span[0, 0, 0, 1] = -3e38
        add(f"b{b}-d{d0}-f32-range-overflow-error-000", "error", P(), "float32", cast_input(span, "float32"),
            ["overflow", "error"], "float32 group holding ±3e38: max − min overflows binary32, rejected",
            ExpectedError("ValueError", "x"))
    if norm_method:
        ov = rows(dtype="bfloat16"); ov[0, 0, 1, 3] = float.fromhex("0x1.fep+127")
        add(f"b{b}-d{d0}-bf16-overflow-error-000", "error", P(), "bfloat16", cast_input(ov, "bfloat16"),
            ["bf16-overflow", "error"], "bfloat16 0x7f7f (3.39e38): its square overflows, norm +Inf, rejected",
            ExpectedError("ValueError", "x"))
        ov2 = rows(dtype="bfloat16"); ov2[0, 0, 2, 0] = 1.5 * 2.0 ** 63; ov2[0, 0, 2, 8] = 1.5 * 2.0 ** 63
        add(f"b{b}-d{d0}-bf16-overflow-error-001", "error", P(), "bfloat16", cast_input(ov2, "bfloat16"),
            ["bf16-overflow", "error"], "two bfloat16 1.5*2^63: each square finite, their fold sum +Inf, rejected",
            ExpectedError("ValueError", "x"))
        ok = rows(dtype="bfloat16"); ok[0, 0, 0, 0] = 2.0 ** 63
        add(f"b{b}-d{d0}-bf16-near-overflow-000", "encode", P(), "bfloat16", cast_input(ok, "bfloat16"),
            ["near-overflow"], "bfloat16 2^63 next to O(1) values: square 2^126 is finite, accepted")
        ov3 = rows(dtype="float32"); ov3[0, 0, 0, 0] = 1e20
        add(f"b{b}-d{d0}-f32-overflow-error-000", "error", P(), "float32", cast_input(ov3, "float32"),
            ["overflow", "error"], "float32 1e20: square overflows binary32, rejected",
            ExpectedError("ValueError", "x"))
        # overflow only in the window: allowed (rules apply to encoded tokens, spec/streaming.md)
        add(f"b{b}-d{d0}-bf16-overflow-in-window-000", "encode", P(window=1), "bfloat16",
            cast_input(ov, "bfloat16")[:, :, :2], ["bf16-overflow", "window"],
            "the overflowing token sits in the window (R=1): not encoded, so not rejected")
    # --- NaN / Inf, bad shapes and parameters
    nan = rows(dtype="float32"); nan[0, 0, T - 1, 1] = np.nan
    add(f"b{b}-d{d0}-f32-nan-error-000", "error", P(), "float32", nan.astype(np.float32),
        ["nan", "error"], "a NaN anywhere in x is rejected", ExpectedError("ValueError", "x"))
    inf = rows(dtype="float16"); inf[0, 0, 0, 2] = -np.inf
    add(f"b{b}-d{d0}-f16-inf-error-000", "error", P(), "float16", inf.astype(np.float16),
        ["inf", "error"], "a -Inf in x is rejected", ExpectedError("ValueError", "x"))
    add(f"b{b}-d36-f16-head-dim-error-000", "error", P(), "float16",
        cast_input(InputRng("hd").normalish((1, 1, T, 36)), "float16"), ["error", "shape"],
        "head dim 36 is not m * 2^k with m in (1, 12, 20, 28) (spec 1.0's case used 48 = 12 * 4, "
        "accepted since 1.1)", ExpectedError("ValueError", "x"))
    add(f"b{b}-d{d0}-f16-rank-error-000", "error", P(), "float16",
        cast_input(InputRng("rk").normalish((1, T, d0)), "float16"), ["error", "shape"],
        "rank-3 input", ExpectedError("ValueError", "x"))
    add(f"b{b}-d{d0}-f16-empty-error-000", "error", P(), "float16", np.zeros((1, 1, 0, d0), np.float16),
        ["error", "shape"], "empty token axis", ExpectedError("ValueError", "x"))
    add(f"b{b}-d{d0}-f64-dtype-error-000", "error", P(), "float32", rows(dtype="float32"),
        ["error", "dtype"], "a float64 array passed as dtype float32", ExpectedError("ValueError", "x"))
    bad_bits = max(info["bits"]) + 1
    for tag, kw, arg in [
        (f"b{bad_bits}", {"bits": bad_bits}, "bits"), ("b0", {"bits": 0}, "bits"),
        ("role", {"role": "q"}, "role"), ("seed", {"seed": -1}, "seed"), ("seed-big", {"seed": 1 << 64}, "seed"),
        ("layer", {"layer": 1 << 32}, "layer"), ("head-offset", {"head_offset": -1}, "head_offset"),
        ("window", {"window": -1}, "window"),
    ] + ([("bits2", {"bits2": 5}, "bits2")] if method == "turboquant_rvq" else
         [("bits2", {"bits2": 2}, "bits2")]) + (
        [("group-size", {"group_size": 8}, "group_size")] if "group_sizes" in info else
        [("group-size", {"group_size": 32}, "group_size")]):
        add(f"{tag}-d{d0}-f16-param-error-000", "error", P(**kw), "float16", cast_input(rows(), "float16"),
            ["error", "params"], f"invalid parameter {arg} = {kw[arg]!r}", ExpectedError("ValueError", arg),
            resolve=False)
    if kivi:
        add("b2-g32-v-d16-f16-param-error-000", "error", P(role="v", group_size=32), "float16",
            cast_input(rows(t=2), "float16"), ["error", "params"], "values with G = 32 > d = 16",
            ExpectedError("ValueError", "group_size"))
    # --- extreme stream-key parameters (uint64 seed, uint32 layer/head_offset at their maxima)
    if not kivi:
        mxp = P(seed=(1 << 64) - 1, layer=(1 << 32) - 1, head_offset=(1 << 32) - 2, role="v")
        add(f"b{b}-d{d0}-f32-max-params-000", "encode", mxp, "float32",
            cast_input(InputRng("mxp").normalish((1, 2, 2, d0)), "float32"), ["max-params"],
            "seed 2^64-1, layer 2^32-1, global heads 2^32-2 and 2^32-1, role v")
    # --- method-specific ties
    if kivi:
        grp = np.array([0, 1, 2, 3, 0.5, 1.5, 2.5, 3, 0.25, 0.75, 2.25, 2.75, 1, 2, 0, 3.5 - 0.5])
        xk = np.repeat(grp[None, :, None], d0, axis=2)[None] * np.ones((1, 1, 1, 1))
        xk[0, 0, :, 1::2] *= 2.0    # odd channels: S = 2, same ties
        for dt in ("float16", "bfloat16", "float32"):
            add(f"b2-g16-k-d16-{_short(dt)}-tie-000", "encode", P(bits=2, role="k"), dt, cast_input(xk, dt),
                ["tie"], "spec kivi.md tie example per channel: y = 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 (ties to even)")
        xv = np.tile(grp, (2, 1))[None, None] * np.ones((1, 1, 1, 1))   # (1, 1, 2, 16): per-token groups
        add("b2-g16-v-d16-f16-tie-001", "encode", P(bits=2, role="v"), "float16", cast_input(xv, "float16"),
            ["tie"], "spec kivi.md tie example per token (values, G = 16)")
        xc = np.full((1, 1, 16, d0), 0.1)
        add("b3-g16-k-d16-f32-constant-000", "encode", P(bits=3), "float32", cast_input(xc, "float32"),
            ["constant"], "a constant group: S = 0, every code 0, decode gives Z")
    elif not affine:
        tie_tables = {"turboquant": [("gaussian2", 2), ("gaussian3", 3), ("gaussian4", 4)],
                      "turboquant_prod": [("gaussian2", 3), ("gaussian3", 4), ("gaussian4", 5)],
                      "turboquant_rvq": [("gaussian2", 2), ("centroid1", 1), ("centroid2", 2),
                                         ("residual2.2", 2)],
                      "rabitq": []}[method]
        for table, tb in tie_tables:
            for (tname, dt), (p, q) in TIE_INPUTS.items():
                if tname != table:
                    continue
                params = P(bits=tb, **({"bits2": 2} if method == "turboquant_rvq" else {}))
                add(f"b{tb}-d16-{_short(dt)}-tie-{table}", "encode", params, dt, _tie_x(p, q, dt),
                    ["tie"], f"u lands exactly on a {table} value at d=16 (x = ({p.hex()}, {q.hex()}, 0...)): "
                             "the lower index wins")
    return out


# ----------------------------------------------------------------------------------------------------
# Expected values: only from the numpy reference.

class GenerationError(RuntimeError):
    pass



class ReplayMismatch(AssertionError):
    """A stream op of a golden case did not behave as the case requires (a rejected append was accepted,
    raised something else, or changed the state)."""


def _same_state(a: dict | None, b: dict | None) -> bool:
    a, b = a or {}, b or {}
    return list(a) == list(b) and all(
        np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.asarray(a[k]).shape == np.asarray(b[k]).shape
        and np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)


def replay(stream, x: np.ndarray, ops, reload=None):
    """Run a stream case's ops on any stream object (append, trim, record, tokens); returns
    (final stream, what each trim returned). Ops:
    ("append", n): feed the next n tokens of x (as a C-contiguous array);
    ("trim", n): trim n;
    ("reject", n): feed the next n tokens, which must raise ValueError naming `x` and leave the stream's
      tokens and record unchanged (else ReplayMismatch);
    ("save_load", 0): stream = reload(stream), the stream saved and loaded (`reload` must be given)."""
    pos, trimmed = 0, []
    for i, (op, n) in enumerate(ops):
        if op == "append":
            try:
                stream.append(np.ascontiguousarray(x[:, :, pos:pos + n]))
            except ValueError as e:
                raise ReplayMismatch(f"op {i} (append {n}): rejected ({e}); the case expects it accepted") from e
            pos += n
        elif op == "trim":
            trimmed.append(int(stream.trim(n)))
        elif op == "reject":
            before = (stream.tokens, stream.record())
            try:
                stream.append(np.ascontiguousarray(x[:, :, pos:pos + n]))
            except ValueError as e:
                if not re.match(r"\s*x\b", str(e)):
                    raise ReplayMismatch(f"op {i} (reject {n}): ValueError does not name x: {e}") from e
            else:
                raise ReplayMismatch(f"op {i} (reject {n}): the append was accepted; expected ValueError naming x")
            pos += n
            if stream.tokens != before[0] or not _same_state(stream.record(), before[1]):
                raise ReplayMismatch(f"op {i} (reject {n}): the rejected append changed the state")
        elif op == "save_load":
            if reload is None:
                raise ValueError("ops: a save_load op needs `reload`")
            stream = reload(stream)
        else:
            raise ValueError(f"ops: unknown op {op!r}")
    return stream, trimmed


def _reference_reload(stream):
    import copy
    import reference.stream
    return reference.stream.Stream.from_state(copy.deepcopy(stream.state()))


def _run_reference(cd: CaseDef) -> GoldenCase:
    import reference
    import reference.stream
    case = GoldenCase(cd.id, cd.kind, cd.method, cd.params, cd.dtype, tuple(np.shape(cd.x)), cd.flags,
                      cd.comment, cd.file, x=cd.x, ops=cd.ops, error=cd.error)
    if cd.kind == "error":
        try:
            reference.encode(cd.x.copy(), cd.params, cd.dtype)
        except Exception as e:  # noqa: BLE001 - any type is compared against the expectation
            if not case.expected_error_matches(e):
                raise GenerationError(f"{cd.id}: reference raised {type(e).__name__}({e}); expected "
                                      f"{cd.error.type} naming {cd.error.argument!r}") from e
            return case
        raise GenerationError(f"{cd.id}: reference accepted the input; expected {cd.error.type} naming "
                              f"{cd.error.argument!r}")
    if cd.kind == "encode":
        case.record = reference.encode(cd.x.copy(), cd.params, cd.dtype)
    else:
        s = reference.stream.Stream(cd.params, cd.dtype)
        s, trimmed = replay(s, cd.x, cd.ops, _reference_reload)
        case.record = s.record()
        case.trimmed = np.array(trimmed, dtype=np.int64)
    case.decoded = reference.decode(case.record, cd.params, cd.dtype)
    return case


def case_defs(methods=None) -> list[CaseDef]:
    """Every method case, in manifest order."""
    from tools import golden_exact_trim, golden_spec11
    out = []
    for m in methods or available_methods():
        out += _edge_cases(m) + _random_cases(m) + _window_and_stream_cases(m)
    for m in methods or available_methods():
        out += golden_spec11.case_defs(m) + golden_exact_trim.case_defs(m)
    ids = [c.id for c in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise GenerationError(f"duplicate case ids: {sorted(dup)}")
    return out


def _check_ties(defs: list[CaseDef]) -> None:
    """Each tie case must really put u on the intended value (checked on the reference's own u)."""
    for cd in defs:
        if "tie" in cd.flags and cd.method not in ("kivi", "mlx_affine"):
            table = cd.id.rsplit("-tie-", 1)[1]
            hits = verify_tie(cd.x, cd.dtype, cd.params, table)
            if hits == 0:
                raise GenerationError(f"{cd.id}: no coordinate of u lands on the {table} value")


def generate_cases(methods=None) -> list[GoldenCase]:
    from tools import golden_exact_trim, golden_spec11
    defs = case_defs(methods)
    _check_ties(defs)
    cases = [_run_reference(cd) for cd in defs]
    golden_spec11.check_cases(cases)   # each 1.1 case really exercises its rule (else GenerationError)
    golden_exact_trim.check_cases(cases)
    return cases


# ----------------------------------------------------------------------------------------------------
# Component vectors (cases/prng.toml, rotation.toml, packing.toml, codebooks.toml)

def _hx(v: int, digits: int) -> str:
    return f"0x{v:0{digits}X}"


def _hexarr(a: np.ndarray, label: str) -> list[str]:
    digits = _STORAGE[label][2]
    return [_hx(int(v), digits) for v in _bits(a, label).reshape(-1)]


def component_vectors() -> dict[str, dict]:
    from reference import codebooks as rcb, packing as rpk, prng as rpr, rotation as rrot
    M = (1 << 64) - 1
    prng: dict = {"mix64": [], "sequence": [], "stream_key": [], "signs": []}
    for i, z in enumerate([0, 1, 2, M, rpr.GAMMA, 0x0123456789ABCDEF, 1 << 63]):
        prng["mix64"].append({"id": f"prng-mix64-{i:03d}", "comment": "mix64(input)",
                              "input": _hx(z, 16), "output": _hx(rpr.mix64(z), 16)})
    for i, st in enumerate([0, 1, M, 42, 0x9E3779B97F4A7C15]):
        prng["sequence"].append({"id": f"prng-sequence-{i:03d}", "comment": "first 8 words of next() from state",
                                 "state": _hx(st, 16), "words": [_hx(w, 16) for w in rpr.words(st, 8)]})
    keys = [(0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1), (0, 0, 1, 0, 0), (0, 1, 0, 0, 0),
            (1, 0, 0, 0, 0), (M, (1 << 32) - 1, (1 << 32) - 1, 1, 1), (0x123456789ABCDEF0, 27, 5, 0, 0),
            (2026, 3, 7, 1, 0)]
    for i, (seed, layer, head, role, purpose) in enumerate(keys):
        k = rpr.stream_key(seed, layer, head, role, purpose)
        prng["stream_key"].append({"id": f"prng-stream-key-{i:03d}",
                                   "comment": "stream_key(seed, layer, head, role, purpose) and its first words",
                                   "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role,
                                   "purpose": purpose, "key": _hx(k, 16),
                                   "words": [_hx(w, 16) for w in rpr.words(k, 4)]})
    for i, d in enumerate(V1_HEAD_DIMS):
        seed, layer, head, role, purpose = 2026, 3, d % 7, i % 2, (i // 2) % 2
        sig = rpr.sign_vector(seed, layer, head, role, purpose, d)
        prng["signs"].append({"id": f"prng-signs-d{d}", "comment": "sign vector: '-' where the bit is 1",
                              "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role,
                              "purpose": purpose, "d": d,
                              "signs": "".join("-" if s < 0 else "+" for s in sig)})
    rot: dict = {"hadamard": [], "rht": []}
    for d in (16, 64):
        x = InputRng(f"hadamard-{d}").normalish((d,)).astype(np.float32)
        rot["hadamard"].append({"id": f"rotation-hadamard-d{d}", "comment": "unnormalized H (no signs, no scale)",
                                "d": d, "x": _hexarr(x, "float32"),
                                "h": _hexarr(rrot.hadamard(x), "float32")})
    for i, d in enumerate(V1_HEAD_DIMS):
        seed, layer, head, role, purpose = 7, 1, d % 5, 0, i % 2
        sig = rpr.sign_vector(seed, layer, head, role, purpose, d)
        x = InputRng(f"rht-{d}").normalish((d,)).astype(np.float32)
        y = rrot.rht(x, sig)
        rot["rht"].append({"id": f"rotation-rht-d{d}", "comment": "y = RHT(x); x_back = RHT_inverse(y) (not exactly x)",
                           "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role, "purpose": purpose,
                           "d": d, "x": _hexarr(x, "float32"), "y": _hexarr(y, "float32"),
                           "x_back": _hexarr(rrot.rht_inverse(y, sig), "float32")})
    pack: dict = {"pack": []}
    ex = np.array([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3], dtype=np.uint32)
    pack["pack"].append({"id": "packing-b3-spec-example", "comment": "spec/packing.md example", "bits": 3,
                         "codes": [int(c) for c in ex], "words": _hexarr(rpk.pack(ex, 3), "uint32")})
    for b in range(1, 9):
        for n in (1, 11, 16, 64):
            rng = InputRng(f"pack-{b}-{n}")
            c = rng.ints(n, 0, (1 << b) - 1).astype(np.uint32)
            c[0] = (1 << b) - 1          # the largest code in the first slot
            w = rpk.pack(c, b)
            pack["pack"].append({"id": f"packing-b{b}-n{n}", "comment": f"{n} random codes at {b} bits",
                                 "bits": b, "codes": [int(v) for v in c], "words": _hexarr(w, "uint32")})
    cb: dict = {"table": []}
    for d in V1_HEAD_DIMS:
        for b in (1, 2, 3, 4):
            c, bb = rcb.gaussian(b, d)
            cb["table"].append({"id": f"codebooks-gaussian{b}-d{d}", "comment": "C_d, B_d = table x s_d",
                                "kind": "gaussian", "bits": b, "d": d,
                                "centroids": _hexarr(c, "float32"), "boundaries": _hexarr(bb, "float32")})
        for b in (1, 2, 3, 4):
            for b2 in (1, 2, 3, 4):
                c, bb = rcb.residual(b, b2, d)
                cb["table"].append({"id": f"codebooks-residual{b}.{b2}-d{d}", "comment": "C_d, B_d = table x s_d",
                                    "kind": "residual", "bits": b, "bits2": b2, "d": d,
                                    "centroids": _hexarr(c, "float32"), "boundaries": _hexarr(bb, "float32")})
    from tools import golden_spec11
    return {"prng": prng, "rotation": rot, "packing": pack, "codebooks": cb,
            "headdims": golden_spec11.component_vectors()}


# ----------------------------------------------------------------------------------------------------
# TOML writing (a small emitter: the files are generated, and tomllib reads them back)

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
HEADER = ("# Generated by `veloxquant golden regen` (tools/golden.py) from the numpy reference.\n"
          "# Do not edit by hand. Arrays: dtype, shape (row-major) and bit patterns in hex;\n"
          "# bfloat16 values are their 16-bit patterns, floats their IEEE bits.\n")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        if len(v) > 16 and all(isinstance(e, str) and e.startswith("0x") for e in v):
            per = 8 if len(v[0]) <= 10 else 4
            lines = [", ".join(json.dumps(e) for e in v[i:i + per]) for i in range(0, len(v), per)]
            return "[\n  " + ",\n  ".join(lines) + ",\n]"
        return "[" + ", ".join(_val(e) for e in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_val(e)}" for k, e in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _toml_table(lines: list, header: str, d: dict) -> None:
    lines.append(header)
    for k, v in d.items():
        lines.append(f"{_key(k)} = {_val(v)}")
    lines.append("")


def _array_table(a: np.ndarray, label: str) -> dict:
    return {"dtype": label, "shape": list(a.shape), "hex": _hexarr(a, label)}


def _case_arrays(c: GoldenCase) -> dict[str, np.ndarray]:
    """Field name -> array: x, record.<field>, decoded, trimmed (what the data files hold)."""
    out = {"x": c.x}
    for k, v in (c.record or {}).items():
        out[f"record.{k}"] = v
    if c.decoded is not None:
        out["decoded"] = c.decoded
    if c.trimmed is not None:
        out["trimmed"] = c.trimmed
    return out


def _render_case_toml(cases: list[GoldenCase]) -> bytes:
    lines = [HEADER]
    for c in cases:
        lines += ["[[case]]", f"id = {_val(c.id)}", f"comment = {_val(c.comment)}", ""]
        for name, a in _case_arrays(c).items():
            _toml_table(lines, f"[case.{name}]", _array_table(a, _label(a, c.dtype)))
    return "\n".join(lines).encode()


def _render_components(name: str, data: dict) -> bytes:
    lines = [HEADER]
    for section, entries in data.items():
        for e in entries:
            _toml_table(lines, f"[[{section}]]", e)
    return "\n".join(lines).encode()


# Deterministic npz: stored (no compression), fixed timestamps; readable by np.load.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for key, a in arrays.items():
            info = zipfile.ZipInfo(key + ".npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            body = io.BytesIO()
            np.lib.format.write_array(body, np.ascontiguousarray(a), allow_pickle=False)
            z.writestr(info, body.getvalue())
    return buf.getvalue()


def _npz_read(data: bytes) -> dict[str, np.ndarray]:
    """Read every member without trusting its CRC, so that a flipped byte is reported per field."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            off = info.header_offset
            name_len, extra_len = struct.unpack("<HH", data[off + 26:off + 30])
            start = off + 30 + name_len + extra_len
            raw = data[start:start + info.compress_size]
            if info.compress_type != zipfile.ZIP_STORED:
                raw = z.read(info)
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            out[key] = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    return out


def _manifest_entry(c: GoldenCase) -> dict:
    e = {"id": c.id, "kind": c.kind, "method": c.method, "file": c.file, "dtype": c.dtype,
         "shape": list(c.shape), "flags": list(c.flags), "comment": c.comment,
         "params": _params_to_toml(c.params)}
    if c.ops is not None:
        e["ops"] = [{"op": op, "n": n} for op, n in c.ops]
    if c.error is not None:
        e["error"] = {"type": c.error.type, "argument": c.error.argument}
    return e


# The text of golden/README.md (written by regen like every other file, so check compares it too).
FORMAT_README = """# Golden vectors: file format

Generated by `veloxquant golden regen` (tools/golden.py) from the numpy reference; `veloxquant golden check`
regenerates everything in memory and compares bits. Do not edit by hand. What the vectors mean is in spec/.

## manifest.toml
- `spec_version`, `generator_version`; `[files."<path>"]` with `sha256` and `bytes` of every file here.
- One `[[case]]` per method case: `id`, `kind` (`encode` | `stream` | `error`), `method`, `params` (the
  spec's parameters; `seed` as a hex string, or a plain integer where the case is an invalid seed),
  `dtype` (the **declared** input dtype; an error case may hold an array of another dtype), `shape`,
  `flags`, `comment`, `file` (where its arrays are); stream cases add `ops` (a list of
  `{op = "append" | "trim" | "reject" | "save_load", n}`); error cases add `error = {type, argument}`:
  encode must raise that exception type with a message naming that argument. `params` holds what the case
  passes: a parameter left out takes its default (e.g. `bits2` in the `bits2-default` cases).

## Arrays
- `cases/<method>.toml`: hand-picked cases. Each `[[case]]` has `id`, `comment` and sub-tables
  `[case.x]`, `[case.record.<field>]`, `[case.decoded]`, `[case.trimmed]` (as present), each with `dtype`,
  `shape` (row-major) and `hex`: the elements' bit patterns (floats as their IEEE bits, bfloat16 as its
  16-bit pattern, integers as themselves).
- `cases/<method>-rules.toml` (spec 1.1): the same format; one case per rule the 1.0 cases did not pin, its
  comment naming the rule.
- `bulk/<method>.npz`: random cases, uncompressed. Keys: `<id>/x`, `<id>/record/<field>`, `<id>/decoded`,
  `<id>/trimmed`. bfloat16 arrays are stored as uint16 bit patterns; every other array in its own dtype.
  `bulk/<method>-headdims.npz` (spec 1.1): the same, at the head dims that are not powers of two.
- Stream cases: `x` is all appended chunks joined along T; the `ops` consume it in order (`append n` takes the
  next n tokens; `reject n` takes the next n tokens too, and that append must raise ValueError naming `x` and
  leave the state unchanged; `save_load` saves the stream's state and continues with a stream loaded from
  it); `record` and `decoded` describe the final state; `trimmed` holds what each trim returned.

## Component vectors (cases/prng.toml, rotation.toml, packing.toml, codebooks.toml, headdims.toml)
Listed under `[files]` only. Each table array holds vectors with an `id` and a `comment`:
- prng.toml: `[[mix64]]` input/output (hex uint64), `[[sequence]]` (words of `next` from a state), `[[stream_key]]` inputs
  (seed, layer, head, role as 0/1, purpose) and key, `[[signs]]` sign vectors as strings of '+'/'-'.
- rotation.toml: `[[hadamard]]` (H on integer vectors) and `[[rht]]` (RHT and its inverse for a stream).
- packing.toml: `[[pack]]`: bits, codes, words (hex uint32).
- codebooks.toml: `[[table]]`: every codebook table scaled to every power-of-two head dim (C_d, B_d as
  binary32 hex).
- headdims.toml (spec 1.1), the head dims d = m·2^k that are not powers of two: `[[signs]]` as in
  prng.toml; `[[hadamard]]` (x, H(x) and Hᵀ(x), binary32 hex); `[[rht]]` as in rotation.toml;
  `[[fold]]` (v and fold(v), binary32 hex); `[[table]]` as in codebooks.toml.
"""


def render(cases: list[GoldenCase], components: dict) -> dict[str, bytes]:
    """Every file of golden/ (relative path -> bytes), manifest last."""
    files: dict[str, bytes] = {}
    by_file: dict[str, list[GoldenCase]] = {}
    for c in cases:
        by_file.setdefault(c.file, []).append(c)
    files["README.md"] = FORMAT_README.encode()
    for name in COMPONENT_FILES:
        files[f"cases/{name}.toml"] = _render_components(name, components[name])
    for f, cs in by_file.items():
        if f.endswith(".toml"):
            files[f] = _render_case_toml(cs)
        else:
            arrays = {}
            for c in cs:
                for k, a in _case_arrays(c).items():
                    arrays[f"{c.id}/{k.replace('.', '/')}"] = a
            files[f] = _npz_bytes(arrays)
    lines = ["# Golden vectors of VeloxQuant; generated by `veloxquant golden regen` (tools/golden.py).",
             "# `veloxquant golden check` regenerates everything from the numpy reference and compares bits.",
             f"spec_version = {_val(spec.SPEC_VERSION)}", f"generator_version = {_val(GENERATOR_VERSION)}", ""]
    for f in sorted(files):
        _toml_table(lines, f"[files.{_val(f)}]",
                    {"sha256": hashlib.sha256(files[f]).hexdigest(), "bytes": len(files[f])})
    for c in cases:
        _toml_table(lines, "[[case]]", _manifest_entry(c))
    files["manifest.toml"] = "\n".join(lines).encode()
    return files


def build(methods=None) -> tuple[list[GoldenCase], dict, dict[str, bytes]]:
    cases = generate_cases(methods)
    comps = component_vectors()
    return cases, comps, render(cases, comps)


# ----------------------------------------------------------------------------------------------------
# Reading golden/ (the API used by tests and by the conformance suite)

def _root(root) -> pathlib.Path:
    return ROOT if root is None else pathlib.Path(root)


def load_manifest(root=None) -> dict:
    with open(_root(root) / "manifest.toml", "rb") as f:
        return tomllib.load(f)


def _arrays_from_toml(data: bytes) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for c in tomllib.loads(data.decode()).get("case", []):
        fields = {}
        for k, v in c.items():
            if k in ("id", "comment"):
                continue
            if k == "record":
                for rk, rv in v.items():
                    fields[f"record.{rk}"] = _from_hex(rv["dtype"], rv["shape"], rv["hex"])
            else:
                fields[k] = _from_hex(v["dtype"], v["shape"], v["hex"])
        out[c["id"]] = fields
    return out


def _arrays_from_npz(data: bytes) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, a in _npz_read(data).items():
        cid, field = key.split("/", 1)
        out.setdefault(cid, {})[field.replace("/", ".")] = a
    return out


def _file_arrays(path: pathlib.Path) -> dict[str, dict[str, np.ndarray]]:
    data = path.read_bytes()
    return _arrays_from_toml(data) if path.suffix == ".toml" else _arrays_from_npz(data)


def _case_from_entry(e: dict, arrays: dict[str, np.ndarray]) -> GoldenCase:
    rec = {k[len("record."):]: v for k, v in arrays.items() if k.startswith("record.")}
    err = e.get("error")
    return GoldenCase(
        id=e["id"], kind=e["kind"], method=e["method"], params=_params_from_toml(e["method"], e["params"]),
        dtype=e["dtype"], shape=tuple(e["shape"]), flags=tuple(e["flags"]), comment=e["comment"],
        file=e["file"], x=arrays.get("x"), ops=tuple((o["op"], o["n"]) for o in e["ops"]) if "ops" in e else None,
        record=rec or None, decoded=arrays.get("decoded"), trimmed=arrays.get("trimmed"),
        error=ExpectedError(err["type"], err["argument"]) if err else None)


def iter_cases(root=None, *, methods=None, kinds=None, flags=None) -> Iterator[GoldenCase]:
    """Golden method cases in manifest order, optionally filtered by method, kind or any flag."""
    root = _root(root)
    man = load_manifest(root)
    cache: dict[str, dict] = {}
    for e in man.get("case", []):
        if methods is not None and e["method"] not in methods:
            continue
        if kinds is not None and e["kind"] not in kinds:
            continue
        if flags is not None and not set(flags) & set(e["flags"]):
            continue
        if e["file"] not in cache:
            cache[e["file"]] = _file_arrays(root / e["file"])
        yield _case_from_entry(e, cache[e["file"]].get(e["id"], {}))


def iter_vectors(name: str, root=None) -> dict[str, list[dict]]:
    """Component vectors of cases/<name>.toml (prng, rotation, packing, codebooks), hex strings as stored."""
    with open(_root(root) / "cases" / f"{name}.toml", "rb") as f:
        return tomllib.load(f)


# ----------------------------------------------------------------------------------------------------
# Comparison

_VIEW = {2: np.uint16, 4: np.uint32, 8: np.uint64, 1: np.uint8}


def diff_arrays(where: str, golden: np.ndarray, fresh: np.ndarray) -> str | None:
    """None if bit-identical, else: first differing index, both values in hex, XOR popcount."""
    if golden.dtype != fresh.dtype or golden.shape != fresh.shape:
        return (f"{where}: golden {golden.dtype}{list(golden.shape)} vs regenerated "
                f"{fresh.dtype}{list(fresh.shape)}")
    view = _VIEW[golden.dtype.itemsize]
    g = np.ascontiguousarray(golden).view(view).reshape(-1)
    f = np.ascontiguousarray(fresh).view(view).reshape(-1)
    bad = np.flatnonzero(g != f)
    if bad.size == 0:
        return None
    i = int(bad[0])
    digits = 2 * golden.dtype.itemsize
    x = int(g[i]) ^ int(f[i])
    idx = tuple(int(v) for v in np.unravel_index(i, golden.shape)) if golden.ndim else ()
    return (f"{where}: first difference at index {list(idx)} (flat {i}): golden 0x{int(g[i]):0{digits}X}, "
            f"regenerated 0x{int(f[i]):0{digits}X}, xor 0x{x:0{digits}X} ({bin(x).count('1')} bit(s)); "
            f"{bad.size} of {g.size} element(s) differ")


def _diff_entries(file: str, golden: list, fresh: list) -> list[str]:
    """Component vectors: entries matched by id, every key compared; hex lists element by element."""
    out = []
    g_by = {e.get("id"): e for e in golden}
    f_by = {e.get("id"): e for e in fresh}
    for i in f_by.keys() - g_by.keys():
        out.append(f"{i}: missing from golden {file}")
    for i in g_by.keys() - f_by.keys():
        out.append(f"{i}: in golden {file} but not regenerated")
    for i in f_by.keys() & g_by.keys():
        g, f = g_by[i], f_by[i]
        for k in sorted(set(g) | set(f)):
            gv, fv = g.get(k), f.get(k)
            if gv == fv:
                continue
            if (isinstance(gv, list) and isinstance(fv, list) and len(gv) == len(fv)
                    and all(isinstance(v, str) and v.startswith("0x") for v in gv + fv)):
                j = next(j for j in range(len(gv)) if gv[j] != fv[j])
                x = int(gv[j], 16) ^ int(fv[j], 16)
                out.append(f"{i} {k}: first difference at index {j}: golden {gv[j]}, regenerated {fv[j]}, "
                           f"xor 0x{x:X} ({bin(x).count('1')} bit(s))")
            else:
                out.append(f"{i} {k}: golden {gv!r} vs regenerated {fv!r}")
    return out


def compare(root, cases: list[GoldenCase], files: dict[str, bytes]) -> list[str]:
    """Problems found comparing golden/ at `root` with freshly generated cases and file bytes."""
    root = _root(root)
    problems: list[str] = []
    try:
        man = load_manifest(root)
    except (OSError, tomllib.TOMLDecodeError) as e:
        return [f"manifest.toml: cannot read ({e})"]
    fresh_man = tomllib.loads(files["manifest.toml"].decode())
    for k in ("spec_version", "generator_version"):
        if man.get(k) != fresh_man[k]:
            problems.append(f"manifest.toml {k}: golden {man.get(k)!r} vs regenerated {fresh_man[k]!r}")
    # files and their sha256
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    for f in sorted(set(files) - on_disk):
        problems.append(f"{f}: missing from {root}")
    for f in sorted(on_disk - set(files)):
        problems.append(f"{f}: not produced by the generator (stale file?)")
    for f, meta in sorted(man.get("files", {}).items()):
        p = root / f
        if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() != meta.get("sha256"):
            problems.append(f"{f}: sha256 does not match the manifest")
    # case metadata
    g_entries = {e["id"]: e for e in man.get("case", [])}
    f_entries = {e["id"]: e for e in fresh_man.get("case", [])}
    for i in f_entries.keys() - g_entries.keys():
        problems.append(f"{i}: missing from the golden manifest")
    for i in g_entries.keys() - f_entries.keys():
        problems.append(f"{i}: in the golden manifest but not regenerated")
    for i in sorted(f_entries.keys() & g_entries.keys()):
        for k in sorted(set(f_entries[i]) | set(g_entries[i])):
            if f_entries[i].get(k) != g_entries[i].get(k):
                problems.append(f"{i} {k}: golden {g_entries[i].get(k)!r} vs regenerated {f_entries[i].get(k)!r}")
    # case data, field by field
    disk_arrays: dict[str, dict] = {}
    for c in cases:
        if c.file not in disk_arrays:
            try:
                disk_arrays[c.file] = _file_arrays(root / c.file)
            except Exception as e:  # noqa: BLE001 - a damaged file is a finding, not a crash
                disk_arrays[c.file] = {}
                problems.append(f"{c.file}: cannot read ({type(e).__name__}: {e})")
                continue
        got = disk_arrays[c.file].get(c.id)
        if got is None:
            if disk_arrays[c.file] or (root / c.file).is_file():
                problems.append(f"{c.id}: no data in {c.file}")
            continue
        want = _case_arrays(c)
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                problems.append(f"{c.id} {k}: field {'missing from golden' if k not in got else 'not regenerated'}")
                continue
            msg = diff_arrays(f"{c.id} {k}", got[k], want[k])
            if msg:
                problems.append(msg)
    # component vectors
    for name in COMPONENT_FILES:
        rel = f"cases/{name}.toml"
        try:
            g = tomllib.loads((root / rel).read_bytes().decode())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            problems.append(f"{rel}: cannot read ({type(e).__name__}: {e})")
            continue
        fr = tomllib.loads(files[rel].decode())
        for section in sorted(set(g) | set(fr)):
            problems += _diff_entries(rel, g.get(section, []), fr.get(section, []))
    # anything else (formatting, comments): byte comparison, reported only if nothing finer was found
    if not problems:
        for f, data in files.items():
            p = root / f
            if p.is_file() and p.read_bytes() != data:
                problems.append(f"{f}: bytes differ from the regenerated file (formatting or order)")
    return problems


def check(root=None, methods=None) -> list[str]:
    cases, _comps, files = build(methods)
    return compare(root, cases, files)


def regen(root=None, methods=None) -> dict[str, bytes]:
    root = _root(root)
    _cases, _comps, files = build(methods)
    for f in on_disk_files(root) - set(files):
        (root / f).unlink()
    for f, data in files.items():
        p = root / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


def on_disk_files(root) -> set[str]:
    root = _root(root)
    if not root.is_dir():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------------------------------
# Offline helper: the search that picked TIE_INPUTS (not run by regen/check)

def find_tie_inputs(table: str, dtype: str, limit: int = 8) -> list[tuple[float, float]]:
    """Pairs (p, q) of `dtype` values with u of x = (p, q, 0, ...) at d = 16 on the tie target of `table`.
    Exhaustive over p in [1, 2) and |q| in [2^-6, 2) for float16/bfloat16, sampled for float32."""
    _vals, pred = _tie_targets(table)
    if dtype == "float16":
        allv = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    elif dtype == "bfloat16":
        allv = bf16_to_f32(np.arange(0, 0x7F80, dtype=np.uint16))
    else:
        rng = InputRng(f"ties-{table}")
        allv = (rng.ints(1 << 15, 1 << 22, 1 << 25).astype(np.float64) * 2.0 ** -24).astype(np.float32)
    ps = allv[(allv >= 1) & (allv < 2)]
    qs = allv[(allv >= 2.0 ** -6) & (allv < 2)]
    qs = np.concatenate([qs, -qs])
    s, one = np.float32(0.25), np.float32(1)
    hits = []
    for p in ps:
        n = np.sqrt(p * p + qs * qs)
        r = one / n
        for v in (np.abs(p + qs), np.abs(p - qs)):
            u = (v * s) * r
            for q in qs[pred(u) | pred(-u)]:
                hits.append((float(p), float(q)))
        if len(hits) >= limit:
            break
    return hits[:limit]


# ----------------------------------------------------------------------------------------------------
# CLI

def add_arguments(p) -> None:
    p.add_argument("action", choices=["regen", "check", "list"])
    p.add_argument("--golden-dir", default=None, help="golden/ directory (default: the repository's)")
    p.add_argument("--method", action="append", default=None, help="restrict to a method (list only)")


def run(args) -> int:
    root = _root(args.golden_dir)
    t0 = time.perf_counter()
    if args.action == "list":
        for c in iter_cases(root, methods=args.method):
            print(f"{c.id:60s} {c.kind:7s} {','.join(c.flags):28s} {c.comment}")
        return 0
    if args.action == "regen":
        files = regen(root)
        total = sum(len(v) for v in files.values())
        print(f"wrote {len(files)} files ({total / 1e6:.2f} MB) to {root} in {time.perf_counter() - t0:.1f} s")
        return 0
    problems = check(root)
    n = len(load_manifest(root).get("case", [])) if (root / "manifest.toml").is_file() else 0
    if problems:
        for line in problems[:200]:
            print(f"FAIL {line}")
        if len(problems) > 200:
            print(f"... and {len(problems) - 200} more")
        print(f"golden check: {len(problems)} problem(s) in {root}")
        return 1
    print(f"ok: {n} cases and all component vectors in {root} match the reference bit for bit "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0
