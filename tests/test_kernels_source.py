"""accelerated.kernels.source on the CPU, without a GPU:
- one body per kernel shared by CUDA and Metal, every float operation through the exact-arithmetic helpers
  (a lint of the body), the preludes' helpers are the correctly rounded non-contractible ones;
- CUDA (where nvcc is installed): every kernel, as MLX's cuda_kernel assembles it, compiles for sm_90 to PTX
  whose float ops are all .rn, with no fma / rcp / rsqrt (spec/number-model.md), and ptxas reports no spills
  for the head dims up to 256;
- Metal: the kernels as MLX's metal_kernel assembles them compile with g++ against tests/metal_shim.h (the
  Metal builtins the bodies use), and a lint checks the Metal rules the shim cannot (address spaces,
  threadgroup arrays at kernel scope, no double, no CUDA names). No Metal result is claimed.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from veloxquant.accelerated.kernels import source
from veloxquant.tools.dev import kernel_resources as kr

FLOAT_HELPERS = ("ADD", "SUB", "MUL", "DIV", "SQRT", "NEG", "ABS", "FLIP", "MINF", "MAXF", "PIN", "TO_F32", "TO_TS")
OTHER_MACROS = ("TID", "TOKEN", "HEAD", "BATCH", "NTOK", "NHEAD", "LANE", "WARP", "NWARPS", "GROUP", "NGROUPS",
                "SHARED", "BARRIER", "WARP_SYNC", "SHFL_XOR", "SHFL_DOWN", "SHFL", "ANY", "BALLOT")
SHIM = pathlib.Path(__file__).with_name("metal_shim.h")


def _strip_brackets(s: str) -> str:
    """Remove index expressions (integer arithmetic) inside [...], innermost first."""
    prev = None
    while prev != s:
        prev = s
        s = re.sub(r"\[[^\[\]]*\]", "[]", s)
    return s


def float_op_violations(body: str) -> list[str]:
    """Statements of `body` that apply a raw arithmetic operator to float data.

    Convention (accelerated/kernels/source.py): float variables and arrays are named f_*, float literals end
    in `f`. A statement touching float data may use arithmetic only inside helper calls' names, i.e. it may
    contain no binary + - * / (nor compound assignments) outside [index] brackets; and every `float`
    declaration must name an f_* variable."""
    code = re.sub(r"//[^\n]*", "", body)
    code = re.sub(r"^[ \t]*#.*$", "", code, flags=re.M)      # preprocessor lines: parameter bindings, not statements
    code = re.sub(r"\b(float|u?int\w*)\s*\*", r"\1 ", code)  # a pointer declarator is no multiplication
    bad = []
    for stmt in re.split(r"[;{}]", code):
        s = _strip_brackets(" ".join(stmt.split()))
        if not s:
            continue
        for m in re.finditer(r"\bfloat\s+(\w+)", s):
            if not m.group(1).startswith("f_"):
                bad.append(f"float variable not named f_*: {s}")
        touches_float = re.search(r"\bf_\w+|\b\d+\.\d*f\b", s)
        if touches_float and re.search(r"[-+*/]", s.replace("->", "")):
            bad.append(s)
    return bad


@pytest.mark.parametrize("kind", ["encode", "decode"])
def test_body_has_no_raw_float_ops(kind):
    body = source.BODIES[kind]
    assert float_op_violations(body) == []
    for helper in ("ADD", "MUL", "FLIP"):
        assert f"{helper}(" in body  # the lint is not vacuous: the helpers are there


def test_lint_catches_raw_float_ops():
    assert float_op_violations("f_v = f_a * f_b;")
    assert float_op_violations("f_red[j] = f_red[j] + f_red[j + n];")
    assert float_op_violations("float tmp = 1.0f;")
    assert float_op_violations("f_v += f_w;")
    assert float_op_violations("f_v = ADD(f_a, 2.0f * f_b);")
    assert float_op_violations("const int k = 3 * j; f_v = ADD(f_buf[k + 1], f_w);") == []


@pytest.mark.parametrize("kind", ["encode", "decode"])
def test_cuda_and_metal_share_the_body(kind):
    body = source.BODIES[kind]
    for backend in ("cuda", "metal"):
        header, src = source.assemble(kind, backend)
        assert src.endswith(body) and src.count(body) == 1
        prelude = src[: -len(body)]
        assert prelude == source.PRELUDES[backend][1]
        # the prelude is only macros (and comments): no code of its own
        assert all(not ln.strip() or ln.startswith(("#define ", "//")) for ln in prelude.splitlines())
        # every macro the bodies use is defined by the prelude
        for h in FLOAT_HELPERS + OTHER_MACROS:
            assert re.search(rf"^#define {h}\b", prelude, re.M), (backend, h)


def test_prelude_helpers_are_exact():
    cuda = source.CUDA_PRELUDE
    for h, intrinsic in [("ADD", "__fadd_rn"), ("SUB", "__fsub_rn"), ("MUL", "__fmul_rn"),
                         ("DIV", "__fdiv_rn"), ("SQRT", "__fsqrt_rn")]:
        assert re.search(rf"^#define {h}\(.*\) {intrinsic}\(", cuda, re.M), h
    assert "rsqrt" not in cuda and "__frcp" not in cuda
    assert "__float2half_rn" in source.CUDA_HEADER and "__float2bfloat16_rn" in source.CUDA_HEADER
    metal_h, metal_p = source.METAL_HEADER, source.METAL_PRELUDE
    assert "#pragma clang fp contract(off)" in metal_h
    assert "metal::precise::divide" in metal_h and "metal::precise::sqrt" in metal_h
    assert "fast::" not in metal_h and "rsqrt" not in metal_h
    for h, fn in [("ADD", "vq_add"), ("SUB", "vq_sub"), ("MUL", "vq_mul"), ("DIV", "vq_div"), ("SQRT", "vq_sqrt"),
                  ("PIN", "vq_pin")]:
        assert re.search(rf"^#define {h}\(.*\) {fn}\(", metal_p, re.M), h


# MLX's metal_kernel adds an attribute parameter only if its name occurs in the source; these are the ones it
# knows (mlx/backend/common/metal_kernel.cpp). Anything else the prelude names would be undeclared.
MLX_METAL_ATTRIBUTES = {
    "dispatch_quadgroups_per_threadgroup": "uint", "dispatch_simdgroups_per_threadgroup": "uint",
    "dispatch_threads_per_threadgroup": "uint3", "grid_origin": "uint3", "grid_size": "uint3",
    "quadgroup_index_in_threadgroup": "uint", "quadgroups_per_threadgroup": "uint",
    "simdgroup_index_in_threadgroup": "uint", "simdgroups_per_threadgroup": "uint", "thread_execution_width": "uint",
    "thread_index_in_quadgroup": "uint", "thread_index_in_simdgroup": "uint", "thread_index_in_threadgroup": "uint",
    "thread_position_in_grid": "uint3", "thread_position_in_threadgroup": "uint3",
    "threadgroup_position_in_grid": "uint3", "threadgroups_per_grid": "uint3", "threads_per_grid": "uint3",
    "threads_per_simdgroup": "uint", "threads_per_threadgroup": "uint3",
}


def test_metal_indices_are_attributes_mlx_declares():
    _, src = source.assemble("encode", "metal")
    used = [a for a in MLX_METAL_ATTRIBUTES if a in src]
    for attr in ("thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
                 "threadgroup_position_in_grid", "threadgroups_per_grid"):
        assert attr in used
    # nothing else of the [[...]] family is referenced
    for name in re.findall(r"\b(\w+(?:_in_|_per_)\w+)\b", source.METAL_PRELUDE):
        assert name in MLX_METAL_ATTRIBUTES, name


# ---- CUDA: nvcc ----------------------------------------------------------------------------------------
# (method, d, (B1, B2, GS, KR)) beyond kr.CODES' defaults, for the compile checks
CODE_VARIANTS = [("turboquant", 128, (1, 1, 1, 0)), ("turboquant", 128, (3, 1, 1, 0)), ("turboquant", 80, (2, 1, 1, 0)),
                 ("turboquant_rvq", 128, (3, 4, 1, 0)), ("turboquant_prod", 128, (4, 1, 1, 0)),
                 ("kivi", 128, (4, 1, 32, 1)), ("kivi", 128, (3, 1, 16, 1)), ("kivi", 128, (8, 1, 128, 0)),
                 ("kivi", 80, (5, 1, 16, 0)), ("mlx_affine", 128, (8, 1, 32, 0)), ("mlx_affine", 128, (2, 1, 128, 0))] + \
                [(m, d, (0, 0, 0, -1)) for m in source.METHOD_IDS for d in (128, 80)]   # generic: meta read at run time
NVCC = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
PTX_KERNELS = ([("encode", m, 128, xt) for m in source.METHOD_IDS for xt in kr.CUDA_TYPES]
               + [("decode", m, 128, "float16") for m in source.METHOD_IDS]
               + [("decode", "mlx_affine", 128, xt) for xt in ("float32", "bfloat16")]
               + [(k, m, d, "bfloat16") for k in ("encode", "decode") for m in ("turboquant_prod", "kivi")
                  for d in (16, 1024)]
               # spec 1.1 head dims d = m * 2^k, m > 1: stage B of H and the block fold (80: 4 lanes; 96; 896)
               + [(k, m, d, "float16") for k in ("encode", "decode") for m in source.METHOD_IDS for d in (80, 96, 896)
                  if m != "mlx_affine" or d % 32 == 0]
               # other code constants (B1, B2, GS, KR): each packing path (1-bit ballot, 2/4/8-bit lane groups,
               # 3/5/6/7-bit staging), kivi keys, other groups
               + [(k, m, d, "float16", c) for k in ("encode", "decode") for m, d, c in CODE_VARIANTS])


@NVCC
def test_cuda_source_compiles_without_fma():
    r = kr.nvcc(kr.translation_unit(PTX_KERNELS), "ptx")
    assert r.returncode == 0, r.stderr[-3000:]
    ptx = r.artifact
    assert ptx.count(".entry") == len(PTX_KERNELS)
    ops = re.findall(r"^\s*(fma|add|sub|mul|div|sqrt|rsqrt|rcp)\.([a-z0-9.]+)", ptx, re.M)
    float_ops = {f"{op}.{mod}" for op, mod in ops if mod.endswith("f32")}
    assert {"add.rn.f32", "mul.rn.f32", "div.rn.f32", "sqrt.rn.f32"} <= float_ops, float_ops
    assert all(".rn." in f".{fo}." for fo in float_ops), float_ops     # explicit RNE: ptxas may not fuse
    assert not any(fo.startswith(("fma", "rsqrt", "rcp")) for fo in float_ops), float_ops
    assert "cvt.rn.f16.f32" in ptx and "cvt.rn.bf16.f32" in ptx      # RNE to float16 / bfloat16 (TS)
    assert ".ftz" not in ptx                                          # no flush to zero anywhere


@NVCC
def test_cuda_resources_no_spills():
    """ptxas -v for sm_90: no spills and a bounded register count for d <= 256 (bandwidth depends on it)."""
    kernels = [(k, m, d, "float16") for k in ("encode", "decode") for m in source.METHOD_IDS for d in (128, 256)]
    r = kr.nvcc(kr.translation_unit(kernels), "cubin", verbose=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res = kr.ptxas_resources(r.stderr)
    assert len(res) == len(kernels)
    for name, info in res.items():
        assert info.get("spill_stores", 0) == 0 and info.get("spill_loads", 0) == 0, (name, info)
        assert info["registers"] <= 128, (name, info)
        assert info["smem_bytes"] <= source.SMEM_CODES + 384, (name, info)   # + fault flags, quantize tables


def test_resource_parser():
    text = ("ptxas info    : Compiling entry function '_Zk1' for 'sm_90'\nptxas info    : Function properties for "
            "_Zk1\n    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\nptxas info    : Used 40 "
            "registers, used 1 barriers, 8448 bytes smem, 456 bytes cmem[0]\n")
    assert kr.ptxas_resources(text) == {"_Zk1": {"registers": 40, "smem_bytes": 8448, "stack_bytes": 8,
                                                 "spill_stores": 4, "spill_loads": 4}}
    assert kr.occupancy(32, 0) == 1.0 and kr.occupancy(40, 8448) == 0.75 and kr.occupancy(64, 8448) == 0.5


# ---- Metal: the shim compile and the Metal rules -------------------------------------------------------
METAL_TYPES = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t"}


def metal_kernel_source(kind: str, method: str, d: int, xt: str, small: frozenset = frozenset(),
                        codes: tuple | None = None) -> str:
    """The kernel as MLX's metal_kernel writes it (mlx/backend/common/metal_kernel.cpp write_signature and
    the explicit instantiation): `const device T*` inputs (`constant` for arrays of < 8 elements: `small`),
    `device T*` outputs, the attributes the source names, `template <int M, int D, typename TS, int B1, int B2,
    int GS, int KR>`."""
    header, src = source.assemble(kind, "metal")
    ts = METAL_TYPES[kr.side_type(method, xt)]
    if kind == "encode":
        types = {"x": METAL_TYPES[xt], "sig": "uint32_t", "tau": "uint32_t", "meta": "int32_t"}
        outs = [("codes1", "uint32_t"), ("codes2", "uint32_t"), ("f_s1", ts), ("f_s2", ts), ("fault", "bool")]
        names = source.ENCODE_INPUTS
    else:
        types = {"codes1": "uint32_t", "codes2": "uint32_t", "f_s1": ts, "f_s2": ts, "sig": "uint32_t",
                 "tau": "uint32_t", "meta": "int32_t"}
        outs = [("f_out", "float")]
        names = source.DECODE_INPUTS
    params = metal_params([(n, types.get(n, "float"), "constant" if n in small else "device") for n in names],
                          outs, src)
    name = f"custom_kernel_vq_{kind}_{method}_{xt}"
    targs = f"<{source.METHOD_IDS[method]}, {d}, {ts}, " + ", ".join(map(str, codes or kr.CODES[method])) + ">"
    return (f"{header}\ntemplate <int M, int D, typename TS, int B1, int B2, int GS, int KR>\n[[kernel]] void {name}(\n"
            + ",\n".join(params)
            + f") {{\n{src}\n}}\n"
            + f"template [[host_name(\"{name}\")]] [[kernel]] decltype({name}{targs}) {name}{targs};\n")


def metal_params(ins: list, outs: list, src: str) -> list[str]:
    """The parameters MLX's metal_kernel writes (write_signature): inputs [(name, type, address space)] with
    `constant` shapes and strides where the source names them, outputs [(name, type)] as `device T*`, in buffer
    order, then the thread-position attributes the source names."""
    params, i = [], 0
    for n, ty, loc in ins:
        params.append(f"  const {loc} {ty}* {n} [[buffer({i})]]")
        i += 1
        for suffix, t in (("_shape", "int"), ("_strides", "int64_t")):
            if f"{n}{suffix}" in src:
                params.append(f"  const constant {t}* {n}{suffix} [[buffer({i})]]")
                i += 1
    for n, t in outs:
        params.append(f"  device {t}* {n} [[buffer({i})]]")
        i += 1
    return params + [f"  {t} {a} [[{a}]]" for a, t in MLX_METAL_ATTRIBUTES.items() if a in src]


def _gxx_metal(text: str, tmp_path) -> subprocess.CompletedProcess:
    f = tmp_path / "k.metal.cpp"
    f.write_text(f'#include "{SHIM}"\n' + text)
    return subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wno-attributes", "-Werror=double-promotion",
                           "-Werror=float-conversion", "-x", "c++", str(f)], capture_output=True, text=True,
                          timeout=300)


GXX = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: Metal shim compile skipped")


@GXX
@pytest.mark.parametrize("kind", ["encode", "decode"])
def test_metal_source_compiles_against_shim(kind, tmp_path):
    text = source.METAL_HEADER    # once: each MLX kernel is its own library, here they share one file
    for m in source.METHOD_IDS:
        for xt in (METAL_TYPES if kind == "encode" or m == "mlx_affine" else ("float32",)):
            for d in (16, 128, 80, 96):                       # 80, 96: spec 1.1's d = m * 2^k with m > 1
                if m == "mlx_affine" and d % 32:
                    continue
                small = frozenset({"tau", "f_c2", "f_b2", "codes2"})   # 1-element dummies: constant space
                text += metal_kernel_source(kind, m, d, xt, small).replace(source.METAL_HEADER, "").replace(
                    f"custom_kernel_vq_{kind}_{m}_{xt}", f"custom_kernel_vq_{kind}_{m}_{xt}_d{d}")
    for i, (m, d, codes) in enumerate(CODE_VARIANTS):
        text += metal_kernel_source(kind, m, d, "float16", codes=codes).replace(source.METAL_HEADER, "").replace(
            f"custom_kernel_vq_{kind}_{m}_float16", f"custom_kernel_vq_{kind}_{m}_float16_v{i}")
    r = _gxx_metal(text, tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]


@GXX
def test_metal_shim_catches_cuda_names(tmp_path):
    """The shim compile fails on what would not compile for Metal (shown on deliberately broken bodies)."""
    good = metal_kernel_source("decode", "turboquant", 128, "float32")
    for bad in ("__syncwarp();", "const float f_q = __shfl_sync(0xffffffffu, 1.0f, 0);",
                "const float f_q = simd_shuffle_xor(1.0f);", "const double f_q = 1.0f;"):
        broken = good.replace("  const float f_sd = f_k[0];", f"  const float f_sd = f_k[0];\n  {bad}")
        assert broken != good
        r = _gxx_metal(broken, tmp_path)
        assert r.returncode != 0, bad


def metal_rule_violations(body: str) -> list[str]:
    """Metal rules the shim does not enforce: every pointer needs an address space (so the bodies declare no
    pointers or references and index the kernel parameters directly), threadgroup memory is declared at
    kernel scope only, no double or unsuffixed float literal, no CUDA names, no C++ features MSL lacks."""
    code = re.sub(r"//[^\n]*", "", body)
    code = re.sub(r"^[ \t]*#.*$", "", code, flags=re.M)      # preprocessor lines: parameter bindings
    # a pointer with its address space (the scopes' VQ_TG / VQ_DEV macros name one) is allowed
    code = re.sub(r"\b(?:VQ_TG|VQ_DEV|device|threadgroup|constant)\s+(?:const\s+)?\w+\s*\*", "", code)
    bad = []
    if re.search(r"\b(?:const\s+)?[A-Za-z_]\w*\s*[*&]\s*[A-Za-z_]\w*\s*=", code):
        bad.append("pointer or reference declaration (Metal pointers need an address space)")
    depth = 0
    for tok in re.finditer(r"[{}]|SHARED\(", code):
        if tok.group() == "{":
            depth += 1
        elif tok.group() == "}":
            depth -= 1
        elif depth:
            bad.append("SHARED inside a block (Metal: threadgroup memory at kernel scope only)")
    if re.search(r"\bdouble\b|\blong\s+long\b", code):
        bad.append("double / long long")
    if re.search(r"(?<![\w.])(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])", code):
        bad.append("float literal without the f suffix (a double)")
    for pat in (r"\b__\w+", r"\b(?:threadIdx|blockIdx|blockDim|gridDim|atomic\w*|printf|assert|malloc)\b",
                r"\b(?:new|delete|goto|throw|try|virtual|thread_local|static)\b", r"\[\s*[&=]\s*\]"):
        for m in re.finditer(pat, code):
            bad.append(f"not in MSL / CUDA-only: {m.group()}")
    return bad


@pytest.mark.parametrize("kind", ["encode", "decode"])
def test_bodies_follow_metal_rules(kind):
    assert metal_rule_violations(source.BODIES[kind]) == []


def test_metal_rule_lint_catches():
    assert metal_rule_violations("const float* f_p = f_c1;")
    assert metal_rule_violations("VQ_TG float* f_p = f_c1;") == []       # with an address space
    assert metal_rule_violations("if (x) {\n  SHARED(float, f_t, 4);\n}")
    assert metal_rule_violations("const float f_a = 1.5;")
    assert metal_rule_violations("__syncthreads();")
    assert metal_rule_violations("static int k = 0;")
    assert metal_rule_violations("SHARED(float, f_t, 4);\nconst float f_a = 1.5f;") == []


@NVCC
def test_committed_resources_are_current():
    """docs/bench/kernel-resources-sm90.json (rendered into docs/benchmarks.md) matches the kernels as they
    are; regenerate with its `command` after changing a body (skipped for another nvcc version)."""
    import json
    path = pathlib.Path(__file__).resolve().parent.parent / "docs" / "bench" / "kernel-resources-sm90.json"
    info = json.loads(path.read_text())
    nv = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    if not nv or nv[-1] != info["nvcc"]:
        pytest.skip(f"nvcc {nv[-1] if nv else '?'} differs from the one that wrote the file ({info['nvcc']})")
    keys = ("kind", "method", "registers", "smem_bytes", "spill_stores", "encode_moved", "decode_moved")
    now = [{k: r.get(k) for k in keys} for r in kr.report()]
    assert now == [{k: r.get(k) for k in keys} for r in info["rows"]], f"stale: rerun `{info['command']}`"
