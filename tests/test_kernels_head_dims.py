"""The fused kernels at the head dims of spec 1.1 that are not powers of two (d = m * 2^k, m in 12, 20, 28):
the bodies compute stage B of H (H_m in encode, H_m^T in decode, rotation.md) and the block fold
(number-model.md). Checked on the CPU with the emulator of the bodies (tests/_kernel_emulator.py, built for
the dims below) standing in for mx.fast.cuda_kernel: the kernel path's records, decoded values, fault flags
and streams equal accelerated.ops's bit for bit, and the kernel itself ran (a spy on the launches: no fall
back to accelerated.ops). The last test builds deliberately broken bodies (stage B transposed, stage B
before stage A, the halving fold before the block fold) and shows that the same comparison fails on each.

Dims: 20 (20 * 1: one lane, stage A empty), 80 (20 * 4: 4 lanes, 20 slots), 96 (12 * 8), 112 (28 * 4),
160 (20 * 8: mlx_affine, whose G does not divide 80), 192 (12 * 16), 224 (28 * 8), 320 (20 * 16), 768
(12 * 64: all 32 lanes, two slots per block, the ballot and lane-group packing paths).
"""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import kernels, ops
from veloxquant.accelerated.kernels import backend, source
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.stream import Stream

from _faults import fault_inputs  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

NEW_DIMS = (20, 80, 96, 112, 160, 192, 224, 320, 768)
FULL_DIMS = (80, 96, 192, 320)          # every method x every input dtype; the other dims in float16
DT = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# every method in every input dtype; further bit widths (each packing path) in float16
CASES = [("turboquant", dict(bits=4)), ("turboquant_rvq", dict(bits=2, bits2=3)), ("rabitq", {}),
         ("turboquant_prod", dict(bits=3)), ("kivi", dict(bits=3, group_size=16, role="k")),
         ("kivi", dict(bits=2, group_size=16, role="v")), ("mlx_affine", dict(bits=4, group_size=32))]
MORE_BITS = [("turboquant", dict(bits=1)), ("turboquant_rvq", dict(bits=4, bits2=1)),
             ("turboquant_prod", dict(bits=5)), ("kivi", dict(bits=8, group_size=32, role="k")),
             ("kivi", dict(bits=5, group_size=16, role="v")), ("mlx_affine", dict(bits=8, group_size=32)),
             ("mlx_affine", dict(bits=2, group_size=64))]


def _ids(cases):
    return [f"{m}-{'-'.join(map(str, k.values()))}" for m, k in cases]


def _fits(method: str, kw: dict, d: int) -> bool:
    """Groups along d (kivi values, mlx_affine) need G | d (spec 1.1)."""
    along = method == "mlx_affine" or (method == "kivi" and kw.get("role") == "v")
    return not along or d % kw["group_size"] == 0


@pytest.fixture(scope="module")
def lib():
    import _kernel_emulator as ke
    return ke.build(dims=NEW_DIMS)


@pytest.fixture
def launches(lib, monkeypatch, tune):
    """The emulator stands in for the GPU; returns the list of (kind, method, D) of every kernel launch."""
    return _install(monkeypatch, tune, lib)


def _install(monkeypatch, tune, lib) -> list:
    import _kernel_emulator as ke
    ke.install(monkeypatch, tune, lib)
    ran = []
    fake = backend.kernel

    def spy(kind, method, dtype_name):
        k = fake(kind, method, dtype_name)

        def call(**kw):
            ran.append((kind, method, dict(kw["template"])["D"]))
            return k(**kw)
        return call
    monkeypatch.setattr(backend, "kernel", spy)
    return ran


def _bits(a) -> np.ndarray:
    n = a if isinstance(a, np.ndarray) else (np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16
                                             else np.array(a))
    return n.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[n.itemsize]) if n.dtype.kind == "f" else n


def assert_same(got, want, what):
    if isinstance(want, dict):
        assert list(got) == list(want), (what, list(got), list(want))
        for k in want:
            assert_same(got[k], want[k], f"{what}.{k}")
        return
    g, w = _bits(got), _bits(want)
    assert g.shape == w.shape and g.dtype == w.dtype, (what, g.shape, w.shape, g.dtype, w.dtype)
    x = g ^ w
    assert not x.any(), f"{what}: {np.count_nonzero(x)} of {x.size} differ, XOR {np.unique(x)[:8]}"


def _x(method, kw, d, dtype, seed, t=None):
    """Normal values with special tokens (as test_kernels_emulated's): a zero vector (n = 0; KIVI / affine
    S = 0), subnormals and -0, a large token (x 1e17 in float32: its norm stays finite at d = 1024; x 1e3
    otherwise and for KIVI, whose scales are float16), a coarse grid (ties for rint)."""
    g = kw["group_size"] if method == "kivi" else 1     # kivi encodes whole groups of tokens (both roles)
    t = t or (2 * g + 3 if g > 1 else 5)
    x = np.random.default_rng(seed).standard_normal((1, 2, t, d)).astype(np.float32)
    x[0, 0, 0] = 0.0
    x[0, 0, 1] = np.where(np.arange(d) % 2, 1e-42, -0.0).astype(np.float32)
    x[0, 1, 2] *= np.float32(1e17 if dtype == "float32" and method != "kivi" else 1e3)
    x[0, 1, 3] = np.round(x[0, 1, 3] * 4) / 4
    return mx.array(x).astype(DT[dtype])


def _check(launches, method, kw, d, dtype):
    p = spec.Params(method, seed=7, layer=3, head_offset=5, window=3, **{"role": "v", **kw}).resolved()
    x = _x(method, kw, d, dtype, seed=d)
    want = ops.encode(x, p)
    got = kernels.encode(x, p)
    assert ("encode", method, d) in launches, f"the encode kernel did not run at d = {d}: {launches}"
    assert_same(got, want, f"{method} d={d} {dtype} encode")
    launches.clear()
    assert_same(kernels.decode(want, p), ops.decode(want, p), f"{method} d={d} {dtype} decode")
    assert ("decode", method, d) in launches, f"the decode kernel did not run at d = {d}: {launches}"


DIM_DTYPES = [(d, dt) for d in FULL_DIMS for dt in DT] + [(d, "float16") for d in NEW_DIMS if d not in FULL_DIMS]


@pytest.mark.parametrize("d,dtype", DIM_DTYPES, ids=[f"d{d}-{dt}" for d, dt in DIM_DTYPES])
@pytest.mark.parametrize("method,kw", CASES, ids=_ids(CASES))
def test_kernels_equal_ops_at_new_head_dims(launches, method, kw, d, dtype):
    if not _fits(method, kw, d):
        pytest.skip(f"group size {kw['group_size']} does not divide d = {d} (spec 1.1: G | d)")
    _check(launches, method, kw, d, dtype)


@pytest.mark.parametrize("d", [20, 80, 768])   # one lane; four lanes; 32 lanes (the whole-word packing paths)
@pytest.mark.parametrize("method,kw", MORE_BITS, ids=_ids(MORE_BITS))
def test_more_bit_widths_at_new_head_dims(launches, method, kw, d):
    if not _fits(method, kw, d):
        pytest.skip(f"group size {kw['group_size']} does not divide d = {d} (spec 1.1: G | d)")
    _check(launches, method, kw, d, "float16")


@pytest.mark.parametrize("d", [80, 768])
def test_gpu_launch_shape_at_new_head_dims(lib, d):
    """The launch methods.py makes on a GPU (up to 32 warps in one threadgroup, or 8-warp groups over a
    grid-stride loop; each warp its own code staging region), not only the small emulator default."""
    import _kernel_emulator as ke
    real = ke.Emulator(lib, warps=None, groups=None)
    for method, kw, t in [("turboquant_prod", dict(bits=4), 13), ("turboquant", dict(bits=1), 20),
                          ("kivi", dict(bits=3, group_size=16, role="k"), 48)]:
        p = spec.Params(method, **kw).resolved()
        x = _x(method, kw, d, "float32", seed=d + t, t=t)
        want = ops.encode(x, p)
        assert km.launch_shape(2 * (t // (16 if method == "kivi" else 1)), d)[1][0] > 64   # > 2 warps
        got, fault = real.encode(x, p, p.encoded_tokens(t), 0)
        assert not fault.any()
        assert_same(got, {k: v for k, v in want.items() if k != "window"}, f"{method} d={d}")


@pytest.mark.parametrize("method,kw", [("turboquant", {}), ("turboquant_prod", dict(bits=3)),
                                       ("rabitq", {}), ("kivi", dict(group_size=16, role="v")),
                                       ("mlx_affine", dict(group_size=32))])
def test_faults_like_ops_at_new_head_dims(launches, method, kw):
    """NaN/Inf (in the window too) and the method's rule: the same ValueError as accelerated.ops."""
    d = 160
    p = spec.Params(method, window=3, **kw)
    t = 35 if method == "kivi" else 9                     # kivi: two whole groups encoded
    x = np.random.default_rng(1).standard_normal((1, 2, t, d)).astype(np.float32)
    rule, both = fault_inputs(method, x)               # both: NaN in the window too
    for arr in (rule, both):
        with pytest.raises(ValueError) as want:
            ops.encode(mx.array(arr), p)
        with pytest.raises(ValueError) as got:
            kernels.encode(mx.array(arr), p)
        assert str(got.value) == str(want.value)
    assert ("encode", method, d) in launches


@pytest.mark.parametrize("d", [80, 96])
@pytest.mark.parametrize("method,kw", CASES, ids=_ids(CASES))
def test_stream_through_kernels_at_new_head_dims(launches, method, kw, d):
    """Chunked appends (a decode step's one token too) and a trim store the bytes of accelerated.ops's stream."""
    if not _fits(method, kw, d):
        pytest.skip(f"group size {kw['group_size']} does not divide d = {d}")
    p = spec.Params(method, window=4, **kw)
    x = mx.array(np.random.default_rng(4).standard_normal((1, 2, 50, d)).astype(np.float32)).astype(mx.float16)
    a, b = Stream(p, use_kernels=True), Stream(p, use_kernels=False)
    for lo, hi in [(0, 1), (1, 20), (20, 21), (21, 40), ("trim", 7), (40, 50)]:
        if lo == "trim":
            assert a.trim(hi) == b.trim(hi)
            continue
        a.append(x[:, :, lo:hi])
        b.append(x[:, :, lo:hi])
    assert_same(a.record(), b.record(), "record")
    assert_same(a.dequantized(), b.dequantized(), "dequantized")
    assert any(k == "encode" and dd == d for k, _, dd in launches)


def test_launch_shape_every_spec_head_dim():
    """Every head dim of the spec launches; the per-warp code staging fits the threadgroup memory."""
    for d in spec.HEAD_DIMS:
        for rows in (1, 7, 1 << 20):
            grid, tg, groups = km.launch_shape(rows, d)
            assert grid[0] == groups * tg[0] and tg[0] // 32 * 2 * d <= source.SMEM_CODES


# ---- the checks above fail on deliberately broken bodies ------------------------------------------------
def _mutants() -> dict[str, dict[str, str]]:
    """Broken bodies: (1) stage B with H_m^T in encode and H_m in decode; (2) stage B before stage A (equal
    in exact arithmetic, not in binary32); (3) the block fold adding the blocks right to left. Each is a
    text edit of the real body (asserted to apply)."""
    from veloxquant.accelerated.kernels import loader
    enc, dec = source.ENCODE_BODY, source.DECODE_BODY
    # the bodies bind hadamard.h's rows to H_m (encode: VQ_H<m>) and H_m^T (decode: VQ_HT<m>)
    rows_h, rows_t = ("".join(f"#define VQ_HM{m} VQ_H{t}{m}\n" for m in (12, 20, 28)) for t in ("", "T"))
    assert rows_h != rows_t and rows_h in enc and rows_t in dec
    transposed = {"encode": enc.replace(rows_h, rows_t), "decode": dec.replace(rows_t, rows_h)}
    bf = loader.text("butterfly.h")      # spliced into both bodies wherever they include it
    bf = bf[:bf.index("#undef f_BF_ARR")]  # (the stages; then it consumes its parameter)
    cut = bf.index("    if (RM > 1) {")
    b_first = bf[cut:] + bf[:cut]
    assert bf in enc and bf in dec
    order = {"encode": enc.replace(bf, b_first), "decode": dec.replace(bf, b_first)}
    block = "    for (int k = 1; k < RM; ++k) {              // block fold (RM > 1): blocks added left to right\n"
    assert enc.count(block) == 3            # the norm, rabitq's sum of magnitudes, turboquant_prod's gamma
    fold_order = {"encode": enc.replace(block, "    for (int k = RM - 1; k >= 1; --k) {\n")}
    return {"stage-B-transposed": transposed, "stage-B-before-A": order, "block-fold-reversed": fold_order}


@pytest.mark.parametrize("mutant", ["stage-B-transposed", "stage-B-before-A", "block-fold-reversed"])
def test_checks_catch_broken_bodies(monkeypatch, tune, mutant):
    """_check fails for every rotation method on each broken body (d = 80: m = 20, whose H_20 is not
    symmetric, so a transposed stage B differs)."""
    import _kernel_emulator as ke
    ran = _install(monkeypatch, tune, ke.build(dims=(80,), bodies=_mutants()[mutant]))
    caught = []
    for method, kw in CASES[:4]:
        try:
            _check(ran, method, kw, 80, "float32")
        except AssertionError as e:
            caught.append(method)
            assert "differ" in str(e), e     # a bit difference, not a missing launch
    assert len(caught) == 4, f"{mutant}: only {caught} of the 4 rotation methods failed"
