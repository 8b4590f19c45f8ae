"""accelerated.kernels' Python side on the CPU, with the CPU emulator of the kernel bodies standing in for
mx.fast.cuda_kernel (tests/_kernel_emulator.py): launch shapes, inputs, template constants, output shapes
and dtypes, the window, the fault flags (same ValueError and message as accelerated.ops, the same precedence;
recorded, not raised, inside numerics.deferred_checks()), encode_chunk's check range, and streams with
use_kernels=True, all against accelerated.ops bit for bit. What only a GPU can show (MLX's own launch, the
CUDA intrinsics) is tests/test_kernels_gpu.py's.
"""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import kernels, ops, tuning
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.kernels import source
from veloxquant.accelerated.ops import numerics, record
from veloxquant.accelerated.stream import Stream

from _faults import fault_inputs  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")


@pytest.fixture(scope="module")
def lib():
    import _kernel_emulator as ke
    return ke.build()


@pytest.fixture
def emu(lib, monkeypatch, tune):
    import _kernel_emulator as ke
    ke.install(monkeypatch, tune, lib)
    return lib


def _bits(a: mx.array) -> np.ndarray:
    n = np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)
    return n.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[n.itemsize]) if n.dtype.kind == "f" else n


def assert_same(got, want, what=""):
    if isinstance(want, dict):
        assert list(got) == list(want), (what, list(got), list(want))
        for k in want:
            assert_same(got[k], want[k], f"{what}.{k}")
        return
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    x = _bits(got) ^ _bits(want)
    assert not x.any(), f"{what}: {np.count_nonzero(x)} differ"


PARAMS = [("turboquant", dict(bits=4)), ("turboquant_rvq", dict(bits=2, bits2=3)), ("rabitq", {}),
          ("turboquant_prod", dict(bits=4)), ("kivi", dict(bits=3, group_size=16, role="k")),
          ("kivi", dict(bits=2, group_size=16, role="v")), ("mlx_affine", dict(bits=4, group_size=32))]
IDS = [f"{m}-{'-'.join(map(str, k.values()))}" for m, k in PARAMS]


def _x(shape, dtype=mx.float16, seed=0):
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(dtype)


@pytest.mark.parametrize("method,kw", PARAMS, ids=IDS)
@pytest.mark.parametrize("window", [0, 5, 40])
def test_one_shot_matches_ops(emu, method, kw, window):
    p = spec.Params(method, window=window, **kw)
    x = _x((2, 3, 37, 32), mx.bfloat16 if method == "mlx_affine" else mx.float16)
    want = ops.encode(x, p)
    got = kernels.encode(x, p)
    assert_same(got, want, "encode")
    assert_same(kernels.decode(want, p), ops.decode(want, p), "decode")


@pytest.mark.parametrize("method,kw", PARAMS, ids=IDS)
def test_faults_raise_like_ops(emu, method, kw):
    """NaN/Inf anywhere in x (window included) and the method's rule on encoded tokens: the same ValueError
    message as accelerated.ops, NaN/Inf first when both apply."""
    p = spec.Params(method, window=3, **kw)
    t = 35
    x = np.random.default_rng(1).standard_normal((1, 2, t, 32)).astype(np.float32)
    rule, both = fault_inputs(method, x)     # both: NaN in the window too
    nan_win = x.copy()
    nan_win[0, 1, t - 2, 0] = np.inf
    for arr in (rule, both, nan_win):
        with pytest.raises(ValueError) as want:
            ops.encode(mx.array(arr), p)
        with pytest.raises(ValueError) as got:
            kernels.encode(mx.array(arr), p)
        assert str(got.value) == str(want.value)


def test_deferred_faults_are_recorded_not_raised(emu):
    p = spec.Params("turboquant", window=2)
    x = np.random.default_rng(2).standard_normal((1, 2, 9, 32)).astype(np.float32)
    x[0, 0, 3] = 3e38                      # norm overflow in an encoded token
    x[0, 1, 8, 0] = np.nan                 # NaN in a window token
    with numerics.deferred_checks() as pending:
        rec = kernels.encode(mx.array(x), p)
    assert [m for *_, m in pending] == [km.NONFINITE, km.RULES["turboquant"]]
    assert numerics.first_fault(pending) == km.NONFINITE
    assert set(rec) == set(record.field_names(p.resolved()))
    x[0, 1, 8, 0] = 0.0
    with numerics.deferred_checks() as pending:
        kernels.encode(mx.array(x), p)
    assert numerics.first_fault(pending) == km.RULES["turboquant"]
    x[0, 0, 3] = 1.0
    with numerics.deferred_checks() as pending:
        kernels.encode(mx.array(x), p)
    assert numerics.first_fault(pending) is None


@pytest.mark.parametrize("method,kw", PARAMS, ids=IDS)
def test_encode_chunk_checks_the_chunk(emu, method, kw):
    """encode_chunk(w ++ c, q, check_from=len(w)): encodes tokens 0..q-1 like ops.encode_tokens and rejects
    NaN/Inf in tokens 0..q-1 and len(w)..T-1 only (older window tokens were checked when they came)."""
    p = spec.Params(method, **kw).resolved()
    g = p.group_size if method == "kivi" else 1
    t, q, lo = 4 * g + 3, 2 * g, 3 * g
    x = _x((1, 2, t, 32), seed=3)
    km_ = kernels.method_module(method)
    got = km_.encode_chunk(x, p, q, lo, x.dtype)
    want = ops.method_module(method).encode_tokens(numerics.upcast(x[:, :, :q]), p, x.dtype)
    assert_same(got, want, "fields")
    assert_same(record.encode_chunk(ops.method_module(method), x, p, q, lo, x.dtype), want, "ops encode_chunk")
    for tok, rejected in [(0, True), (q - 1, True), (q, False), (lo - 1, False), (lo, True), (t - 1, True)]:
        bad = np.array(x.astype(mx.float32))
        bad[0, 1, tok, 7] = np.nan
        for impl in (km_, ops.method_module(method)):
            if rejected:
                with pytest.raises(ValueError, match="NaN or Inf"):
                    record.encode_chunk(impl, mx.array(bad).astype(x.dtype), p, q, lo, x.dtype)
            else:
                record.encode_chunk(impl, mx.array(bad).astype(x.dtype), p, q, lo, x.dtype)
    # q = 0: only the check runs; the fields are empty with the record's shapes and dtypes
    empty = km_.encode_chunk(x, p, 0, lo, x.dtype)
    want0 = record.encode_chunk(ops.method_module(method), x, p, 0, lo, x.dtype)
    assert_same(empty, want0, "q = 0")


@pytest.mark.parametrize("method,kw", PARAMS, ids=IDS)
def test_stream_through_kernels(emu, method, kw):
    """Chunked appends (one token at a time too, as a decode step) and trims with use_kernels=True store the
    bytes of accelerated.ops's stream."""
    p = spec.Params(method, window=4, **kw)
    x = _x((1, 2, 60, 32), seed=4)
    a, b = Stream(p, use_kernels=True), Stream(p, use_kernels=False)
    assert isinstance(a._method, km.KernelMethod)
    for lo, hi in [(0, 1), (1, 20), (20, 21), (21, 22), (22, 50), ("trim", 7), (50, 60)]:
        if lo == "trim":
            assert a.trim(hi) == b.trim(hi)
            continue
        a.append(x[:, :, lo:hi])
        b.append(x[:, :, lo:hi])
    assert_same(a.record(), b.record(), "record")
    assert_same(a.dequantized(), b.dequantized(), "dequantized")


def test_launch_shape():
    assert km.launch_shape(8, 128)[2] == 1 and km.launch_shape(8, 128)[1] == (256, 1, 1)   # decode step: 1 group
    grid, tg, groups = km.launch_shape(1 << 20, 128)
    assert tg == (tuning.current().big_warps * 32, 1, 1) and groups == tuning.current().block_cap and grid[0] == groups * tg[0]
    assert km.launch_shape(100, 1024)[1][0] // 32 * 2 * 1024 <= 8192                    # code staging fits
    with pytest.raises(NotImplementedError):
        km.launch_shape(0, 128)


def test_launch_fits_the_register_file_at_every_head_dim():
    """No threadgroup methods.launch_shape makes can ask for more registers than a CUDA block has, whatever
    ptxas assigns (up to 255 per thread): at d = 80 / 96 a 32-warp block did not launch on the H200."""
    for d in spec.HEAD_DIMS:
        for rows in (1, 8, 9, 26, 32, 40, 64, 1000, 1 << 20):
            _, tg, _ = km.launch_shape(rows, d)
            assert tg[0] * source.MAX_REGISTERS <= source.REGISTER_FILE, \
                f"launch_shape({rows}, {d}): {tg[0]} threads x {source.MAX_REGISTERS} registers"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: ptxas register counts unavailable")
@pytest.mark.parametrize("d", [80, 96, 1024])
def test_launch_fits_ptxas_registers(d):
    """The same with the registers ptxas gives the kernels (sm_90): the largest threadgroup launch_shape makes
    for d, times the registers (allocated in units of 8 per thread), fits 64K."""
    from veloxquant.tools.dev import kernel_resources as kr
    threads = max(km.launch_shape(rows, d)[1][0] for rows in range(1, 65))
    for r in kr.report(d):
        regs = -(-r["registers"] // 8) * 8
        assert threads * regs <= source.REGISTER_FILE, \
            f"{r['kind']} {r['method']} d={d}: {threads} threads x {regs} registers > {source.REGISTER_FILE}"


def test_tables_sorted_guard():
    with pytest.raises(RuntimeError, match="sorted"):
        km._sorted(mx.array([0.0, -1.0, 2.0]))
    for bits in (1, 2, 3, 4):
        km._tables_for("turboquant", bits, 1, 128)   # the real tables pass
