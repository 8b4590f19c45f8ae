"""One launch per decode step for a layer's append: the keys' and the values' new tokens encoded by the encode
body of source.py (bit for bit the same fields) and stored in place in the streams' buffers, with the
chunk's deferred checks (spec/streaming.md 'Deferred rejection') in the same launch.

It replaces, where it applies, two encode launches plus accelerated.kernels.commit's store (three launches,
two temporary field arrays and a dozen array views per layer and step): the encode body runs twice in one
kernel (csrc/append_apart.h or append_serial.h), each time in its own scope (csrc/encode_scope.h) with its stream's
inputs behind the body's names, `VQ_OROW` mapping its
output rows to rows of the buffers (row base + i of head bh) and its fault slots to its own half of the
token. Applies to per-token records, and to KIVI (applies), where the buffers have room for the
chunk; the caller uses the general path otherwise. With an exact window (R > 0, both roles: WINDOWED) the stream keeps its window in a buffer
(accelerated.stream, Stream._window_buffer) and a chunk of t tokens moves it by t rows: the launch encodes the
window's t oldest tokens (input kf / vf, the rows just before the new window) into the records and copies the chunk,
checked, into the new window's last t rows (input kw / vw, the window after this step). KIVI's window moves by a
group: a step's launch encodes none of its tokens, or, once it holds R + G, its oldest G (keys: a row of per-channel
scale and zero, G rows of codes; values: G rows), which the constants' meta Q says (constants(..., nq)); with R = 0
(a window of up to G - 1 tokens) the group's last token is the chunk's own, read from the chunk (meta[7], `own`).

The token, (2 roles, threadgroups, 2) bool: [role][group][0] NaN/Inf in the chunk, [role][group][1] the
method's rule (source.py's fault slots). As with commit.py, readers of the rows take it as an input (the
attention kernels) or wait for it (accelerated.stream.Stream.sync); the launch takes the previous token, so
stores to one buffer run in order.
"""
from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from ... import spec
from .. import layouts, tuning
from . import backend, loader, source
from . import methods as km

OUTPUTS = ["flags"]
_MAX_ROWS = 2 ** 31 - 1
# A role's constants in one uint32 array (MLX's CUDA launch costs about 1 us per input, measured on the H200):
# sigma's words, tau's words (H * ceil(D / 32) each), then the tables C1, B1, C2, B2 (TABLE entries reserved
# each, float bits), f_k (8 floats) and meta (8 int32): source.py's inputs of the same names, by offset.
TABLE = 256


def _fields(method: str) -> tuple[str, ...]:
    """The outputs of source.py's encode body that a method writes (the others are aliased, never written)."""
    return tuple(n for n, f in zip(("codes1", "codes2", "f_s1", "f_s2"), km.FIELDS[method]) if f)


def _roles(win) -> tuple[bool, bool]:
    """(keys windowed, values windowed) of a launch's `win`: a bool for both roles, or a pair (MIXED: roles whose
    encoded counts differ, each with its own window or none)."""
    return (bool(win[0]), bool(win[1])) if isinstance(win, tuple) else (bool(win), bool(win))


def inputs(mk: str, mv: str, win=False, ragged: bool = False, whole: bool = False) -> list[str]:
    """The arrays one launch passes, in order, for key method mk and value method mv; `win`: both roles with an
    exact window (then each role's tokens leaving it and the window after the step, last), or (keys', values')
    for roles whose encoded counts differ (MIXED: the windowed roles' pairs, then the values' first row `vbase`);
    `ragged`: KIVI rows of their own group phase (cache/ragged.py: `rphase`, (B,) int32, last; RAGGED_ENCODES);
    `whole`: each windowed role's buffer whole and one `wrow` for both (csrc/window_bind.h) instead of the pairs."""
    kw, vw = _roles(win)
    wins = ((["kwb"] if kw else []) + (["vwb"] if vw else []) + ["wrow"]) if whole else \
        (["kf", "kw"] if kw else []) + (["vf", "vw"] if vw else [])
    return (["base", "after"] + [f"k{n}" for n in ("x", "const", *_fields(mk))]
            + [f"v{n}" for n in ("x", "const", *_fields(mv))] + wins + (["vbase"] if isinstance(win, tuple) else [])
            + (["rphase"] if ragged else []))


def scope(role: str, index: int, *, m: str, codes: tuple, ts: str, x: str, const: str, out: dict, fault: str,
          cap: str, base: str, shared: str = "", window: tuple | None = None, gcap: str | None = None,
          role_window: bool | None = None) -> str:
    """The parameters of csrc/encode_scope.h for role `role` ("K" | "V"), as #define lines: the encode body for one
    role in its own scope. `m`, `codes` (B1, B2, GS) and `ts` its method id, code constants and side dtype (template
    names or literals), `x` and `const` its inputs, `out` the arrays behind the body's outputs (codes1, codes2, f_s1,
    f_s2), `fault` the bool array whose slots [index][GROUP] it sets, `cap` the rows of the buffers, `base` the first
    row of the chunk (VQ_OROW) and `shared` the prefix of the threadgroup arrays the kernel declares for it
    (csrc/encode_shared.h); `window` = (chunk, window, type): a scope with an exact window (WINDOWED; `x` is then the
    window's oldest tokens, which it encodes); `gcap` the rows of the group fields (KIVI keys' scale and zero: one row
    per group of G tokens; default `cap`); `role_window`: in a kernel whose roles differ in having a window (MIXED), this
    scope's (its WIN: which check files apply, csrc/check_count_role.h). Also the attention partial's
    (accelerated.kernels.attention_source APPEND)."""
    if role not in ("K", "V"):
        raise ValueError(f"role: {role!r} is not 'K' or 'V'")
    b1, b2, gs = codes
    params = {"INDEX": index, "M": m, "B1": b1, "B2": b2, "GS": gs, "TS": ts, "X": x, "X_SHAPE": f"{x}_shape",
              "X_STRIDES": f"{x}_strides", "CONST": const, "CODES1": out["codes1"], "CODES2": out["codes2"],
              "S1": out["f_s1"], "S2": out["f_s2"], "FAULT": fault, "CAP": cap, "GCAP": gcap or cap, "BASE": base,
              "TG": shared}
    if window is not None:
        wx, w, xt = window
        params.update({"WX": wx, "WX_SHAPE": f"{wx}_shape", "WX_STRIDES": f"{wx}_strides", "W": w,
                       "W_SHAPE": f"{w}_shape", "W_STRIDES": f"{w}_strides", "XT": xt})
    if role_window is not None:
        params["WIN"] = int(role_window)
    return loader.defines({f"VQ_{role}_{k}": v for k, v in params.items()})


# the encode body in a scope points at threadgroup arrays the kernel declares (csrc/encode.h's VQ_ENCODE_ARRAYS)
SCOPED = {"VQ_ENCODE_ARRAYS": "encode_arrays_scoped.h", **source.CHECKS}
# ... in a kernel whose roles have an exact window: each scope's chunk is checked and copied into the window, and the
# tokens it encodes are the window's oldest (scope(..., window=...))
WINDOWED = {**SCOPED, "VQ_CHECK_COUNT": "check_count_window.h", "VQ_CHECK_ROW": "check_row_window.h"}
# ... in a kernel where one role has an exact window and the other none (MIXED): each scope picks by its WIN
MIXED = {**SCOPED, "VQ_CHECK_COUNT": "check_count_role.h", "VQ_CHECK_ROW": "check_row_role.h"}


def scope_constants() -> str:
    """The offsets of `constants`' layout (see TABLE) that csrc/encode_scope.h reads, with the Hadamard rows of the
    encode body: the lines a kernel with encode scopes needs once."""
    offsets = {"B1": TABLE, "C2": 2 * TABLE, "B2": 3 * TABLE, "K": 4 * TABLE, "META": 4 * TABLE + 8}
    return loader.hadamard() + loader.defines({f"VQ_CONST_{k}": v for k, v in offsets.items()})


def _scope(role: str, index: int, method: str, win: bool = False, mixed: bool = False) -> str:
    """The encode scope's parameters for one role: its inputs under the body's names, its rows in the buffers;
    `win`: the role's exact window (it encodes kf, the tokens leaving the window, and copies kx into kw); `mixed`: the
    roles' counts differ (MIXED: the values' first row is input vbase, and the scope says whether it has a window)."""
    r = role
    have = _fields(method)
    out = {n: f"{r}{n}" if n in have else f"{r}{'codes1' if n.startswith('codes') else 'f_s1'}"
           for n in ("codes1", "codes2", "f_s1", "f_s2")}
    R = r.upper()
    return scope(R, index, m=f"{R}M", codes=(f"{R}B1", f"{R}B2", f"{R}GS"), ts=f"{R}TS", x=f"{r}f" if win else f"{r}x",
                 const=f"{r}const", out=out, fault="flags", cap=f"(int){r}codes1_shape[2]",
                 base="vbase[0]" if mixed and role == "v" else "base[0]",
                 window=(f"{r}x", f"{r}w", f"{R}XT") if win else None,
                 gcap=f"(int){r}f_s1_shape[2]" if method == "kivi" and role == "k" else None,
                 role_window=win if mixed else None)


# A ragged launch's encode rows (cache/ragged.py; csrc/encode.h): row b encodes the group at the scope's first row
# vq_base (x: the same for every flushing row) where x - its phase is a non-negative multiple of the group size (its
# boundary moves from x to x + G at this step); the other rows only copy the chunk into their window. Only a KIVI
# scope (M 4) flushes groups of gs tokens: a per-token scope beside KIVI values (the mixed plans' keys) encodes its
# row wherever x reaches the phase, since its gs is a group of coordinates (mlx_affine's) or 1, never of tokens.
RAGGED_ENCODES = ("#define VQ_ROW_ENCODES(b) (vq_base >= (int)rphase[b] && (M != 4 || (vq_base - (int)rphase[b]) % gs "
                  "== 0))\n")


def window_bind(kw: bool, vw: bool, kf: bool, vf: bool, kcount: str, vcount: str) -> str:
    """csrc/window_bind.h with its parameters: the roles' window names bound to rows of their whole buffers."""
    return loader.defines({"VQ_WB_K": int(kw), "VQ_WB_V": int(vw), "VQ_WB_KF": int(kf), "VQ_WB_VF": int(vf),
                           "VQ_WB_KCOUNT": kcount, "VQ_WB_VCOUNT": vcount}) + loader.text("window_bind.h")


def body(mk: str = "turboquant", mv: str = "turboquant", apart: bool = False, win=False, ragged: bool = False,
         whole: bool = False) -> str:
    """The kernel text after a prelude: both roles in two halves of the grid (csrc/append_apart.h), or with `apart`
    False one after the other in each threadgroup (append_serial.h); `after` only orders this launch after the last
    store; `win`: both roles with an exact window (WINDOWED), or (keys', values') for roles whose encoded counts
    differ (MIXED); `ragged`: each row flushes its KIVI group at its own step (RAGGED_ENCODES; base = x); `whole`:
    the windows from whole buffers (window_bind)."""
    kw, vw = _roles(win)
    mixed = isinstance(win, tuple)
    files = MIXED if mixed else WINDOWED if kw else SCOPED
    bind = window_bind(kw, vw, kw, vw, "base[0]", "vbase[0]" if mixed else "base[0]") if whole else ""
    return (bind + scope_constants() + _scope("k", 0, mk, kw, mixed) + _scope("v", 1, mv, vw, mixed)
            + (RAGGED_ENCODES if ragged else "") + loader.text("append_apart.h" if apart else "append_serial.h", files))


def assemble(be: str, mk: str = "turboquant", mv: str = "turboquant", apart: bool = False,
             win=False, ragged: bool = False, whole: bool = False) -> tuple[str, str]:
    header, prelude = source.PRELUDES[be]
    # append_apart.h gives GROUP and NGROUPS the role's meaning; put the prelude's back after it, so that text after it
    # (another kernel in one file, as the compile checks write them) sees the prelude's
    again = loader.text("regroup.h") + loader.backend_file(f"{be}_grid", be) if apart else ""
    return header, prelude + loader.backend_file(f"{be}_scope", be) + body(mk, mv, apart, win, ragged, whole) + again


@functools.lru_cache(maxsize=None)
def _kernel(mk: str, mv: str, apart: bool = False, win=False, ragged: bool = False, whole: bool = False):
    be = backend.backend()
    if be is None:
        raise RuntimeError(backend.available()[1])
    header, text = assemble(be, mk, mv, apart, win, ragged, whole)
    kw, vw = _roles(win)
    name = f"vq_append_{mk}_{mv}" + ("_apart" if apart else "") + (f"_m{int(kw)}{int(vw)}" if isinstance(win, tuple)
                                                                  else "_w" if kw else "") + ("_g" if ragged else "") + ("_b" if whole else "")
    ins = inputs(mk, mv, win, ragged, whole)
    if be == "cuda":
        return backend.cuda_kernel(name=name, input_names=ins, output_names=OUTPUTS, source=text,
                                   header=header, ensure_row_contiguous=False)
    return mx.fast.metal_kernel(name=name, input_names=ins, output_names=OUTPUTS, source=text,
                                header=header, ensure_row_contiguous=False, compile_options={"math_mode": "safe"})


def applies(p: spec.Params) -> bool:
    """Whether a role's stream can take this launch: per-token rows (an exact window moves by the chunk: WINDOWED),
    or KIVI: its window holds R .. R + G - 1 tokens, so a launch copies the chunk into the window and encodes no
    token, or a group of G, the window's oldest (flushed: in_place.InPlace); with R = 0 a group's last token is the
    chunk's own (`own`: read from the chunk)."""
    return True


def role_window(p: spec.Params) -> bool:
    """Whether a role's stream keeps an exact window that a launch moves: R > 0, or KIVI (with R = 0 too: up to
    G - 1 tokens)."""
    return p.window > 0 or p.method == "kivi"


def windowed(kp: spec.Params, vp: spec.Params):
    """What a launch for these roles moves: True (both roles' exact windows), False (neither), or (keys', values')
    where their encoded counts differ (MIXED: different methods or windows in one layer; `mixed`)."""
    kw, vw = role_window(kp), role_window(vp)
    return (kw, vw) if mixed(kp, vp) else kw


def mixed(kp: spec.Params, vp: spec.Params) -> bool:
    """Whether the roles' encoded counts can differ after a step (different windows, or one role KIVI, whose window
    moves by groups, or KIVI groups of different sizes): the attention partial then takes a count per role
    (accelerated.kernels.attention_source MIXED)."""
    kk, vk = kp.method == "kivi", vp.method == "kivi"
    return kp.window != vp.window or kk != vk or (kk and kp.group_size != vp.group_size)


@functools.lru_cache(maxsize=4096)
def constants(p: spec.Params, h: int, t: int, d: int, nq: int | None = None, own: int = 0) -> mx.array:
    """One role's constant array (see TABLE): source.py's sig, tau, f_c1, f_b1, f_c2, f_b2, f_k and meta for a
    chunk of t tokens, all encoded, or with `nq` the nq tokens a windowed launch encodes (KIVI: 0 or a group of G;
    meta's Q), the last `own` of them the chunk's own (KIVI with R = 0 at a flush; meta[7]); cached per parameters
    and shape."""
    bits1, bits2 = km._code_bits(p)
    sig, tau = km._signs(p, h, d)
    sw = h * ((d + 31) // 32)
    c = np.zeros(2 * sw + 4 * TABLE + 16, np.uint32)
    for i, a in enumerate((sig, tau)):
        a = np.array(a, np.uint32).reshape(-1)
        if a.size == sw:
            c[i * sw:(i + 1) * sw] = a
    levels = layouts.of(p).levels(p)
    for i, tab in enumerate((*km._tables(p, d), km._consts(d, levels))):
        t32 = np.array(tab, np.float32).reshape(-1)
        c[2 * sw + i * TABLE: 2 * sw + i * TABLE + t32.size] = t32.view(np.uint32)
    nq = t if nq is None else nq
    keys = int(p.method == "kivi" and p.role == "k")       # (the scopes compile it in: encode_scope.h KR)
    meta = np.array(km._meta(bits1, bits2, p.group_size or 1, keys, nq, nq), np.int32)
    meta[7] = own
    c[2 * sw + 4 * TABLE + 8:] = meta.view(np.uint32)
    out = mx.array(c)
    mx.eval(out)
    return out


def _pair(x) -> tuple:
    """(keys', values') of a per-role argument given for both roles or as a pair."""
    return x if isinstance(x, tuple) else (x, x)


def _static(kp: spec.Params, vp: spec.Params, b: int, h: int, t: int, d: int, kdt, vdt, nq=None, own=0,
            ragged: bool = False, whole: bool = False) -> tuple:
    """Everything of a launch but the step's arrays, per parameters and shape (a decode step builds none); `nq`: the
    tokens a windowed launch encodes where they are not t (KIVI: 0, or G at a flush), `own` the chunk's among them
    (constants); each for both roles, or (keys', values') where they differ (MIXED); `ragged`: the kernel whose rows
    flush at their own phase (RAGGED_ENCODES: input rphase, last); `whole`: the windows as whole buffers (window_bind)."""
    tune = tuning.current()
    return _static_for(kp, vp, b, h, t, d, kdt, vdt, tune.specialize_rows, tune.roles_apart, nq, own, tune=tune,
                       ragged=ragged, whole=whole)


@functools.lru_cache(maxsize=1024)
def _static_for(kp: spec.Params, vp: spec.Params, b: int, h: int, t: int, d: int, kdt, vdt, specialize_rows: int,
                apart: bool = False, nq=None, own=0, tune: tuning.Tuning | None = None, ragged: bool = False,
                whole: bool = False):
    # keyed by the tuning too (specialize_rows, roles_apart: True, the keys' and values' encodes in two halves of
    # the grid side by side; False, one role after the other in every threadgroup): a run that changes a knob (a
    # benchmark's arm) gets its own plans
    grid, group, groups = km.launch_shape(b * h * t, d)
    if apart:
        grid = (2 * grid[0], *grid[1:])      # a half of the threadgroups per role (body)
    template = [("KM", source.METHOD_IDS[kp.method]), ("VM", source.METHOD_IDS[vp.method]), ("D", d),
                ("KTS", km._side_dtype(kp, kdt)), ("VTS", km._side_dtype(vp, vdt)), *code_template(kp, vp, b * h * t)]
    win = windowed(kp, vp)
    kw, vw = _roles(win)
    # the chunk's and the window's element type (the window's copy of the chunk), per windowed role
    template += [*([("KXT", kdt)] if kw else []), *([("VXT", vdt)] if vw else [])]
    fk = tuple(f for f in km.FIELDS[kp.method] if f)
    fv = tuple(f for f in km.FIELDS[vp.method] if f)
    (knq, vnq), (kown, vown) = _pair(nq), _pair(own)
    return (grid, group, [(2, groups, 2)], template, constants(kp, h, t, d, knq, kown), constants(vp, h, t, d, vnq, vown),
            fk, fv, _kernel(kp.method, vp.method, apart, win, ragged, whole))


def code_template(kp: spec.Params, vp: spec.Params, rows: int) -> list:
    """Each role's code widths and group size as template constants (KB1, KB2, KGS, VB1, ...; methods.code_template:
    0 = read meta, below tuning's specialize_rows rows)."""
    return [(f"{r}{n}", v) for r, p in (("K", kp), ("V", vp))
            for n, v in zip(("B1", "B2", "GS"), km.code_template(p, rows))]


def append(kp: spec.Params, keys: mx.array, kbufs: dict, vp: spec.Params, values: mx.array, vbufs: dict,
           base: int, after: mx.array | None, windows: tuple = (), flushed=None, own=0,
           vbase: int | None = None, rphase: mx.array | None = None) -> mx.array:
    """Encode keys and values (B, H, t, d) into rows base..base+t-1 of their streams' buffers (in place);
    returns the token. `kbufs`/`vbufs`: the streams' whole buffers by record field name. `windows`: with exact
    windows (WINDOWED), (kf, kw, vf, vw): the t tokens leaving each window (encoded instead of the chunk) and the
    window after the step (the chunk is stored into its last t rows); `flushed`: how many tokens leave each window
    where that is not t (KIVI: 0, or G; kf / vf then hold that many, or any rows when 0), `own` the chunk's tokens
    among them (KIVI with R = 0 at a flush: kf's last rows are the chunk's, read from it; kw / vw are then the chunk's
    rows, no window after). Where one role has a window and the other none (MIXED), `windows` holds that role's pair
    only, `flushed` and `own` are (keys', values') and `vbase` is the values' first row (`base` the keys'). `rphase`:
    a ragged KIVI batch's rows' group phases (cache/ragged.py; RAGGED_ENCODES): only the rows whose phase flushes at
    this step encode the group at `base`. The caller has checked shapes, dtypes and room in the buffers."""
    b, h, t, d = keys.shape
    grid, group, oshape, template, kc, vc, fk, fv, kernel = _static(kp, vp, b, h, t, d, keys.dtype, values.dtype,
                                                                    flushed, own, ragged=rphase is not None)
    ins = [km.count(base), km.order(after), keys, kc,
           *[kbufs[f] for f in fk], values, vc, *[vbufs[f] for f in fv], *windows,
           *([km.count(vbase)] if vbase is not None else []), *([rphase] if rphase is not None else [])]
    (flags,) = kernel(inputs=ins, template=template, grid=grid, threadgroup=group, output_shapes=oshape,
                      output_dtypes=[mx.bool_])
    return flags


@functools.lru_cache(maxsize=4096)
def window_rows(rows: tuple) -> mx.array:
    """A launch's `wrow` (csrc/window_bind.h), rows relative to its counts: one array per value, since a plan's values
    repeat from step to step (KIVI's cycle through its group), so a step makes none and the host never rewrites one
    the GPU reads."""
    a = mx.array(rows, dtype=mx.int32)
    mx.eval(a)
    return a


def fits(b: int, h: int, cap: int) -> bool:
    """Rows of a buffer are addressed in int32 by the body."""
    return b * h * cap <= _MAX_ROWS


def messages(token: mx.array) -> list:
    """The per-check hit lists of a token in the order of the checks' messages (keys NaN/Inf, keys' rule,
    values NaN/Inf, values' rule), read on the host (the caller knows it is evaluated)."""
    f = token.tolist()
    return [[g[kind] for g in f[role]] for role in range(2) for kind in range(2)]
