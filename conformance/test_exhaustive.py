"""Exhaustive codebook test: every finite float16 bit pattern (63,488 values, +-0 and subnormals), plus
each scaled boundary and its binary32 neighbours (the ties), through quantize, and every index and every
quantize result through dequantize, for every codebook at every head dim, against the reference."""
from __future__ import annotations

import pytest

from .. import spec

from . import checks

CODEBOOKS = [("gaussian", b) for b in (1, 2, 3, 4)] + [("residual", b1, b2) for b1 in (1, 2, 3, 4)
                                                      for b2 in (1, 2, 3, 4)]


@pytest.mark.parametrize("d", spec.HEAD_DIMS)
@pytest.mark.parametrize("codebook", CODEBOOKS, ids=["-".join(map(str, c)) for c in CODEBOOKS])
def test_codebook(other, ref, tally, codebook, d, record_property):
    record_property("method", f"codebook:{codebook[0]}")
    record_property("bits", codebook[1] if len(codebook) == 2 else f"{codebook[1]}+{codebook[2]}")
    record_property("dtype", "float16-all")
    tally.case(checks.check_codebook(other, ref, codebook, d))
