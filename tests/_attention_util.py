"""Helpers shared by the attention tests: a packed record from accelerated.ops' one-shot encode, the
float64 attention oracle (GQA by repeating KV heads, optional causal mask; spec/attention.md), and a spy on the
kernels' launch plans and on the attention path taken, nvcc's ptxas report of a kernel text."""
from __future__ import annotations

import contextlib

import mlx.core as mx
import numpy as np

from veloxquant import spec
from veloxquant.accelerated import ops
from veloxquant.accelerated.ops import attention as oatt


def packed(x: mx.array, p: spec.Params) -> oatt.PackedRecord:
    rec = ops.encode(x, p)
    fields = {n: a for n, a in rec.items() if n != "window"}
    return oatt.PackedRecord(p, fields, rec["window"], x.shape[2] - rec["window"].shape[2],
                             ops.method_module(p.method).decode_tokens)


def f64_attention(q, k, v, scale, causal):
    rep = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), rep, 1)
    v = np.repeat(v.astype(np.float64), rep, 1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    if causal:
        lq, t = s.shape[-2:]
        s = np.where(np.arange(t)[None] <= (t - lq + np.arange(lq))[:, None], s, -np.inf)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def plan_keys(monkeypatch) -> list:
    """The keys of the launch plans accelerated.kernels.attention.launch_plan makes from now on, in order (a spy)."""
    from veloxquant.accelerated.kernels import attention as katt
    keys = []
    plan = katt.launch_plan

    def spy(*a, **kw):
        out = plan(*a, **kw)
        keys.append(out.key)
        return out
    monkeypatch.setattr(katt, "launch_plan", spy)
    return keys


@contextlib.contextmanager
def paths_taken():
    """The path accelerated.attention.path chooses at each call while open ("decoded", "ops", "kernels"), in order."""
    from veloxquant.accelerated import attention as attn
    seen, real = [], attn.path

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]
    attn.path = spy
    try:
        yield seen
    finally:
        attn.path = real


# MLX's CUDA JIT puts the fp16/bf16 types and its Shape / Strides before a kernel's header: a unit nvcc compiles alone
CUDA_UNIT_PRELUDE = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda/std/array>\n#include <cstdint>\n"
                     "namespace mlx::core::cu {\nusing Shape = cuda::std::array<int32_t, 10>;\n"
                     "using Strides = cuda::std::array<int64_t, 10>;\n}\n")


def resources(text: str, stem) -> dict:
    """{arch: (registers, stack frame bytes, spill store bytes, spill load bytes)} of the one kernel in `text`."""
    import re
    out = {}
    for arch, log in ptxas(text, stem).items():
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) "
                      r"registers", log, re.S)
        assert m, log[-2000:]
        out[arch] = (int(m.group(4)), int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return out


def ptxas(text: str, stem) -> dict:
    """{arch: ptxas' -v report} of the CUDA source `text` (written to stem.cu, the cubins beside it) compiled by nvcc
    for sm_80 and sm_90; a failed compile fails the test with its log's end."""
    import subprocess
    cu = stem.with_suffix(".cu")
    cu.write_text(text)
    out = {}
    for arch in ("sm_80", "sm_90"):
        r = subprocess.run(["nvcc", f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", "-cubin", str(cu), "-o",
                            str(stem.parent / f"{stem.name}_{arch}.cubin")], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-4000:]
        out[arch] = r.stderr
    return out
