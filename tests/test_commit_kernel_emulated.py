"""accelerated.kernels.commit's body on the CPU (C++20 fibers as in tests/test_attention_kernels_emulated.py):
the in-place store of an append's rows into strided buffer views (old rows into a grown buffer, new rows
after them) and the deferred checks, against numpy. The GPU side (in-place writes ordered by the token)
runs in tests/test_attention_packed.py on a GPU."""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from veloxquant.accelerated.kernels import commit

import test_attention_kernels_emulated as emu   # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

PRELUDE = """
#define TID vq_tid
#define GROUP_X vq_bx
#define GROUP_Y vq_by
#define NGROUPS_X vq_nx
#define SHARED(type, name, n) static type name[n]
#define BARRIER() vq_bar->arrive_and_wait()
#define MUT(type, p) const_cast<type*>(p)
using std::isfinite;
"""


def _run(writes, checks):
    """writes: [(dst view, src)], checks: [(kind, array)] (numpy); returns the flags (n, ncol)."""
    wsig = tuple(("uint32_t" if d.dtype == np.uint32 else "float", d.ndim) for d, _ in writes)
    csig = tuple((k, a.ndim) for k, a in checks)
    names = [n for i in range(len(writes)) for n in (f"w{i}d", f"w{i}s")] + [f"c{i}" for i in range(len(checks))]
    types = {f"w{i}{r}": t for i, (t, _) in enumerate(wsig) for r in "ds"}
    types.update({f"c{i}": {np.float16: "_Float16", np.float32: "float", np.uint32: "uint32_t"}[a.dtype.type]
                  for i, (_, a) in enumerate(checks)})
    params = ", ".join(f"const {types[n]}* {n}, Arr {n}_shape, Arr {n}_strides" for n in names)
    args = ", ".join(f"(const {types[n]}*)ptr[{i}], arr(sh, {i}), arr(st, {i})" for i, n in enumerate(names))
    text = (emu.HEADER.replace("@HELPERS@", "") + PRELUDE
            + "static Arr arr(const int64_t* a, int i) { Arr r; for (int k = 0; k < 10; ++k) r[k] = a[i * 10 + k]; return r; }\n"
            + f"static void thread_fn(int vq_thread, {params}, uint32_t* out) {{\n  vq_tid = vq_thread;\n"
            + commit.body(wsig, csig) + "\n}\n"
            + "extern \"C\" void run(void** ptr, const int64_t* sh, const int64_t* st, uint32_t* out, int gx, int gy) {\n"
            + f"  vq_run({commit.NT}, gx, gy, 1, [&](int i) {{ thread_fn(i, {args}, out); }});\n}}\n")
    lib = emu._compile(text)
    arrays = [a for d, s in writes for a in (d, s)] + [a for _, a in checks]
    ptrs, sh, st = emu._marshal(arrays)
    ncol = 3
    out = np.full((max(1, len(checks)), ncol), 7, np.uint32)
    lib.run(ptrs, sh.ctypes.data_as(ctypes.c_void_p), st.ctypes.data_as(ctypes.c_void_p),
            out.ctypes.data_as(ctypes.c_void_p), ncol, len(writes) + len(checks))
    return out


def test_commit_stores_rows_in_place_and_checks():
    rng = np.random.default_rng(0)
    old_codes = rng.integers(0, 2 ** 32, (1, 3, 40, 16), dtype=np.uint32)      # a full old buffer
    new_codes = np.zeros((1, 3, 256, 16), np.uint32)                            # the grown one
    rows = rng.integers(0, 2 ** 32, (1, 3, 2, 16), dtype=np.uint32)              # the appended rows
    norms_buf = np.zeros((1, 3, 256), np.float32)
    norms = rng.standard_normal((1, 3, 2)).astype(np.float32)
    x_bad = rng.standard_normal((1, 3, 2, 16)).astype(np.float16)
    x_bad[0, 2, 1, 5] = np.inf
    writes = [(new_codes[:, :, :40], old_codes), (new_codes[:, :, 40:42], rows), (norms_buf[:, :, 40:42], norms)]
    checks = [("nonfinite", rng.standard_normal((1, 3, 2, 16)).astype(np.float16)), ("nonfinite", x_bad),
              ("flag", np.array([0, 0, 0], np.uint32)), ("flag", np.array([0, 1], np.uint32))]
    out = _run(writes, checks)
    np.testing.assert_array_equal(new_codes[:, :, :40], old_codes)
    np.testing.assert_array_equal(new_codes[:, :, 40:42], rows)
    assert not new_codes[:, :, 42:].any()                                       # nothing past the rows
    np.testing.assert_array_equal(norms_buf[:, :, 40:42], norms)
    assert not norms_buf[:, :, :40].any() and not norms_buf[:, :, 42:].any()
    assert out.any(axis=1).tolist() == [False, True, False, True]


def test_commit_without_checks_writes_a_zero_token():
    dst = np.zeros((2, 2, 8, 4), np.uint32)
    src = np.arange(2 * 2 * 3 * 4, dtype=np.uint32).reshape(2, 2, 3, 4)
    out = _run([(dst[:, :, 5:8], src)], [])
    np.testing.assert_array_equal(dst[:, :, 5:8], src)
    assert out.shape == (1, 3) and not out.any()


def test_checks_only_is_the_fault_reduction():
    """accelerated.kernels.faults.flags is this kernel with nothing to store: one flag row per check."""
    a = np.zeros((2, 3, 4), np.float32)
    b = a.copy()
    b[1, 2, 3] = np.nan
    out = _run([], [("nonfinite", a), ("nonfinite", b), ("flag", np.array([0, 0], np.uint32))])
    assert out.any(axis=1).tolist() == [False, True, False]
