"""What the fused kernels cost per thread, without a GPU: the CUDA source of each kernel as MLX's
mx.fast.cuda_kernel assembles it (signature from the inputs, constexpr template constants, the body), compiled
offline with nvcc for sm_90 (the H200): registers, shared memory, spills (ptxas -v), and the PTX float
instructions (every one .rn, no fma / rcp / rsqrt: spec/number-model.md). Also the bytes each kernel moves
per row, for the bandwidth model in docs/benchmarks.md.

Usage: python -m veloxquant.tools.dev.kernel_resources [--d 128] [--json PATH]     (needs nvcc; prints a table)
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ...accelerated.kernels import source
from .._env import command_line

CUDA_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
# (method, bits, bits2, group) of the benchmark cases (benchmarks/test_kernels.py)
BENCH_CASES = [("turboquant", 4, 1, 0), ("turboquant_rvq", 2, 2, 0), ("turboquant_prod", 4, 1, 0),
               ("rabitq", 1, 1, 0), ("kivi", 4, 1, 32), ("mlx_affine", 4, 1, 64)]
PREAMBLE = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda/std/array>\n#include <cstdint>\n"
            "namespace mlx::core::cu {\nusing Shape = cuda::std::array<int32_t, 10>;\n"
            "using Strides = cuda::std::array<int64_t, 10>;\n}\n")


def side_type(method: str, xt: str) -> str:
    """TS (methods.py _side_dtype): float32 for the rotation family, float16 for kivi, x's for mlx_affine."""
    return "float32" if source.METHOD_IDS[method] <= 3 else "float16" if method == "kivi" else xt


# (B1, B2, GS, KR) template constants (methods.code_constants) of the benchmark cases, kivi as values
CODES = {"turboquant": (4, 1, 1, 0), "turboquant_rvq": (2, 2, 1, 0), "turboquant_prod": (3, 1, 1, 0),
         "rabitq": (1, 1, 1, 0), "kivi": (4, 1, 32, 0), "mlx_affine": (4, 1, 64, 0)}


def kernel_name(kind: str, method: str, d: int, xt: str, codes: tuple | None = None) -> str:
    tail = "" if codes is None else "_c" + "_".join(map(str, codes)).replace("-", "m")
    return f"vq_{kind}_{method}_d{d}_{xt}{tail}"


def code_lines(method: str, codes: tuple | None = None) -> str:
    """The constexpr lines of the code template constants, as MLX writes template arguments."""
    b1, b2, gs, kr = CODES[method] if codes is None else codes
    return f"  constexpr int B1 = {b1};\n  constexpr int B2 = {b2};\n  constexpr int GS = {gs};\n  constexpr int KR = {kr};\n"


def cuda_kernel(kind: str, method: str, d: int, xt: str = "float16", codes: tuple | None = None) -> str:
    """One kernel as MLX's cuda_kernel writes it (mlx/backend/cuda/custom_kernel.cpp build_kernel): inputs
    as `const T* name` (+ `name_shape` / `name_strides` where the source mentions them), outputs `T* name`,
    then `constexpr int M`, `constexpr int D`, `using TS`, the code constants (B1, B2, GS, KR: `codes`,
    default CODES[method]), then the body."""
    header, src = source.assemble(kind, "cuda")
    ts = CUDA_TYPES[side_type(method, xt)]
    if kind == "encode":
        types = {"x": CUDA_TYPES[xt], "sig": "uint32_t", "tau": "uint32_t", "meta": "int32_t"}
        outs = [("codes1", "uint32_t"), ("codes2", "uint32_t"), ("f_s1", ts), ("f_s2", ts), ("fault", "bool")]
        names = source.ENCODE_INPUTS
    else:
        types = {"codes1": "uint32_t", "codes2": "uint32_t", "f_s1": ts, "f_s2": ts, "sig": "uint32_t",
                 "tau": "uint32_t", "meta": "int32_t"}
        outs = [("f_out", "float")]
        names = source.DECODE_INPUTS
    params = []
    for n in names:
        params.append(f"const {types.get(n, 'float')}* {n}")
        if f"{n}_shape" in src:
            params.append(f"const __grid_constant__ Shape {n}_shape")
        if f"{n}_strides" in src:
            params.append(f"const __grid_constant__ Strides {n}_strides")
    params += [f"{t}* {n}" for n, t in outs]
    body = (f"  constexpr int M = {source.METHOD_IDS[method]};\n  constexpr int D = {d};\n  using TS = {ts};\n"
            + code_lines(method, codes) + src)
    return (f"namespace mlx::core::cu {{\n{header}\n__global__ void {kernel_name(kind, method, d, xt, codes)}("
            + ", ".join(params) + f") {{\n{body}\n}}\n}}\n")


def translation_unit(kernels: list[tuple]) -> str:
    """Several kernels (kind, method, d, xt[, codes]) in one .cu file; the shared header (vq_to) once."""
    text = PREAMBLE
    header = source.CUDA_HEADER
    for i, kernel in enumerate(kernels):
        k = cuda_kernel(*kernel)
        text += k if i == 0 else k.replace(header, "")
    return text


def nvcc(cu_text: str, out: str, arch: str = "sm_90", verbose: bool = False) -> subprocess.CompletedProcess:
    """nvcc -arch=sm_90 of the text to PTX (out='ptx') or to a cubin with ptxas -v (out='cubin')."""
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "k.cu"
        cu.write_text(cu_text)
        cmd = ["nvcc", f"-arch={arch}", "-std=c++17", f"-{out}", str(cu), "-o", str(Path(tmp) / f"k.{out}")]
        if verbose:
            cmd[1:1] = ["-Xptxas", "-v"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        r.artifact = (Path(tmp) / f"k.{out}").read_text() if out == "ptx" and r.returncode == 0 else None
        return r


_RES = re.compile(r"Compiling entry function '(\w+)'.*?Used (\d+) registers[^\n]*?(\d+) bytes smem", re.S)
_SPILL = re.compile(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                    r"(\d+) bytes spill loads", re.S)


def ptxas_resources(stderr: str) -> dict[str, dict]:
    """{mangled kernel name: registers, smem bytes, stack, spill stores, spill loads} from ptxas -v."""
    res: dict[str, dict] = {}
    for block in re.split(r"(?=ptxas info\s+: Compiling entry function)", stderr):
        m = re.search(r"Compiling entry function '(\w+)'", block)
        if not m:
            continue
        r = {"registers": int(re.search(r"Used (\d+) registers", block).group(1))}
        s = re.search(r"(\d+) bytes smem", block)
        r["smem_bytes"] = int(s.group(1)) if s else 0
        sp = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
        if sp:
            r.update(stack_bytes=int(sp.group(1)), spill_stores=int(sp.group(2)), spill_loads=int(sp.group(3)))
        res[m.group(1)] = r
    return res


def occupancy(registers: int, smem: int, threads: int = 256, regs_per_sm: int = 65536,
              smem_per_sm: int = 228 * 1024, max_threads: int = 2048, max_blocks: int = 32) -> float:
    """Fraction of an SM's 2048 thread slots an H100/H200 (sm_90) can keep resident for `threads`-thread
    blocks: the least of the register, shared-memory, thread and block limits (register allocation in
    units of 8 per thread, 256 per warp)."""
    regs = -(-registers // 8) * 8
    warps = threads // 32
    by_regs = regs_per_sm // (regs * 32 * warps) if regs else max_blocks
    by_smem = smem_per_sm // (smem + 1024) if smem else max_blocks   # 1 KB reserved per block
    blocks = min(by_regs, by_smem, max_threads // threads, max_blocks)
    return blocks * threads / max_threads


def row_bytes(method: str, d: int, bits: int, bits2: int, group: int, x_bytes: int = 2) -> dict:
    """Bytes one encode / decode moves per row (token) of head dim d, as docs/benchmarks.md counts them."""
    from ... import spec
    b1 = bits - 1 if method == "turboquant_prod" else 1 if method == "rabitq" else bits
    words = spec.words_per_row(d, b1)
    if method == "turboquant_rvq":
        words += spec.words_per_row(d, bits2)
    if method in ("turboquant_prod", "rabitq"):
        words += 0 if method == "rabitq" else spec.words_per_row(d, 1)
    side = {"turboquant": 4, "turboquant_rvq": 4, "rabitq": 8, "turboquant_prod": 8}.get(method)
    if side is None:   # kivi values (per token: d/G float16 pairs), mlx_affine (d/G pairs in the input dtype)
        side = 2 * (d // group) * (2 if method == "kivi" else x_bytes)
    rec = 4 * words + side
    return {"x": d * x_bytes, "record": rec, "decoded_f32": 4 * d,
            "encode_moved": d * x_bytes + rec, "decode_moved": rec + 4 * d}


def report(d: int = 128, xt: str = "float16") -> list[dict]:
    """ptxas resources of the benchmark cases' encode and decode kernels, with occupancy and bytes."""
    kernels = [(kind, m, d, xt) for m, *_ in BENCH_CASES for kind in ("encode", "decode")]
    r = nvcc(translation_unit(kernels), "cubin", verbose=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-4000:])
    res = ptxas_resources(r.stderr)
    rows = []
    for (kind, m, _, _), (_, bits, bits2, group) in zip(kernels, [c for c in BENCH_CASES for _ in (0, 1)]):
        name = next((k for k in res if kernel_name(kind, m, d, xt) in k), None)
        info = dict(res.get(name, {}))
        info.update(kind=kind, method=m, d=d, x=xt,
                    occupancy_256=occupancy(info.get("registers", 0), info.get("smem_bytes", 0)))
        info.update(row_bytes(m, d, bits, bits2, group))
        rows.append(info)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--x", default="float16", choices=list(CUDA_TYPES))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if shutil.which("nvcc") is None:
        print("nvcc not found", file=sys.stderr)
        return 2
    rows = report(a.d, a.x)
    cols = ["kind", "method", "registers", "smem_bytes", "spill_stores", "occupancy_256", "x", "record",
            "encode_moved", "decode_moved"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r.get(c, '')}" if not isinstance(r.get(c), float) else f"{r[c]:.2f}" for c in cols))
    if a.json:
        nv = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
        meta = {"schema": "veloxquant-kernel-resources/1",
                "command": command_line("python3 -m veloxquant.tools.dev.kernel_resources"),
                "nvcc": nv[-1] if nv else None, "arch": "sm_90", "block_threads": 256, "rows": rows}
        Path(a.json).write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
