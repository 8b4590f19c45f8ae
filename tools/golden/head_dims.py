"""Golden cases at the head dims d = m·2^k that are not powers of two (spec/formats.toml `head_dims`,
spec/rotation.md's split of d), in files of their own so every earlier file keeps its bytes:

- `bulk/<method>-headdims.npz`: every method at these head dims: every bits setting and dtype at d = 80, 96,
  192 (mlx_affine: 96, 160, 192, the ones its group sizes divide), every other new head dim once, and a
  window and a stream case;
- `cases/headdims.toml`: the component vectors (signs, Hadamard, RHT, fold, tables) at the new head dims.
"""
from __future__ import annotations

import numpy as np

from ... import spec
from ...conformance.golden_format import hexarr as _hexarr, hx as _hx
from .cases import V1_HEAD_DIMS, CaseDef, _short, _stream_params, _variants
from .inputs import PROFILES, InputRng, random_input

NEW_HEAD_DIMS = tuple(d for d in spec.HEAD_DIMS if d not in V1_HEAD_DIMS)
MAIN_DIMS = (80, 96, 192)             # Phi-2 / Pythia, Phi-3 / GPT-NeoX, DeepSeek-V2 MLA keys
AFFINE_DIMS = (96, 160, 192)          # mlx_affine: G in (32, 64, 128) must divide d; none divides 80
DTYPES = ("float16", "bfloat16", "float32")


def _divisors(method: str, d: int) -> list[int]:
    return [g for g in spec.method_info(method)["group_sizes"] if d % g == 0]


# ----------------------------------------------------------------------------------------------------
# Head-dim cases

def _hd_shape(method: str, d: int, k: int) -> tuple[tuple, dict]:
    """(shape, extra params): kivi alternates roles (values only where some G divides d), whole groups;
    mlx_affine cycles over the group sizes that divide d; the rotation methods a few tokens."""
    if method == "kivi":
        gv = _divisors("kivi", d)
        if gv and k % 2 == 0:
            g = gv[(k // 2) % len(gv)] if d <= 192 else 16
            return (1, 2 if d <= 192 else 1, g + 3, d), {"role": "v", "group_size": g}
        g = (16, 32, 64, 128)[k % 4] if d <= 192 else 16     # keep big-d cases small (golden/ < 20 MB)
        return (1, 1, g + 3, d), {"role": "k", "group_size": g}
    if method == "mlx_affine":
        ga = _divisors("mlx_affine", d)
        return ((2, 2, 3, d) if d <= 192 else (1, 1, 2, d)), {"group_size": ga[k % len(ga)]}
    if d <= 128:
        return (2, 2, 3, d), {}
    return ((1, 2, 2, d) if d <= 256 else (1, 1, 2, d)), {}


def _hd_case(method, label, vparams, d, dtype, k) -> CaseDef:
    shape, extra = _hd_shape(method, d, k)
    cid = f"{method}-{label}-d{d}-{_short(dtype)}-headdim-{k:03d}"
    rng = InputRng(cid + "/params")
    params = spec.Params(method=method, window=0, **vparams, **{**_stream_params(rng, extra.get("role")),
                                                                **extra}).resolved()
    profile = PROFILES[k % len(PROFILES)]
    if method == "kivi" and dtype == "float16" and profile == "large":
        profile = "normal"   # as in the 1.0 grid: fp16 scale overflow stays in the edge cases
    m, n = spec.split_head_dim(d)
    g = f", G={params.group_size} divides d" if method == "mlx_affine" or params.role == "v" and params.group_size \
        else (f", G={params.group_size} (keys: any d)" if params.group_size else "")
    return CaseDef(cid, "encode", method, params, dtype, random_input(cid, shape, dtype, profile),
                   ("random", "head-dim"),
                   f"head dim d = {m}*{n} (spec 1.1: rotation.md two-stage H, number-model.md block fold): "
                   f"random {profile} input, {label}{g}, role {params.role}, shape {shape}",
                   f"bulk/{method}-headdims.npz")


def head_dim_cases(method: str) -> list[CaseDef]:
    out, seen = [], set()
    dims = AFFINE_DIMS if method == "mlx_affine" else MAIN_DIMS
    info = spec.method_info(method)

    def add(label, vparams, d, dtype, k):
        if (label, d, dtype) not in seen:
            seen.add((label, d, dtype))
            out.append(_hd_case(method, label, vparams, d, dtype, k))
    variants = _variants(method)
    for vi, (label, vparams, full) in enumerate(variants):
        for ti, dtype in enumerate(DTYPES):
            if full or ti == vi % 3:            # rvq cross combinations: one dtype each
                add(label, vparams, dims[(vi + ti) % 3], dtype, len(out))
    dv = next(v for v in variants if v[1]["bits"] == info["default_bits"] and v[2])
    for d in dims:                               # default bits: every (d, dtype)
        for dtype in DTYPES:
            add(dv[0], dv[1], d, dtype, len(out))
    for i, d in enumerate(NEW_HEAD_DIMS):        # every other new head dim once
        if d in dims or (method == "mlx_affine" and not _divisors(method, d)):
            continue
        add(dv[0], dv[1], d, DTYPES[i % 3], len(out))
    return out + _hd_window_and_stream(method)


def _hd_window_and_stream(method: str) -> list[CaseDef]:
    """A window encode and a chunked stream with trims at a new head dim."""
    info = spec.method_info(method)
    b = info["default_bits"]
    kivi, affine = method == "kivi", method == "mlx_affine"
    d = 96 if affine else 80
    file = f"bulk/{method}-headdims.npz"
    g = 16 if kivi else (32 if affine else None)
    out = []
    cid = f"{method}-b{b}-d{d}-bf16-headdim-window-000"
    rng = InputRng(cid + "/params")
    shape, r = ((1, 2, 40, d), 5) if kivi else ((1, 2, 6, d), 2)
    p = spec.Params(method=method, bits=b, window=r, group_size=g, **_stream_params(rng, "v")).resolved()
    out.append(CaseDef(cid, "encode", method, p, "bfloat16", random_input(cid, shape, "bfloat16", "normal"),
                       ("window", "random", "head-dim"),
                       f"head dim {d}, window R={r}, T={shape[2]}: Q={p.encoded_tokens(shape[2])} encoded", file))
    cid = f"{method}-b{b}-d{d}-f16-headdim-trim-000"
    rng = InputRng(cid + "/params")
    p = spec.Params(method=method, bits=b, window=3, group_size=g, **_stream_params(rng, "k")).resolved()
    ops = ((("append", 20), ("append", 1), ("append", 13), ("trim", 7), ("append", 16), ("trim", 20),
            ("append", 5)) if kivi else
           (("append", 4), ("append", 1), ("append", 3), ("trim", 1), ("trim", 5), ("append", 2), ("append", 1)))
    n_in = sum(n for op, n in ops if op == "append")
    desc = " ".join(f"{op[0]}{n}" for op, n in ops)
    out.append(CaseDef(cid, "stream", method, p, "float16", random_input(cid, (1, 2, n_in, d), "float16", "normal"),
                       ("chunked", "trim", "window", "head-dim"),
                       f"head dim {d}, stream R=3: {desc} (a=append, t=trim)", file, ops=ops))
    return out


def case_defs(method: str) -> list[CaseDef]:
    return head_dim_cases(method)


# ----------------------------------------------------------------------------------------------------
# Component vectors at the new head dims (cases/headdims.toml)

def component_vectors() -> dict[str, list]:
    from ...reference import codebooks as rcb, numerics as rnum, prng as rpr, rotation as rrot
    out: dict = {"signs": [], "hadamard": [], "rht": [], "fold": [], "table": []}
    for i, d in enumerate(NEW_HEAD_DIMS):
        seed, layer, head, role, purpose = 2026, 3, d % 7, i % 2, (i // 2) % 2
        sig = rpr.sign_vector(seed, layer, head, role, purpose, d)
        out["signs"].append({"id": f"headdims-signs-d{d}", "comment": "sign vector: '-' where the bit is 1",
                             "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role,
                             "purpose": purpose, "d": d, "signs": "".join("-" if v < 0 else "+" for v in sig)})
    for d in NEW_HEAD_DIMS:
        m, n = spec.split_head_dim(d)
        x = InputRng(f"hadamard-{d}").normalish((d,)).astype(np.float32)
        out["hadamard"].append({"id": f"headdims-hadamard-d{d}", "comment": f"H and Hᵀ (m = {m}, n = {n}), no "
                                "signs, no scale", "d": d, "x": _hexarr(x, "float32"),
                                "h": _hexarr(rrot.hadamard(x), "float32"),
                                "ht": _hexarr(rrot.hadamard(x, transpose=True), "float32")})
    for d in (20, 28):   # signed zeros: for output 0 every term H_m[0][k]·x_k is -0; stage B starts at +0
        x = np.where(spec.hadamard_matrix(d)[0] > 0, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
        out["hadamard"].append({"id": f"headdims-hadamard-d{d}-signed-zero", "comment": "output 0 of H: all "
                                "terms -0, the sum starts from +0 so it is +0", "d": d, "x": _hexarr(x, "float32"),
                                "h": _hexarr(rrot.hadamard(x), "float32"),
                                "ht": _hexarr(rrot.hadamard(x, transpose=True), "float32")})
    for i, d in enumerate(NEW_HEAD_DIMS):
        seed, layer, head, role, purpose = 7, 1, d % 5, 0, i % 2
        sig = rpr.sign_vector(seed, layer, head, role, purpose, d)
        x = InputRng(f"rht-{d}").normalish((d,)).astype(np.float32)
        y = rrot.rht(x, sig)
        out["rht"].append({"id": f"headdims-rht-d{d}", "comment": "y = RHT(x); x_back = RHT_inverse(y) (Hᵀ)",
                           "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role, "purpose": purpose,
                           "d": d, "x": _hexarr(x, "float32"), "y": _hexarr(y, "float32"),
                           "x_back": _hexarr(rrot.rht_inverse(y, sig), "float32")})
    for d in NEW_HEAD_DIMS:
        rng = InputRng(f"fold-{d}")
        v = (rng.normalish((d,)) * 2.0 ** rng.ints(d, -20, 20)).astype(np.float32)
        out["fold"].append({"id": f"headdims-fold-d{d}", "comment": "block fold, then halving fold "
                            "(number-model.md)", "d": d, "v": _hexarr(v, "float32"),
                            "sum": _hexarr(np.asarray(rnum.fold(v)).reshape(1), "float32")[0]})
    for d in NEW_HEAD_DIMS:
        for b in (1, 2, 3, 4):
            c, bb = rcb.gaussian(b, d)
            out["table"].append({"id": f"headdims-gaussian{b}-d{d}", "comment": "C_d, B_d = table x s_d",
                                 "kind": "gaussian", "bits": b, "d": d,
                                 "centroids": _hexarr(c, "float32"), "boundaries": _hexarr(bb, "float32")})
        for b in (1, 2, 3, 4):
            for b2 in (1, 2, 3, 4):
                c, bb = rcb.residual(b, b2, d)
                out["table"].append({"id": f"headdims-residual{b}.{b2}-d{d}", "comment": "C_d, B_d = table x s_d",
                                     "kind": "residual", "bits": b, "bits2": b2, "d": d,
                                     "centroids": _hexarr(c, "float32"), "boundaries": _hexarr(bb, "float32")})
    return out
