"""The fused-kernel path at the head dims of spec 1.1 that are not powers of two (d = m * 2^k, m > 1).

The kernel bodies implement the power-of-two butterfly and fold only, so `methods.launch_shape` refuses
these d and accelerated.kernels runs accelerated.ops for them. Checked with the CPU emulator standing in
for mx.fast.cuda_kernel (tests/_kernel_emulator.py): the kernel path's records and decode equal
accelerated.ops' bit for bit at every new d (whichever route it takes), and the refusal is there.
"""
from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

import spec
from accelerated import kernels, ops
from accelerated.kernels import methods as kmethods

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

NEW_DIMS = [20, 80, 96, 192]
CASES = [("turboquant", dict(bits=4)), ("turboquant_rvq", dict(bits=2, bits2=3)), ("rabitq", dict()),
         ("turboquant_prod", dict(bits=3)), ("kivi", dict(bits=3, group_size=16)),
         ("mlx_affine", dict(bits=4, group_size=32))]


from test_kernels_glue import _bits as _u, emu, lib  # noqa: E402,F401  (the emulator standing in for the GPU)


@pytest.mark.parametrize("d", NEW_DIMS)
def test_launch_refused_at_new_head_dims(d):
    with pytest.raises(NotImplementedError, match="not a power of two"):
        kmethods.launch_shape(6, d)
    kmethods.launch_shape(6, 128)                 # control: powers of two launch


@pytest.mark.parametrize("d", NEW_DIMS)
@pytest.mark.parametrize("method,kw", CASES, ids=[c[0] for c in CASES])
def test_kernel_path_equals_ops_at_new_head_dims(emu, method, kw, d):
    if method in ("kivi", "mlx_affine") and d % kw["group_size"]:
        pytest.skip(f"group size {kw['group_size']} does not divide d = {d} (spec 1.1: G | d)")
    p = spec.Params(method, seed=7, layer=3, head_offset=5, role="v", **kw).resolved()
    x = mx.array(np.random.default_rng(d).standard_normal((1, 2, 32, d)).astype(np.float32)).astype(mx.float16)
    assert kernels.available()[0]                 # the emulator stands in for the GPU
    want = ops.encode(x, p)
    got = kernels.encode(x, p)
    for name in want:
        np.testing.assert_array_equal(_u(got[name]), _u(want[name]), err_msg=f"{method} d={d} {name}")
    np.testing.assert_array_equal(_u(kernels.decode(got, p)), _u(ops.decode(want, p)),
                                  err_msg=f"{method} d={d} decode")
