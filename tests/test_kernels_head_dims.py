"""The fused-kernel path at the head dims of spec 1.1 that are not powers of two (d = m * 2^k, m > 1).

Where `accelerated.kernels` cannot compute a d bit-exactly it must route to accelerated.ops
(`methods._launch_shape` raising NotImplementedError does that). These tests run the shared kernel bodies
on the CPU (the C++ emulation of tests/test_kernels_emulated.py) and accept either outcome per d: the launch
is refused (ops fallback), or the body's bytes equal accelerated.ops'.

The bodies implement the power-of-two butterfly and fold only (stage A over all of d, halving from d/2:
at d = 96 a partner index would lie beyond d and the fold would drop values), so _launch_shape refuses
d that are not powers of two and accelerated.ops runs them; this test held as a strict xfail until then.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import spec
from accelerated import ops
from accelerated.kernels import methods as kmethods

emu = pytest.importorskip("test_kernels_emulated")   # the same emulation (same directory on sys.path)
lib = emu.lib                                          # its module-scoped fixture, reused
pytestmark = emu.pytestmark                            # skipped without g++, as that module

NEW_DIMS = [20, 80, 96, 192]
CASES = [("turboquant", dict(bits=4)), ("turboquant_rvq", dict(bits=2, bits2=3)), ("rabitq", dict()),
         ("turboquant_prod", dict(bits=3))]


def _exact(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("d", NEW_DIMS)
@pytest.mark.parametrize("method,kw", CASES, ids=[c[0] for c in CASES])
def test_kernel_path_exact_or_refused_at_new_head_dims(lib, method, kw, d):
    b, h, q = 1, 2, 3
    try:
        kmethods._launch_shape(b, h, q, d)
    except NotImplementedError:
        return                                  # refused: KernelMethod runs accelerated.ops (exact)
    p = spec.Params(method, seed=7, layer=3, head_offset=5, role="v", **kw).resolved()
    x = emu._inputs(np.random.default_rng(d), b, h, q, d)
    want = ops.method_module(method).encode(mx.array(x), p)
    got = emu.emulate_encode(lib, x, p)
    for name, a in got.items():
        assert _exact(a, np.array(want[name])), f"encode {name} at d = {d}"
    fields = {n: np.array(v) for n, v in want.items() if n != "window"}
    dec = emu.emulate_decode(lib, fields, p, d)
    assert _exact(dec, np.array(ops.method_module(method).decode(want, p))), f"decode at d = {d}"


def test_power_of_two_head_dims_stay_exact_in_the_emulation(lib):
    """Control: the same comparison passes at the v1.0 head dims (so the xfail above is about d, not the
    harness)."""
    for d in (16, 128):
        p = spec.Params("turboquant", bits=4, seed=7).resolved()
        x = emu._inputs(np.random.default_rng(d), 1, 2, 3, d)
        want = ops.encode(mx.array(x), p)
        got = emu.emulate_encode(lib, x, p)
        assert all(_exact(a, np.array(want[n])) for n, a in got.items())
