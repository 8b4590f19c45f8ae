"""accelerated.kernels.source on the CPU: one body per kernel shared by CUDA and Metal, every float operation
through the exact-arithmetic helpers (a lint of the body), the preludes' helpers are the correctly rounded
non-contractible ones, and (where nvcc is installed) the CUDA source compiles to PTX with only .rn float ops
and no fma (spec/number-model.md: no contraction, correctly rounded division and square root)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from accelerated.kernels import source

FLOAT_HELPERS = ("ADD", "SUB", "MUL", "DIV", "SQRT", "NEG", "ABS", "TO_F32")


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
    for helper in ("ADD", "MUL"):
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
        # the prelude is only macros: no code of its own
        assert all(not ln.strip() or ln.startswith("#define ") for ln in prelude.splitlines())
        # every helper the body uses is defined by the prelude
        for h in FLOAT_HELPERS + ("TID", "TOKEN", "HEAD", "BATCH", "NTOK", "NHEAD", "SHARED", "BARRIER"):
            assert re.search(rf"^#define {h}\b", prelude, re.M), (backend, h)


def test_prelude_helpers_are_exact():
    cuda = source.CUDA_PRELUDE
    for h, intrinsic in [("ADD", "__fadd_rn"), ("SUB", "__fsub_rn"), ("MUL", "__fmul_rn"),
                         ("DIV", "__fdiv_rn"), ("SQRT", "__fsqrt_rn")]:
        assert re.search(rf"^#define {h}\(.*\) {intrinsic}\(", cuda, re.M), h
    assert "rsqrt" not in cuda and "__frcp" not in cuda
    metal_h, metal_p = source.METAL_HEADER, source.METAL_PRELUDE
    assert "#pragma clang fp contract(off)" in metal_h
    assert "metal::precise::divide" in metal_h and "metal::precise::sqrt" in metal_h
    assert "fast::" not in metal_h and "rsqrt" not in metal_h
    for h, fn in [("ADD", "vq_add"), ("SUB", "vq_sub"), ("MUL", "vq_mul"), ("DIV", "vq_div"), ("SQRT", "vq_sqrt")]:
        assert re.search(rf"^#define {h}\(.*\) {fn}\(", metal_p, re.M), h


def test_metal_indices_are_attributes_mlx_declares():
    # MLX adds a Metal attribute parameter only if its name occurs in the source; the prelude is in the source
    _, src = source.assemble("encode", "metal")
    for attr in ("thread_position_in_threadgroup", "threadgroup_position_in_grid", "threadgroups_per_grid"):
        assert attr in src


def _mlx_like_cuda(kind: str, m: int, xt: str = "float") -> str:
    """The kernel as mx.fast.cuda_kernel generates it (signature, constexpr M, then the source)."""
    _, src = source.assemble(kind, "cuda")
    if kind == "encode":
        params = (f"const {xt}* x, const __grid_constant__ Strides x_strides, "
                  + ", ".join(f"const {'int32_t' if n == 'meta' else 'float'}* {n}" for n in source.ENCODE_INPUTS[1:])
                  + ", uint32_t* codes1, uint32_t* codes2, float* f_norm, float* f_aux")
    else:
        params = ", ".join(f"const {'uint32_t' if n.startswith('codes') else 'int32_t' if n == 'meta' else 'float'}* {n}"
                           for n in source.DECODE_INPUTS) + ", float* f_out"
    name = f"{kind}_{m}_{xt.strip('_')}"
    return f"__global__ void {name}({params}) {{\n  constexpr int M = {m};\n{src}\n}}\n"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
def test_cuda_source_compiles_without_fma(tmp_path):
    text = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda/std/array>\n#include <cstdint>\n"
            "namespace mlx::core::cu {\nusing Strides = cuda::std::array<int64_t, 10>;\n")
    for m in range(4):
        for xt in ("float", "__half", "__nv_bfloat16"):
            text += _mlx_like_cuda("encode", m, xt)
        text += _mlx_like_cuda("decode", m)
    text += "}\n"
    cu = tmp_path / "k.cu"
    cu.write_text(text)
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-ptx", str(cu), "-o", str(tmp_path / "k.ptx")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    ptx = (tmp_path / "k.ptx").read_text()
    ops = re.findall(r"^\s*(fma|add|sub|mul|div|sqrt|rsqrt|rcp)\.([a-z0-9.]+)", ptx, re.M)
    float_ops = {f"{op}.{mod}" for op, mod in ops if mod.endswith("f32")}
    assert float_ops, "no float ops found in the PTX"
    assert all(".rn." in f".{fo}." for fo in float_ops), float_ops     # explicit RNE: ptxas may not fuse
    assert not any(fo.startswith(("fma", "rsqrt", "rcp")) for fo in float_ops), float_ops
