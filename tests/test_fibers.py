"""tests/_fibers.py, the emulators' GPU threads as fibers: a barrier orders every member's writes before any member's
reads after it, a missing one shows the same way on every run in either resume order, warps meet only their own
lanes, and a barrier that cannot complete or a stack overflow stops the process with a message."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import _kernel_emulator as ke
from _fibers import FIBERS

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

TEXT = FIBERS + r"""
static int vq_tid;
// each thread writes its slot, (barrier), then reads its right neighbour's; warp: the same inside each warp of 32
extern "C" void neighbours(int nt, int barrier, int warp, int reverse, int32_t* slots, int32_t* out) {
  vq_fiber_reverse = reverse;
  vq_fiber_vars({&vq_tid});
  VqBarrier all(0, nt);
  std::vector<VqBarrier> warps;
  for (int w = 0; w < nt / 32; ++w) warps.emplace_back(32 * w, 32);
  auto thread = [&](int i) {
    vq_tid = i;
    slots[vq_tid] = vq_tid + 1;
    if (barrier) (warp ? warps[vq_tid / 32] : all).arrive_and_wait();
    out[vq_tid] = slots[warp ? (vq_tid & ~31) | ((vq_tid + 1) & 31) : (vq_tid + 1) % nt];
  };
  vq_fibers_run(nt, thread);
}
// thread 1 writes a local array bigger than its stack (thread 0, below it, has finished by then)
extern "C" void overflow() {
  auto thread = [&](int i) {
    if (i == 1) { volatile char big[VQ_FIBER_STACK + 4096]; for (size_t k = 0; k < sizeof big; ++k) big[k] = 1; }
  };
  vq_fibers_run(2, thread);
}
// thread 0 skips the barrier the others wait at
extern "C" void deadlock() {
  VqBarrier all(0, 64);
  auto thread = [&](int i) { if (i != 0) all.arrive_and_wait(); };
  vq_fibers_run(64, thread);
}
"""


def _lib() -> ctypes.CDLL:
    d = Path(tempfile.gettempdir()) / "vq_fibers"
    d.mkdir(exist_ok=True)
    return ke.compile_library(TEXT, prefix="fibers", folder=d, flags=("-std=c++20", "-O1"))


def _neighbours(nt: int, barrier: bool, warp: bool, reverse: bool) -> np.ndarray:
    slots = np.zeros(nt, np.int32)
    out = np.full(nt, -1, np.int32)
    _lib().neighbours(nt, int(barrier), int(warp), int(reverse), slots.ctypes.data_as(ctypes.c_void_p),
                      out.ctypes.data_as(ctypes.c_void_p))
    return out


@pytest.mark.parametrize("warp", [False, True], ids=["threadgroup", "warp"])
@pytest.mark.parametrize("reverse", [False, True], ids=["lane-order", "reversed"])
def test_barrier_orders_writes_before_reads_and_a_missing_one_shows(warp, reverse):
    nt = 96
    t = np.arange(nt)
    right = (t & ~31) | ((t + 1) & 31) if warp else (t + 1) % nt
    np.testing.assert_array_equal(_neighbours(nt, True, warp, reverse), right + 1)
    for _ in range(2):      # without it some thread reads a slot not yet written (0), on every run alike
        got = _neighbours(nt, False, warp, reverse)
        assert (got == 0).any() and (got == _neighbours(nt, False, warp, reverse)).all()


@pytest.mark.parametrize("call, message", [("deadlock", "deadlock, 63 of 64 threads wait"),
                                           ("overflow", "thread 1 overflowed its")], ids=["deadlock", "overflow"])
def test_a_launch_that_cannot_finish_stops_with_a_message(call, message):
    """A barrier that cannot complete (the std::barrier version hung) and a stack overflow (else a neighbour's
    stack is overwritten) abort the process with a message."""
    code = f"import ctypes; ctypes.CDLL({_lib()._name!r}).{call}()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]
