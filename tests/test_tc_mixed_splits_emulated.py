"""tuning's tc_mixed_splits: a MIXED partial on a tensor-core loop (TC_MIX: turboquant keys beside KIVI values; TC_MIXK:
KIVI keys beside turboquant or rabitq values) shares the tokens where one role is exact and the other's records are
older than the launch (csrc/partial_setup_mixed.h: VQ_XA .. VQ_MB - 1, KIVI's window beside the other's records) among
its last splits in scalar arithmetic, instead of split S - 1 alone; split S - 1 keeps the rows the append inside
encodes. Emulated on the CPU against float64 within the tensor-core cases' bounds, with the append inside (blocks in
both orders: a split that read a row the append writes would see its poison); the GPU twins run the decode step
against the scalar loop (skipped without an sm_80+ CUDA GPU)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from veloxquant.accelerated import tuning
from veloxquant.accelerated.kernels import attention as katt
from test_attention_kernels_emulated import _REAL_MMA, emulate, tensor_cores  # noqa: F401
import test_tc_mixed_emulated as tm
import test_tc_mixkv_emulated as tk

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no CPU emulation")

src = katt.src
# (the cases' module, the case, the loop's knob, the loop): MIXED cases of both loops, HASWIN 2, 3 and 4, d 64 / 128
MIX = [(tm, c, "tc_mixed", src.TC_MIX) for c in tm.CASES if c[-1].startswith("mixed")][::2] + \
      [(tk, c, "tc_mixkv", src.TC_MIXK) for c in tk.CASES if c[-1] == "mixed"][::2]


def _id(m, c) -> str:
    return m._id(c)


@pytest.mark.parametrize("splits, cost", [(3, 0), (64, 0), (8, 1)], ids=["splits3", "splits64", "cost1"])
@pytest.mark.parametrize("m, c, knob, loop", MIX, ids=[_id(m, c) for m, c, *_ in MIX])
def test_mixed_splits_share_the_scalar_tokens_within_the_attention_budget(m, c, knob, loop, splits, cost, tensor_cores,
                                                                          tune):
    """tc_mixed_splits 3 and 64 each time (tc_mixed_cost 0; 64 is more than the launch's splits: all but split 0 take
    a share), and up to 8 as a scalar token costed as one tensor-core token balances them: the MIXED partial on its
    tensor-core loop within the bounds of turboquant b4's tensor-core cases, as with split S - 1 alone (the defaults'
    count in the loops' own suites)."""
    tune(tokens_per_split=64, tc_mixed_splits=splits, tc_mixed_cost=cost, **{knob: True})
    m._check(c, lambda q, k, v, scale, mask, mixed: emulate(q, k, v, scale, mask, mixed=mixed), **(
        {"loop": loop} if m is tk else {}))


def test_the_knob_names_its_own_kernel_text(tensor_cores, tune, monkeypatch):
    """The knobs' kernels have texts of their own (VQ_MIXS, VQ_MIXR in the header), only for the MIXED tensor-core
    loops, and names of their own where they are not the defaults': the scalar MIXED partial and the loops' other
    partials keep split S - 1 alone."""
    made = []
    real = katt.backend.cuda_kernel
    monkeypatch.setattr(katt.backend, "cuda_kernel", lambda **kw: made.append(kw) or real(**kw))
    monkeypatch.setattr(katt.backend, "backend", lambda: "cuda")
    katt._compiled.cache_clear()
    try:
        for tc, haswin in ((src.TC_MIX, 3), (src.TC_MIXK, 2), (src.TC_MIX, 4), (0, 3), (src.TC_MIX, 1)):
            for splits, cost in ((1, 16), (4, tuning.DEFAULT.tc_mixed_cost), (4, 0)):
                tune(tc_mixed_splits=splits, tc_mixed_cost=cost)
                katt._kernel("partial", 0 if tc != src.TC_MIXK else 4, 4 if tc != src.TC_MIXK else 0, haswin,
                             False, tc, 0, True)
    finally:
        katt._compiled.cache_clear()
    named = [(kw["name"].partition("_m")[2], "#define VQ_MIXS 4\n#define VQ_MIXR " in kw["header"]) for kw in made]
    # (the last two pairs' texts do not depend on the knobs: one compile each)
    assert named[:9] == [("1", False), ("", True), ("4c0", True)] * 3, [kw["name"] for kw in made]
    assert [n[1] for n in named[9:]] == [False, False], [kw["name"] for kw in made]


APPEND = [(tm, c, src.TC_MIX) for c in tm.APPEND_CASES[-5:]] + [(tk, c, src.TC_MIXK) for c in tk.APPEND_CASES[:8]]


@pytest.mark.parametrize("m, case, loop", APPEND, ids=[f"{'mix' if m is tm else 'mixk'}{i}"
                                                       for i, (m, *_) in enumerate(APPEND)])
def test_append_inside_with_mixed_splits(m, case, loop, monkeypatch, tune):
    """The fused decode step's MIXED launch with 4 scalar splits each time (tc_mixed_cost 0): split S - 1 encodes the
    rows (the per-token role's token, KIVI's group at a flush) and attends them; the other scalar splits only older records and windows, so the
    output is the same in both block orders, the rows bit for bit one-shot encode's, within the float64 bound."""
    tune(tc_mixed_splits=4, tc_mixed_cost=0, **({"tc_mixkv": True} if loop == src.TC_MIXK else {}))
    tm.appends_on_the_loop(case, monkeypatch, tune, loop, (4 if case[0][2] else 3) if m is tm else
                           (4 if case[1][2] else 2))


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("name, kw, knob, loop", [
    ("tq3-kivi2", dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2), "tc_mixed", src.TC_MIX),
    ("kivi4-tq4", dict(key_method="kivi", key_bits=4, value_method="turboquant", value_bits=4), "tc_mixkv",
     src.TC_MIXK)], ids=["tq3-kivi2", "kivi4-tq4"])
def test_mixed_splits_decode_steps_on_the_gpu_match_the_scalar_loop(monkeypatch, tune, name, kw, knob, loop):
    """With the knobs' defaults (up to 4 scalar splits, as many as tc_mixed_cost balances): 200 decode steps on the
    tensor-core loop against the scalar loop, stored bytes identical and outputs within the attention tolerance
    (test_tc_mixed_emulated.loops_match_on_the_gpu)."""
    d = tuning.DEFAULT
    tm.loops_match_on_the_gpu(monkeypatch, tune, name, kw, knob, loop, tc_mixed_splits=d.tc_mixed_splits,
                              tc_mixed_cost=d.tc_mixed_cost)
