"""The kernel bodies of accelerated.kernels.source run on the CPU (tests/_kernel_emulator.py: C++20, one thread
per GPU lane, emulated warp shuffles and votes), bit for bit against accelerated.ops, for all six methods.

This checks the part a GPU run cannot isolate: the bodies' arithmetic (op order, the spec's fold tree across
lanes, the butterfly across lanes and registers, binary-search quantization, the three packing paths, KIVI
and mlx_affine groups, ties, zero paths, subnormals, strides), the fault flags (NaN/Inf of checked tokens,
each method's rule, one slot per threadgroup) and the grid-stride row loop. The GPU-specific parts
(intrinsics, launch) are checked on a GPU by tests/test_kernels_gpu.py and tools/dev/kernel_check.py.
"""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import ops

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

DT = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    import _kernel_emulator as ke   # tests/ is on sys.path (rootdir conftest-less layout: pytest inserts it)
    return ke.Emulator(ke.build())


def _bits(a) -> np.ndarray:
    a = a if isinstance(a, np.ndarray) else (np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16
                                             else np.array(a))
    return a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.itemsize]) if a.dtype.kind == "f" else a


def assert_same(got, want, what):
    g, w = _bits(got), _bits(want)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    x = g ^ w
    assert not x.any(), f"{what}: {np.count_nonzero(x)} of {x.size} differ, XOR {np.unique(x)[:8]}"


def _inputs(rng, shape, dtype="float32", big=True) -> mx.array:
    b, h, q, d = shape
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, 0] = 0.0                                  # zero vector: n = 0, r = 0; KIVI/affine S = 0
    if q > 1:
        x[0, 0, 1] = np.where(np.arange(d) % 2, 1e-42, -0.0).astype(np.float32)  # subnormals, -0
    if q > 2:
        x[-1, -1, 2] *= np.float32(1e18 if dtype == "float32" and big else 1e3)   # large, still finite
    if q > 3:
        x[0, -1, 3] = np.round(x[0, -1, 3] * 4) / 4   # a coarse grid: ties for rint
    return mx.array(x).astype(DT[dtype])


CASES = ([("turboquant", dict(bits=b)) for b in (1, 2, 3, 4)]
         + [("turboquant_rvq", dict(bits=b, bits2=b2)) for b, b2 in ((1, 4), (2, 2), (3, 1), (4, 3))]
         + [("rabitq", dict())] + [("turboquant_prod", dict(bits=b)) for b in (2, 3, 4, 5)]
         + [("kivi", dict(bits=b, group_size=g, role=r)) for b, g, r in
            ((1, 16, "v"), (3, 16, "k"), (4, 32, "v"), (5, 32, "k"), (8, 16, "v"), (2, 64, "v"))]
         + [("mlx_affine", dict(bits=b, group_size=g)) for b, g in ((2, 32), (4, 64), (8, 32))])


def _ids(cases):
    return [f"{m}-{'-'.join(map(str, k.values()))}" for m, k in cases]


def _check(emu, method, kw, shape, dtype, seed, window=0):
    rng = np.random.default_rng(seed)
    p = spec.Params(method, seed=7, layer=3, head_offset=5, window=window,
                    **{"role": "v", **kw}).resolved()
    x = _inputs(rng, shape, dtype, big=method != "kivi")   # KIVI: float16 scales
    want = ops.method_module(method).encode(x, p, dtype)
    q = p.encoded_tokens(shape[2])
    got, fault = emu.encode(x, p, q, 0, DT[dtype])
    assert not fault.any(), "fault flags set on good input"
    for name, a in got.items():
        assert_same(a, want[name], f"encode {name}")
    fields = {n: v for n, v in want.items() if n != "window"}
    dec = emu.decode(fields, p, shape[3])
    dwant = ops.method_module(method).decode_tokens(fields, p, shape[3])
    assert_same(dec, dwant, "decode")


@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("method,kw", CASES, ids=_ids(CASES))
def test_emulated_body_matches_ops(emu, method, kw, d):
    if kw.get("group_size", 0) > d and not (method == "kivi" and kw.get("role") == "k"):
        pytest.skip("group larger than the head dim (spec: G <= d)")
    g = kw.get("group_size", 1) if method == "kivi" else 1
    _check(emu, method, kw, (2, 2, 2 * g if g > 1 else 5, d), "float32", d * 31 + len(kw))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("method,kw", [("turboquant", dict(bits=3)), ("turboquant_prod", dict(bits=4)),
                                       ("kivi", dict(bits=4, group_size=16, role="k")),
                                       ("kivi", dict(bits=2, group_size=32, role="v")),
                                       ("mlx_affine", dict(bits=4, group_size=32)),
                                       ("mlx_affine", dict(bits=2, group_size=64))])
def test_emulated_input_dtypes(emu, method, kw, dtype):
    """x upcast on load; mlx_affine's scales and biases rounded to the input dtype (float16, bfloat16)."""
    _check(emu, method, kw, (1, 3, 32 if method == "kivi" else 6, 64), dtype, 3, window=2)


def test_emulated_d32_single_slot(emu):
    """d = 32: one coordinate per lane (no in-register butterfly or fold stage)."""
    for method, kw in [("turboquant_rvq", dict(bits=2, bits2=3)), ("rabitq", {}),
                       ("mlx_affine", dict(bits=4, group_size=32)), ("kivi", dict(bits=3, group_size=16))]:
        _check(emu, method, kw, (1, 2, 32 if method == "kivi" else 4, 32), "float32", 11)


def test_emulated_gpu_launch_shape(emu):
    """The launch methods.py makes on a GPU (one threadgroup of up to 32 warps, or 8-warp groups), not
    only the small emulator default."""
    import _kernel_emulator as ke
    real = ke.Emulator(emu.lib, warps=None, groups=None)
    rng = np.random.default_rng(4)
    for method, kw, shape in [("turboquant", dict(bits=4), (1, 8, 1, 128)), ("turboquant_prod", dict(bits=3),
                              (1, 3, 13, 64)), ("kivi", dict(bits=2, group_size=16, role="k"), (1, 2, 48, 32))]:
        p = spec.Params(method, **kw).resolved()
        x = _inputs(rng, shape)
        want = ops.encode(x, p)
        got, fault = real.encode(x, p, p.encoded_tokens(shape[2]), 0)
        assert not fault.any()
        for name, a in got.items():
            assert_same(a, want[name], f"{method} {name}")


def test_emulated_strided_input(emu):
    """x read through its strides (a transposed view), as the encode kernel does for windows and views."""
    rng = np.random.default_rng(1)
    p = spec.Params("turboquant", bits=3).resolved()
    base = rng.standard_normal((2, 4, 3, 32)).astype(np.float32)     # (B, Q, H, d) in memory
    x = base.transpose(0, 2, 1, 3)                                    # (B, H, Q, d) view
    got, _ = emu.encode(x, p, 4, 0)
    want = ops.encode(mx.array(np.ascontiguousarray(x)), p)
    assert_same(got["codes"], want["codes"], "codes")
    assert_same(got["norm"], want["norm"], "norm")


# ---- fault flags -------------------------------------------------------------------------------------
def _flags(fault: np.ndarray) -> tuple[bool, bool]:
    return bool(fault[:, 0].any()), bool(fault[:, 1].any())


@pytest.mark.parametrize("method,kw", [("turboquant", {}), ("rabitq", {}), ("turboquant_prod", {}),
                                       ("turboquant_rvq", {}), ("kivi", dict(group_size=16, role="k")),
                                       ("kivi", dict(group_size=16, role="v")), ("mlx_affine", dict(group_size=32))])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_fault_nonfinite_anywhere(emu, method, kw, bad):
    """NaN/Inf sets the x flag wherever it sits among the tokens the launch checks: encoded tokens, and
    tokens check_from..T-1 that are not encoded (a chunk's unflushed tokens); not in tokens it skips."""
    p = spec.Params(method, **kw).resolved()
    g = p.group_size if method == "kivi" else 1
    b, h, t, d = 1, 2, 3 * g + 2, 32
    q = 2 * g                           # tokens 0..q-1 encoded, q..lo-1 skipped, lo..t-1 checked
    lo = q + g
    for tok, expect in [(0, True), (q - 1, True), (q, False), (lo - 1, False), (lo, True), (t - 1, True)]:
        x = np.random.default_rng(tok).standard_normal((b, h, t, d)).astype(np.float32)
        x[0, 1, tok, 5] = bad
        _, fault = emu.encode(x, p, q, lo)
        fx, _ = _flags(fault)
        assert fx == expect, (tok, fault)


def test_fault_rules(emu):
    """Each method's rule on encoded tokens only: norm overflow (finite values), KIVI's float16 overflow,
    mlx_affine's span overflow; a good input sets nothing."""
    big = np.float32(3e38)
    cases = [("turboquant", {}, lambda x: x.__setitem__((0, 0, 1), big)),
             ("turboquant_prod", dict(bits=3), lambda x: x.__setitem__((0, 0, 1), big)),
             ("kivi", dict(group_size=16, role="v"), lambda x: x.__setitem__((0, 0, 1, 3), 1e6)),
             ("kivi", dict(group_size=16, role="k"), lambda x: x.__setitem__((0, 0, 1, 3), -1e6)),
             ("mlx_affine", dict(group_size=32), lambda x: x.__setitem__((0, 0, 1, slice(0, 2)), [-big, big]))]
    for method, kw, poison in cases:
        p = spec.Params(method, **kw).resolved()
        t = 32 if method == "kivi" else 4
        x = np.random.default_rng(0).standard_normal((1, 2, t, 32)).astype(np.float32)
        _, fault = emu.encode(x, p, t, t)
        assert _flags(fault) == (False, False), method
        poison(x)
        _, fault = emu.encode(x, p, t, t)
        assert _flags(fault) == (False, True), (method, fault)
        # not encoded (only checked): the rule does not apply, the values are finite
        _, fault = emu.encode(x, p, 0, 0)
        assert _flags(fault) == (False, False), (method, fault)


def test_fault_one_slot_per_threadgroup(emu):
    """The flag lands in the slot of the threadgroup whose warp met the token (a contiguous chunk of
    rows per warp)."""
    import _kernel_emulator as ke
    e4 = ke.Emulator(emu.lib, warps=2, groups=4)
    p = spec.Params("turboquant").resolved()
    x = np.random.default_rng(0).standard_normal((1, 1, 16, 16)).astype(np.float32)
    x[0, 0, 13, 0] = np.nan            # 16 rows over 8 warps: row 13 is warp 6's -> threadgroup 3
    _, fault = e4.encode(x, p, 16, 16)
    assert fault[:, 0].tolist() == [False, False, False, True]
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 16)).astype(np.float32)
    x[0, 2, 4, 0] = np.nan             # 15 rows, 2 per warp: row 14 is warp 7's -> threadgroup 3
    _, fault = e4.encode(x, p, 5, 5)
    assert fault[:, 0].tolist() == [False, False, False, True]
