"""Decode-attention kernels over packed records (spec/attention.md): one body per kernel for CUDA and
Metal (csrc/partial.h, combine.h), written against the macros of a thin prelude (csrc/attention_<backend>_*, as
accelerated/kernels/source.py); this module composes them (accelerated/kernels/loader.py) for a launch.

Tolerance tier: plain float arithmetic (contraction allowed), exp2 of log2-scaled scores, float32
accumulation. Nothing here is bit-exact and the raw-operator lint of source.py does not apply.

Two kernels, flash-decoding style:

- `partial`: a threadgroup of NT threads per (split s, KV head h, batch x query group). Splits 0..S-1 take
  contiguous ranges of the encoded tokens, split S the exact window. The QB query rows of the group
  (GQA: query row r of KV head h is query head h*rep + r/L at position r%L) are loaded once, scaled by
  scale*log2(e) and, for the rotation family, rotated into the keys' domain (RHT with sigma, and tau for
  turboquant_prod). Lanes: P lanes share one token, each owning NCH chunks of 8 coordinates, so the query
  rows for its coordinates sit in registers and every packed word is read once by one lane. A token's
  score is the lanes' partial dot products summed by xor-shuffles; the online softmax and the value
  accumulation (in the values' rotated domain) run per lane; slots and warps are merged at the end.
  Output: per (row, split) the running max m, sum l and the weighted value sums (PARTS of them).
- `combine`: merges a query row's S encoded partials, applies the values' inverse rotation once, adds the
  window partial and writes the output row in the queries' dtype: its own launch (COMBINE_BODY, a threadgroup
  of CNT threads per query row, the splits spread over them), or on CUDA inside the partial launch (FUSED,
  accelerated.tuning's fuse_combine: the last block of each query group to finish does it, found with
  an atomic count, with COMBINE_ROWS or the tensor-core kernel's COMBINE_ROWS_STRIDED; off by default, measured
  slower).

Method ids (template MK / MV): accelerated/layouts.py KERNEL_IDS (0 turboquant, 1 turboquant_rvq, 2 rabitq,
3 turboquant_prod, 4 kivi, 5 mlx_affine). Keys of kivi (role k) are grouped per channel over KG tokens, values
(role v) per token over VG channels; mlx_affine groups per token, with its decode rounded to the input dtype.
"""
from __future__ import annotations

from .. import layouts, tuning
from . import append as kappend
from . import loader, source
from .attention_tc import ONE_STREAM, PROD3_KEYS, PROD3_VALUES, PROD_VALUES, TC_CUDA_HEADER, TWO_STREAMS

METHOD_IDS = layouts.KERNEL_IDS      # template MK / MV (one table: accelerated/layouts.py)

PARTIAL_INPUTS = ["q", "f_scale", "f_k", "nenc",
                  "kc1", "kc2", "ks0", "ks1", "kgs", "kgz", "kw", "f_ktab1", "f_ktab2", "f_ksig", "f_ktau",
                  "vc1", "vc2", "vs0", "vs1", "vgs", "vgz", "vw", "f_vtab1", "f_vtab2", "flags"]
PARTIAL_OUTPUTS = ["o_acc", "o_ml"]
FUSED_OUTPUTS = ["o_acc", "o_ml", "out"]      # the partial launch with the combine inside (FUSED)
APPEND_OUTPUTS = ["o_acc", "o_ml", "token"]   # ... with the decode step's append inside (APPEND; token: append.py's)
COMBINE_INPUTS = ["o_acc", "o_ml", "f_k", "f_vsig", "f_vtau", "q"]
COMBINE_OUTPUTS = ["out"]
COMBINE_APPEND_OUTPUTS = ["out", "summary"]   # ... with input `tok`, a chunk's token: its four checks over all groups

# The names above are the bodies'. A launch passes fewer arrays (MLX's CUDA launch costs about 1 us per input,
# measured on the H200: a kernel of 26 inputs 42.7 us, of one 18.4 us): every float constant in one array
# `f_c` (C_* offsets; sign vectors after the tables, hkv * D each), the fields a method pair does not have
# and an absent window named by #define as another input of the launch (their code is dead for that pair).
C_SCALE, C_K, C_KTAB1, C_KTAB2, C_VTAB1, C_VTAB2, C_SIGNS = 0, 1, 4, 260, 516, 772, 1028
TABLE = 256                              # entries reserved per code table (2^bits <= 256)
_CONSTS = {
    "partial": {"f_scale": "(f_c + 0)", "f_k": "(f_c + 1)", "f_ktab1": "(f_c + 4)", "f_ktab2": "(f_c + 260)",
                "f_vtab1": "(f_c + 516)", "f_vtab2": "(f_c + 772)", "f_ksig": "(f_c + 1028)",
                "f_ktau": "(f_c + 1028 + (int)NBLOCK_Y * D)", "f_vsig": "(f_c + 1028 + 2 * (int)NBLOCK_Y * D)",
                "f_vtau": "(f_c + 1028 + 3 * (int)NBLOCK_Y * D)"},
    "combine": {"f_k": "(f_c + 1)", "f_vsig": "(f_c + 1028 + 2 * (int)NBLOCK_Y * D)",
                "f_vtau": "(f_c + 1028 + 3 * (int)NBLOCK_Y * D)"},
}


# HASWIN (template and kernel key): 0 no window, 1 both roles' windows with one encoded count; MIXED (the roles'
# encoded counts differ: kernels/append.py mixed, e.g. keys turboquant with R = 0 and values KIVI with R = 128): 2 the
# keys have an exact window and the values none, 3 the values have one and the keys none, 4 both (different lengths).
# A MIXED partial takes both windows (a role without one: a view of no rows) and a split S - 1 of its own
# (csrc/partial_setup.h): every row its append encodes and one role's records beside the other's window.
MIXED_WINDOWS = {2: (True, False), 3: (False, True), 4: (True, True)}
# `ragged` of a MIXED partial with the append inside whose KIVI values have R = 0 (cache/ragged_step.py's mixed plan):
# a flush's last value is the chunk's own, which the append reads from the chunk (meta[7]) while the window after the
# step keeps the chunk's row for the rows that do not flush; so its texts take no window rows as the values' own
# (VQ_VWOWN 0, and the keys' count without meta[7]: _role_count)
OWN = 2


def rkeyed(mk: int, mv: int) -> bool:
    """Whether a MIXED pair's KIVI role is its keys (beside values of a per-token method): in a ragged text the rows'
    phases are the keys' (VQ_RKEYS, csrc/partial_setup_mixed_ragged.h), else the values'."""
    return mk == METHOD_IDS["kivi"] and mv != METHOD_IDS["kivi"]


def role_windows(haswin: int) -> tuple[bool, bool]:
    """(keys, values) with an exact window the append inside moves, for a HASWIN code."""
    return MIXED_WINDOWS.get(int(haswin), (bool(haswin), bool(haswin)))


def _role_fields(r: str, m: int, haswin: bool) -> tuple[list[str], dict]:
    """(inputs a launch passes for role r with method id m, aliases of the others). A method's side fields are the
    kernel's s0 / s1 (per token) or gs / gz (per group: the affine methods)."""
    lay = layouts.by_kernel_id(m)
    _, c2, _, s1 = lay.kernel_fields()
    grouped = lay.affine
    used = [f"{r}c1"] + ([f"{r}c2"] if c2 else []) + ([f"{r}s0"] if not grouped else []) \
        + ([f"{r}s1"] if s1 and not grouped else []) + ([f"{r}gs", f"{r}gz"] if grouped else []) \
        + ([f"{r}w"] if haswin else [])
    side = f"{r}s0" if not grouped else f"{r}gs"
    alias = {f"{r}c2": f"{r}c1", f"{r}s0": side, f"{r}s1": side, f"{r}gs": side, f"{r}gz": side, f"{r}w": "q"}
    return used, {k: v for k, v in alias.items() if k not in used}


def inputs(kind: str, mk: int = 0, mv: int = 0, haswin: bool = False, fused: bool = False,
           append: bool = False, starts: bool = False, ragged: bool = False, whole: bool = False) -> list[str]:
    """The arrays a launch of `kind` passes for a method pair (MK, MV), window presence and (partial) whether
    the combine runs inside it (then `cnt`, the per-group counters, comes last) or the decode step's append
    (`append`: the new keys and values and append.py's constant arrays before `flags`), and `starts`: the batch
    rows' first attended tokens (`rstart`, (B,) int32: a left-padded batch), and `ragged`: each row's KIVI group
    phase (`rphase`, (B,) int32, last: accelerated/cache/ragged.py), in order; `whole`: the windows as whole buffers
    (kwb, vwb) and their rows (`wrow`, before `flags`: csrc/window_bind.h) instead of kw, vw, kf, vf."""
    if kind == "combine":
        return ["o_acc", "o_ml", "f_c", "q"] + (["tok"] if append else [])
    ku, _ = _role_fields("k", mk, haswin)
    vu, _ = _role_fields("v", mv, haswin)
    kwin, vwin = role_windows(haswin)
    leaving = ["wrow"] if whole else (["kf"] if append and kwin else []) + (["vf"] if append and vwin else [])
    if whole:
        ku, vu = ([n + "b" if n == f"{r}w" else n for n in u] for r, u in (("k", ku), ("v", vu)))
    return (["q", "f_c", "nenc"] + ku + vu + (["kx", "kconst", "vx", "vconst"] if append else []) + leaving + ["flags"]
            + (["cnt"] if fused else []) + (["rstart"] if starts else []) + (["rphase"] if ragged else []))


def aliases(kind: str, mk: int = 0, mv: int = 0, haswin: bool = False, fused: bool = False,
            append: bool = False, starts: bool = False, ragged: bool = False) -> str:
    """#define lines giving the body's names to what the launch passes."""
    lines = [f"#define {n} {e}" for n, e in _CONSTS[kind].items()]
    if kind == "partial":       # the tokens this launch appends (APPEND), the last of the nenc encoded ones
        lines.append(f"#define VQ_TNEW {'((int)kx_shape[2])' if append else '0'}")
        # the tokens this launch encodes (split S - 1 attends them): the chunk's, or with KIVI's window the keys'
        # meta Q (append.constants: 0, or a group of G leaving the window)
        kivi = append and haswin and source.METHOD_IDS["kivi"] in (mk, mv)
        meta = "((int)kconst[2 * (int)kx_shape[1] * ((D + 31) / 32) + VQ_CONST_META + {}])"
        lines.append("#define VQ_TENC " + (meta.format(5) if kivi else "VQ_TNEW"))
        # ... and the window's rows that are the chunk's own tokens it encodes (KIVI with window 0 at a flush)
        # (a ragged KIVI batch: 0, its window after the step always holds the chunk's row: csrc/partial_setup_tokens.h)
        lines.append("#define VQ_WOWN " + (meta.format(7) if kivi and not ragged else "0"))
        mixed = int(haswin) in MIXED_WINDOWS
        lines.append(f"#define VQ_MIXED {int(mixed)}")
        if mixed:               # each role's own: its meta's Q and own tokens (append.constants; 0 without the append)
            for r in "kv":
                role_meta = _role_meta(r)
                lines.append(f"#define VQ_{r.upper()}TENC " + (role_meta.format(5) if append else "0"))
                lines.append(f"#define VQ_{r.upper()}WOWN " + (role_meta.format(7) if append and ragged != OWN
                                                              else "0"))
        lines.append(f"#define VQ_STARTS {int(starts)}")
        # a ragged KIVI batch (cache/ragged.py): each row's group phase; KIVI keys' group row of token t from it (a
        # MIXED window: the KIVI values' phase, each row's ranges in csrc/partial_setup_mixed_ragged.h)
        lines.append(f"#define VQ_RAGGED {int(bool(ragged))}")
        if ragged:              # ... with the step's append inside: the flushing rows' group (append_block); KIVI keys
                                # beside per-token values (VQ_RKEYS: the keys' phase, their records to each row's QKR)
            rkeys = mixed and rkeyed(mk, mv)
            lines += [f"#define VQ_RAGGED_APPEND {int(append)}", f"#define VQ_RKEYS {int(rkeys)}",
                      f"#define VQ_QKR {'QKR' if rkeys else 'QK'}"]
        lines.append("#define VQ_KGROW(t) " + ("((t) - vq_ph) / KG" if ragged else "t / KG"))
        if not starts:          # (code VQ_STARTS = 0 never runs)
            lines.append("#define rstart nenc")
        if not append:          # the window's rows this launch appends (code APPEND = 0 never runs)
            lines += ["#define kx kw", "#define kx_strides kw_strides", "#define vx vw", "#define vx_strides vw_strides"]
    if kind == "partial" and not fused:   # the combine's names, in code that FUSED = 0 never runs
        lines += ["#define cnt nenc", "#define out ((DEVICE OT*)o_acc)"]
    if kind == "partial":
        for r, m in (("k", mk), ("v", mv)):
            for n, to in _role_fields(r, m, haswin)[1].items():
                lines.append(f"#define {n} {to}")
                lines += [f"#define {n}{x} {to}{x}" for x in ("_shape", "_strides") if f"{n}{x}" in BODIES[kind]]
    return "\n".join(lines) + "\n"


# ---- the texts: csrc/ ----------------------------------------------------------------------------------------
HELPERS = loader.text("attention_helpers.h")
MAX_SPLITS = 2048          # splits (S + 1 with the window) a combine launch takes: accelerated.kernels.attention
                           # caps them (tuning's max_threadgroups; the tensor-core loop's one wave is far fewer)
# the partial's body with its scalar loop and fused combine (csrc/partial.h), or the tensor-core loop's (CUDA), its
# code layout in four parts: codes in whole words or part of one, or (a role's) 3-bit codes, 10 to a word
TC_WORDS = {"VQ_TC_SIZES": "tc_words_sizes.cuh", "VQ_TC_BASES": "tc_words_bases.cuh", "VQ_TC_KEYS": "tc_words_keys.cuh",
            "VQ_TC_VALUES": "tc_words_values.cuh"}
TC_TENS_PARTS = {"VQ_TC_SIZES": "tc_tens_sizes.cuh", "VQ_TC_BASES": "tc_tens_bases.cuh", "VQ_TC_KEYS": "tc_tens_keys.cuh",
                 "VQ_TC_VALUES": "tc_tens_values.cuh"}
TC_TENS = 3                # `tc` of a partial whose tensor-core loop reads a role's 3-bit codes (PARTIAL_TC3_BODY)
PARTIAL_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "partial_loop.h", "VQ_COMBINE_ROWS": "combine_rows.h"})
PARTIAL_TC_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_loop.cuh", "VQ_COMBINE_ROWS": "combine_rows_strided.h",
                                            **TC_WORDS, **ONE_STREAM})
# ... with a role of 3-bit codes (tc = TC_TENS: tuning's tc_3bit), 10 to a word: loaded raw, realigned per use
PARTIAL_TC3_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_loop.cuh", "VQ_COMBINE_ROWS": "combine_rows_strided.h",
                                             **TC_TENS_PARTS, **ONE_STREAM})
# ... with a second code stream (turboquant_rvq's codes2, prod keys' QJL signs: attention_tc.py TWO_STREAMS)
PARTIAL_TC_TWO_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_loop.cuh",
                                                "VQ_COMBINE_ROWS": "combine_rows_strided.h", **TC_WORDS, **TWO_STREAMS})
PARTIAL_TC_PROD_VALUES_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_loop.cuh",
                                                        "VQ_COMBINE_ROWS": "combine_rows_strided.h", **TC_WORDS,
                                                        **PROD_VALUES})
# ... with 3-bit codes in the first stream and prod's QJL signs as the second (tc = TC_TENS, tuning's tc_prod3: prod
# b4's mse codes): the second stream keeps its own 1-bit layout (tc_two_setup.cuh's KWL2 / VWL2 / kbase2 / vbase2)
PARTIAL_TC3_TWO_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_loop.cuh",
                                                 "VQ_COMBINE_ROWS": "combine_rows_strided.h", **TC_TENS_PARTS,
                                                 **PROD3_KEYS})
PARTIAL_TC3_PROD_VALUES_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_loop.cuh",
                                                         "VQ_COMBINE_ROWS": "combine_rows_strided.h", **TC_TENS_PARTS,
                                                         **PROD3_VALUES})
# ... with KIVI records (MK = MV = 4: tuning's tc_kivi): the scales folded into the mma operands (tc_kivi_loop.cuh)
PARTIAL_TC_KIVI_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_kivi_loop.cuh",
                                                 "VQ_COMBINE_ROWS": "combine_rows_strided.h", **ONE_STREAM})
# ... with turboquant keys beside KIVI values (tc = TC_MIX: tuning's tc_mixed): the keys' score pass in the 3-bit or
# word layout, KIVI's value m-tiles; a MIXED partial's split S - 1 in scalar arithmetic (csrc/tc_mixed_split.h)
TC_MIX = 4
PARTIAL_TC_MIXED_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_mixed_loop.cuh",
                                                  "VQ_COMBINE_ROWS": "combine_rows_strided.h", **TC_TENS_PARTS,
                                                  **ONE_STREAM, "VQ_TC_MTOKEN": "tc_mixed_token.h"})
# ... with KIVI keys beside turboquant or rabitq values (tc = TC_MIXK: tuning's tc_mixkv): KIVI's score pass, the
# values' m-tiles in the 3-bit or word layout; a MIXED partial's split S - 1 in scalar arithmetic (its own token)
TC_MIXK = 5
PARTIAL_TC_MIXK_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_mixkv_loop.cuh",
                                                  "VQ_COMBINE_ROWS": "combine_rows_strided.h", **TC_TENS_PARTS,
                                                  **ONE_STREAM, "VQ_TC_MTOKEN": "tc_mixkv_token.h"})
# ... with mlx_affine records (MK = MV = 5: tuning's tc_affine): keys and values dequantized into the mma operands
PARTIAL_TC_AFFINE_BODY = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_affine_loop.cuh",
                                                   "VQ_COMBINE_ROWS": "combine_rows_strided.h", **ONE_STREAM})
COMBINE_BODY = loader.defines({"VQ_MAX_SPLITS": MAX_SPLITS}) + loader.text("combine.h")
COMBINE_SUMMARY = loader.text("combine_summary.h")
BODIES = {"partial": PARTIAL_BODY, "combine": COMBINE_BODY}
# (header, prelude) per backend
PRELUDES = {be: (loader.backend_file(f"attention_{be}_header", be), loader.backend_file(f"attention_{be}_prelude", be))
            for be in ("cuda", "metal")}
(CUDA_HEADER, CUDA_PRELUDE), (METAL_HEADER, METAL_PRELUDE) = PRELUDES["cuda"], PRELUDES["metal"]


def encode_macros(be: str) -> tuple[str, str]:
    """(header, macro lines) the encode body needs beside the attention prelude (APPEND): the encode kernels'
    header, csrc/<be>_encode_ops and the scopes' address spaces (<be>_scope)."""
    return source.PRELUDES[be][0], loader.backend_file(f"{be}_encode_ops", be) + loader.backend_file(f"{be}_scope", be)


def _role_meta(r: str) -> str:
    """Role r's meta[{}] in its append constants (kernels/append.py constants: meta after the signs and tables)."""
    return f"((int){r}const[2 * (int){r}x_shape[1] * ((D + 31) / 32) + VQ_CONST_META + {{}}])"


def _role_count(r: str, own: bool = True) -> str:
    """MIXED: role r's encoded tokens after the launch from nenc (the roles' common prefix) and the windows' rows:
    Q + max(RK, RV) - R_r (csrc/partial_setup.h QK, QV); `own` False: no window rows are a role's own (OWN)."""
    rk, rv = (f"((int){x}w_shape[2] - {_role_meta(x).format(7)})" if own else f"((int){x}w_shape[2])" for x in "kv")
    return f"(nenc[0] + ({rk} > {rv} ? {rk} : {rv}) - {rk if r == 'k' else rv})"


def append_block(mk: int, mv: int, haswin: bool = False, ragged: bool = False) -> str:
    """The APPEND prologue of the partial body for a method pair (csrc/attention_append.h with each role's encode
    scope parameters; placed before the aliases: the encode body's own names f_k, sig, ... are locals there). The
    code constants are compiled in (template KCB1, ..., VCGS: methods.code_constants). `haswin`: exact windows
    (kernels/append.py WINDOWED): each role encodes kf, the tokens leaving its window, and copies the chunk kx into
    the last rows of kw, the window the launch attends (which its window split reads from kx: partial_loop.h).
    `ragged`: KIVI rows of their own group phase (cache/ragged.py): the launch's group (meta's Q: 0 or G) starts at
    x = T - RW - G (T = nenc + the window's rows: every flushing row's x) and only the rows whose phase flushes at T
    encode it (VQ_ROW_ENCODES, csrc/encode.h); the others only copy the chunk into their window."""
    scopes = []
    mixed = int(haswin) in MIXED_WINDOWS
    wins = role_windows(haswin)
    for index, (r, m) in enumerate((("k", mk), ("v", mv))):
        alias = _role_fields(r, m, False)[1]
        side = ("gs", "gz") if layouts.by_kernel_id(m).affine else ("s0", "s1")
        out = {o: alias.get(f"{r}{n}", f"{r}{n}") for o, n in zip(("codes1", "codes2", "f_s1", "f_s2"),
                                                                   ("c1", "c2", *side))}
        R = r.upper()
        kivi = m == source.METHOD_IDS["kivi"]
        # KIVI (windowed): the launch encodes meta's Q tokens (0, or a group leaving the window), not the chunk's t
        base = "nenc[0] - meta[5]" if kivi else f"nenc[0] - (int){r}x_shape[2]"
        if mixed:      # (MIXED: the role's own count; meta[5] is the tokens it encodes, t or KIVI's 0 / G)
            base = f"{_role_count(r, ragged != OWN)} - meta[5]"
        if ragged:      # (MIXED: the per-token role's base as above; the KIVI role's x from T = nenc + its window, or
                        # with both roles' windows, HASWIN 4, T = nenc + the longer window: the other's may start below)
            kr = "k" if rkeyed(mk, mv) else "v"        # (the KIVI role of a MIXED pair)
            vt = f"(int){kr}w_shape[2]" if int(haswin) != 4 else \
                "((int)kw_shape[2] > (int)vw_shape[2] ? (int)kw_shape[2] : (int)vw_shape[2])"
            base = base if mixed and r != kr else f"(nenc[0] + {vt} - RW - {R}G)" if mixed \
                else "(nenc[0] + (int)kw_shape[2] - RW - KG)"
        win = wins[index]
        scopes.append(kappend.scope(R, index, m=str(m), codes=(f"{R}CB1", f"{R}CB2", f"{R}CGS"), ts=f"{R}TS",
                                    x=f"{r}f" if win else f"{r}x", const=f"{r}const", out=out, fault="token",
                                    cap=f"(int){out['codes1']}_shape[2]", base=base,
                                    shared=r, window=(f"{r}x", f"{r}w", f"{R}XT") if win else None,
                                    gcap=f"(int){out['f_s1']}_shape[2]" if kivi and r == "k" else None,
                                    role_window=win if mixed else None))
    files = kappend.MIXED if mixed else kappend.WINDOWED if haswin else kappend.SCOPED
    return kappend.scope_constants() + "".join(scopes) + (kappend.RAGGED_ENCODES if ragged else "") \
        + loader.text("attention_append.h", files)


def whole_windows(haswin: int, append: bool) -> str:
    """A partial's window names bound to rows of whole buffers (kernels/append.py window_bind), rows relative to
    nenc: both roles' windows (a role without one: rows of none), with the append inside the tokens leaving them."""
    kwin, vwin = role_windows(haswin)
    return kappend.window_bind(True, True, append and kwin, append and vwin, "nenc[0]", "nenc[0]")


def mixed_knobs(tc, haswin, ragged, t: tuning.Tuning | None = None) -> tuple[int, int]:
    """(tc_mixed_splits, tc_mixed_cost) of the tuning `t` (the current one by default) for a MIXED partial on TC_MIX's
    or TC_MIXK's loop, not ragged (its text's VQ_MIXS, VQ_MIXR: csrc/partial_setup_mixed.h); (1, 0) for every other
    partial, whose text has split S - 1 alone."""
    t = t or tuning.current()
    if tc in (TC_MIX, TC_MIXK) and int(haswin) in MIXED_WINDOWS and not ragged and t.tc_mixed_splits > 1:
        return t.tc_mixed_splits, t.tc_mixed_cost
    return 1, 0


def mixed_defines(splits: int, cost: int) -> str:
    """The header lines of `mixed_knobs`' (splits, cost); none for split S - 1 alone."""
    return "".join(f"#define {n} {v}\n" for n, v in (("VQ_MIXS", splits), ("VQ_MIXR", cost))) if splits > 1 else ""


def mixed_tag(mix: tuple[int, int], tc, haswin, ragged) -> str:
    """A MIXED tensor-core partial's name tail where its `mixed_knobs` are not the defaults'."""
    if mix == mixed_knobs(tc, haswin, ragged, tuning.DEFAULT):
        return ""
    return f"_m{mix[0]}" + (f"c{mix[1]}" if mix[0] > 1 else "")


def partial_body(mk: int, mv: int, tc: bool) -> str:
    """The partial's body for a method pair: the scalar loop's, or (`tc`) the tensor-core loop's (KIVI's and
    mlx_affine's own; `tc` = TC_MIX: turboquant keys beside KIVI values; TC_MIXK: KIVI keys beside turboquant
    values; `tc` = TC_TENS: the one that reads 3-bit
    codes, also beside prod's signs; with a second code stream, turboquant_rvq's or turboquant_prod's QJL signs, its
    hooks bound to attention_tc.TWO_STREAMS or, prod values, PROD_VALUES; beside 3-bit codes PROD3_KEYS /
    PROD3_VALUES)."""
    if not tc:
        return PARTIAL_BODY
    if tc == TC_MIX:      # (turboquant keys, KIVI values)
        return PARTIAL_TC_MIXED_BODY
    if tc == TC_MIXK:    # (KIVI keys, turboquant values)
        return PARTIAL_TC_MIXK_BODY
    if mk == mv == METHOD_IDS["mlx_affine"]:
        return PARTIAL_TC_AFFINE_BODY
    if mk == mv == METHOD_IDS["kivi"]:
        return PARTIAL_TC_KIVI_BODY
    prod = METHOD_IDS["turboquant_prod"]
    if tc == TC_TENS:       # (prod b4: 3-bit mse codes beside the signs' stream; rvq keeps 3-bit streams scalar)
        return PARTIAL_TC3_PROD_VALUES_BODY if mv == prod else PARTIAL_TC3_TWO_BODY if mk == prod else PARTIAL_TC3_BODY
    if mv == prod:
        return PARTIAL_TC_PROD_VALUES_BODY
    two = METHOD_IDS["turboquant_rvq"] in (mk, mv) or mk == prod
    return PARTIAL_TC_TWO_BODY if two else PARTIAL_TC_BODY


def assemble(kind: str, backend: str, mk: int = 0, mv: int = 0, haswin: bool = False, fused: bool = False,
             tc: bool = False, append: bool = False, starts: bool = False, ragged: bool = False,
             whole: bool = False) -> tuple[str, str]:
    """(header, source) of kernel `kind` ("partial" | "combine") for `backend` ("cuda" | "metal") and the
    launch's inputs (`inputs(kind, mk, mv, haswin, fused, append)`); `tc`: the partial's tensor-core loop (CUDA);
    `append`: the decode step's append inside (APPEND, append_block); for the combine: it also takes a chunk's
    token (an APPEND partial's or the append kernel's) and writes its summary (COMBINE_SUMMARY); `ragged`: rows of
    their own KIVI group phase (the scalar loop or, KIVI both roles, the tensor-core loop: tuning's tc_ragged; with row
    starts; with the append, each row flushes its group at its own step: append_block; a MIXED window: per-token keys
    beside KIVI values, the values' phase, on the scalar loop or TC_MIX's, the append inside with the values' window
    (HASWIN 3, also OWN's) or both roles' (HASWIN 4)); `whole`: the windows bound to rows of whole buffers first
    (kernels/append.py window_bind; a windowed partial, not ragged)."""
    header, prelude = PRELUDES[backend]
    if whole and (kind != "partial" or not haswin or ragged):
        raise ValueError("whole: a windowed partial's, not ragged")
    if tc and (backend != "cuda" or kind != "partial"):
        raise ValueError("the tensor-core loop is a CUDA partial kernel's")
    if append and fused:
        raise ValueError("the append runs inside an unfused partial launch")
    kivi = mk == mv == METHOD_IDS["kivi"]
    # MIXED ragged: per-token keys beside KIVI values (the values' phase), the scalar loop or TC_MIX's; the append
    # inside with the values' window (HASWIN 3: cache/ragged_step.py's mixed plan) or both roles' (HASWIN 4: its
    # windowed plan); or KIVI keys beside per-token values, the keys' phase (rkeyed, the scalar loop): the append with
    # the keys' window (HASWIN 2) or both roles' (4)
    mixed = int(haswin) in MIXED_WINDOWS
    rkeys = rkeyed(mk, mv)
    pair = rkeys or (mv == METHOD_IDS["kivi"] and mk != METHOD_IDS["kivi"])
    bad_mixed = mixed and ((tc and tc != (TC_MIXK if rkeys else TC_MIX)) or not pair
                           or (append and int(haswin) not in ((2, 4) if rkeys else (3, 4))))
    tc_mix = tc == TC_MIX and mk == METHOD_IDS["turboquant"] and int(haswin) in (3, 4)     # (mixed_takes)
    bad_tc = tc and not ((tc is True and kivi) or tc_mix)
    if tc == TC_MIXK and (mk != METHOD_IDS["kivi"] or mv not in (METHOD_IDS["turboquant"], METHOD_IDS["rabitq"])):
        raise ValueError("TC_MIXK: the tensor-core loop of KIVI keys beside turboquant or rabitq values")
    if ragged and rkeys and int(haswin) == 3:      # (KIVI keys always keep a window: append.role_window)
        raise ValueError("ragged KIVI keys beside per-token values (VQ_RKEYS): HASWIN 2 (the keys' window) or 4 (both "
                         "roles'), not 3 (the values' window only: no plan's)")
    if ragged == OWN and ((tc and not tc_mix) or not append or int(haswin) != (2 if rkeys else 3)):
        raise ValueError("ragged OWN: the MIXED partial with the append inside and the KIVI role's window only "
                         "(HASWIN 3; KIVI keys: 2), the scalar loop or TC_MIX's")
    if ragged and (bad_tc or not starts or bad_mixed or (append and not haswin)):
        raise ValueError("ragged: the scalar loop or KIVI's tensor-core loop, with row starts (the append: with a "
                         "window); MIXED: per-token keys beside KIVI values on the scalar loop or TC_MIX's (the "
                         "append: HASWIN 3 or 4)")
    pre = whole_windows(haswin, append) if whole else ""
    if append and kind == "partial":
        eh, em = encode_macros(backend)
        header, pre = header + eh, pre + em + append_block(mk, mv, haswin, ragged)
    body = partial_body(mk, mv, tc) if kind == "partial" else BODIES[kind]
    if kind == "combine" and append:
        body = COMBINE_SUMMARY + body
    return (header + (TC_CUDA_HEADER if tc else ""),
            prelude + pre + aliases(kind, mk, mv, haswin, fused, append, starts, ragged) + body)
