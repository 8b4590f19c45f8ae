"""csrc/partial_setup_mixed.h's token ranges of a MIXED partial (not ragged), compiled alone with g++ over many launch
shapes: every split's tokens (split S - 1's skipping VQ_XG from VQ_XA on, as tc_mixed_split.h maps them) cover the
row's tokens lo0 .. WQ - 1 once each, split S - 1 keeps the rows the append encodes (its skip VQ_XG found again from
its t1 after the loop, VQ_XGOF), and the scalar splits' count is
`split_count` below: tuning's tc_mixed_splits at most, as many as balance a scalar token costed tc_mixed_cost
tensor-core tokens against the tensor-core splits (tc_mixed_cost 0: tc_mixed_splits each time)."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from veloxquant.accelerated.kernels import loader

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: the header is not compiled")

CSRC = pathlib.Path(loader.__file__).parent / "csrc"
# one launch per input line: S Q RK RV KTENC VTENC rstart; per split a line: s t0 t1 XA XG MS XGOF(t1)
HARNESS = r"""
#include <cstdio>
static inline int vq_min(int a, int b) { return a < b ? a : b; }
#define VQ_STARTS 1
#define VQ_KTENC ktenc
#define VQ_VTENC vtenc
int main() {
  int S, Q, RK, RV, ktenc, vtenc, r0;
  while (std::scanf("%d %d %d %d %d %d %d", &S, &Q, &RK, &RV, &ktenc, &vtenc, &r0) == 7) {
    const int rstart[1] = {r0};
    const int b = 0;
    const int R = RK > RV ? RK : RV;
    const int QK = Q + R - RK, QV = Q + R - RV;
    const int WQ = Q + R - vq_min(RK, RV);
    const int QLO = vq_min(QK - VQ_KTENC, QV - VQ_VTENC);
    for (int s = 0; s < S; ++s) {
      const bool is_win = false;
      int t0 = 0, t1 = 0;
#include "partial_setup_mixed.h"
      std::printf("%d %d %d %d %d %d %d\n", s, t0, t1, (int)(VQ_XA), (int)(VQ_XG), (int)(VQ_MS), (int)(VQ_XGOF(t1)));
    }
  }
}
"""


def split_count(enc: int, scalar: int, splits: int, most: int, cost: int) -> int:
    """The scalar splits of a launch of `splits` splits: `enc` tokens for the tensor-core splits, `scalar` shared by
    the scalar ones (VQ_MB - VQ_XA); at most `most` (tc_mixed_splits) and splits - 1; with `cost` (tc_mixed_cost) the
    fewest from which a tensor-core split's tokens are no fewer than `cost` times a scalar split's, rounded up."""
    n = max(1, min(most, splits - 1))
    if cost == 0:
        return n
    rx = cost * scalar
    return max(1, min(n, (rx * splits + enc + rx - 1) // max(1, enc + rx)))


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """Compile the header for (tc_mixed_splits, tc_mixed_cost): a callable from launches to per-split rows."""
    made = {}

    def run(most: int, cost: int, launches: list) -> np.ndarray:
        if (most, cost) not in made:
            d = tmp_path_factory.mktemp(f"mix{most}c{cost}")
            (d / "h.cpp").write_text(HARNESS)
            exe = d / "h"
            subprocess.run(["g++", "-O1", f"-DVQ_MIXS={most}", f"-DVQ_MIXR={cost}", "-I", str(CSRC), "-o", str(exe),
                            str(d / "h.cpp")], check=True, capture_output=True)
            made[most, cost] = exe
        text = "".join(" ".join(map(str, x)) + "\n" for x in launches)
        out = subprocess.run([str(made[most, cost])], input=text, capture_output=True, text=True, check=True).stdout
        return np.array([list(map(int, line.split())) for line in out.splitlines()])
    return run


def _launches(seed: int, n: int) -> list:
    """Launch shapes like a MIXED decode step's: S 2-40 splits, Q encoded, each role's window 0-160 rows with 0 or 1
    token (or a KIVI group of 32) encoded by the append, a row start anywhere up to Q."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        q = int(rng.choice([0, 5, 200, 4000, 33000, 131000]) + rng.integers(0, 300))
        rk, rv = (int(x) for x in rng.integers(0, 161, size=2) * rng.integers(0, 2, size=2))
        kt, vt = int(rng.choice([0, 1, 32])), int(rng.choice([0, 1, 32]))
        kt, vt = min(kt, q + max(rk, rv) - rk), min(vt, q + max(rk, rv) - rv)
        out.append((int(rng.integers(2, 41)), q, rk, rv, kt, vt, int(rng.integers(0, q + 1))))
    return out


@pytest.mark.parametrize("most, cost", [(1, 0), (4, 0), (64, 0), (4, 16), (8, 1), (4, 1000)])
def test_splits_cover_the_row_once_and_count_as_split_count(harness, most, cost):
    launches = _launches(most * 1000 + cost, 400)
    rows = harness(most, cost, launches)
    at = 0
    for (S, Q, RK, RV, kt, vt, r0) in launches:
        got = rows[at:at + S]
        at += S
        R = max(RK, RV)
        qk, qv, wq = Q + R - RK, Q + R - RV, Q + R - min(RK, RV)
        qlo = min(qk - kt, qv - vt)
        lo0 = min(r0, qlo)
        xa, xg, ms = got[0, 3], got[0, 4], got[0, 5]
        what = f"partial_setup_mixed.h (VQ_MIXS {most}, VQ_MIXR {cost}), S {S} Q {Q} RK {RK} RV {RV} append {kt}/{vt}"
        assert (got[:, 3:6] == (xa, xg, ms)).all(), f"{what}: the splits disagree on XA, XG, MS"
        xb = max(xa, qk - kt, qv - vt)      # (VQ_MB: up to where the scalar splits' tokens go)
        assert ms == split_count(qlo - lo0, xb - xa, S, most, cost), f"{what}: {ms} scalar splits"
        seen = []
        for s, t0, t1, *_ in got:
            if s == S - 1:      # (tc_mixed_split.h's VQ_MT_AT: index i, or i + XG from XA on)
                seen += [i if i < xa else i + xg for i in range(t0, t1)]
            else:
                seen += range(t0, t1)
        assert sorted(seen) == list(range(lo0, wq)), f"{what}: the splits' tokens are not lo0 .. WQ - 1 once each"
        last = got[S - 1]
        assert last[6] == xg, f"{what}: VQ_XGOF(t1) {last[6]}, VQ_XG {xg} (tc_mixed_split.h's skip after the loop)"
        own = set(range(qk - kt, qk)) | set(range(qv - vt, qv))
        assert own <= {i if i < xa else i + xg for i in range(last[1], last[2])}, \
            f"{what}: the rows the append encodes are not all split S - 1's"
