"""Golden case tables of spec 1.0 (what is generated; expected values come from tools/golden/generate.py):
the random grid from spec/formats.toml, windows and streams, hand-picked edge cases (tie inputs: ties.py)."""
from __future__ import annotations

import dataclasses

import numpy as np

from ... import spec
from ...conformance.golden_format import ExpectedError

from .inputs import PROFILES, InputRng, cast_input, random_input
from .ties import TIE_INPUTS, _tie_x

METHOD_ORDER = spec.METHODS   # the order of the manifest's cases
DT_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
# Head dims of spec 1.0 (powers of two): the 1.0 component files cover exactly these, byte for byte.
V1_HEAD_DIMS = (16, 32, 64, 128, 256, 512, 1024)


class GenerationError(RuntimeError):
    pass


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
    record: dict | None = None     # kind "decode_error": the faulty record decode must reject


def _short(dtype: str) -> str:
    return DT_SHORT.get(dtype, dtype)

# ----------------------------------------------------------------------------------------------------
# The case list. Grid of random cases from spec/formats.toml; hand-picked edge cases below.

CORE_DIMS = (16, 64, 128, 256)       # the full method x bits x dtype product runs over these
EXTRA_DIMS = (32, 512, 1024)         # one case per method at its default bits
DTYPES = ("float16", "bfloat16", "float32")


def available_methods() -> tuple[str, ...]:
    """Every method of the spec (the reference implements them all; a missing module is an ImportError)."""
    from ... import reference
    return tuple(m for m in METHOD_ORDER if m in reference.METHODS)


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

    _zero_and_subnormal_cases(b, d0, kivi, P, add, rows)
    _extreme_cases(b, d0, kivi, affine, norm_method, P, add, rows)
    _error_cases(method, info, b, d0, T, kivi, P, add, rows)
    _key_and_tie_cases(method, b, d0, kivi, affine, P, add)
    return out


def _zero_and_subnormal_cases(b, d0, kivi, P, add, rows) -> None:
    """Zero vectors and negative zero; subnormals of each dtype."""
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


def _extreme_cases(b, d0, kivi, affine, norm_method, P, add, rows) -> None:
    """float16 extremes (the largest finite values) and what each method's scale does with them."""
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


def _error_cases(method, info, b, d0, T, kivi, P, add, rows) -> None:
    """NaN / Inf, bad shapes and parameters: each rejected naming its argument."""
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


def _key_and_tie_cases(method, b, d0, kivi, affine, P, add) -> None:
    """Extreme stream-key parameters (uint64 seed, uint32 layer and head offset at their maxima); ties."""
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


def _reference_reload(stream):
    import copy
    from ...reference import stream as _reference_stream
    from ... import reference
    return reference.stream.Stream.from_state(copy.deepcopy(stream.state()))
