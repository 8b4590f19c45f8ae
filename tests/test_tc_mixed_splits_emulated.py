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


def _splits(monkeypatch, n: int) -> None:
    """The emulated partial compiled with VQ_MIXS n (what tc_mixed_splits puts in a CUDA launch's header)."""
    real = src.partial_body
    monkeypatch.setattr(src, "partial_body", lambda *a, **kw: f"#define VQ_MIXS {n}\n" + real(*a, **kw))


@pytest.mark.parametrize("splits", [3, 64], ids=["splits3", "splits64"])
@pytest.mark.parametrize("m, c, knob, loop", MIX, ids=[_id(m, c) for m, c, *_ in MIX])
def test_mixed_splits_share_the_scalar_tokens_within_the_attention_budget(m, c, knob, loop, splits, tensor_cores,
                                                                          tune, monkeypatch):
    """tc_mixed_splits 3 and 64 (more than the launch's splits: all but split 0 take a share): the MIXED partial on
    its tensor-core loop within the bounds of turboquant b4's tensor-core cases, as with split S - 1 alone."""
    tune(tokens_per_split=64, **{knob: True})
    _splits(monkeypatch, splits)
    m._check(c, lambda q, k, v, scale, mask, mixed: emulate(q, k, v, scale, mask, mixed=mixed), **(
        {"loop": loop} if m is tk else {}))


def test_the_knob_names_its_own_kernel_text(tensor_cores, tune, monkeypatch):
    """The knob's kernels have names and texts of their own (VQ_MIXS in the header), only for the MIXED tensor-core
    loops: the scalar MIXED partial and the loops' other partials keep split S - 1 alone."""
    made = []
    real = katt.backend.cuda_kernel
    monkeypatch.setattr(katt.backend, "cuda_kernel", lambda **kw: made.append(kw) or real(**kw))
    monkeypatch.setattr(katt.backend, "backend", lambda: "cuda")
    katt._compiled.cache_clear()
    try:
        for tc, haswin in ((src.TC_MIX, 3), (src.TC_MIXK, 2), (src.TC_MIX, 4), (0, 3), (src.TC_MIX, 1)):
            for splits in (1, 4):
                tune(tc_mixed_splits=splits)
                katt._kernel("partial", 0 if tc != src.TC_MIXK else 4, 4 if tc != src.TC_MIXK else 0, haswin,
                             False, tc, 0, True)
    finally:
        katt._compiled.cache_clear()
    named = [("_m4" in kw["name"], "#define VQ_MIXS 4" in kw["header"]) for kw in made]
    # (the last two pairs' texts do not depend on the knob: one compile each)
    assert named == [(False, False), (True, True)] * 3 + [(False, False)] * 2, [kw["name"] for kw in made]


APPEND = [(tm, c, src.TC_MIX) for c in tm.APPEND_CASES[-5:]] + [(tk, c, src.TC_MIXK) for c in tk.APPEND_CASES[:8]]


@pytest.mark.parametrize("m, case, loop", APPEND, ids=[f"{'mix' if m is tm else 'mixk'}{i}"
                                                       for i, (m, *_) in enumerate(APPEND)])
def test_append_inside_with_mixed_splits(m, case, loop, monkeypatch, tune):
    """The fused decode step's MIXED launch with tc_mixed_splits 4: split S - 1 encodes the rows (the per-token role's
    token, KIVI's group at a flush) and attends them; the other scalar splits only older records and windows, so the
    output is the same in both block orders, the rows bit for bit one-shot encode's, within the float64 bound."""
    tune(**({"tc_mixkv": True} if loop == src.TC_MIXK else {}))
    _splits(monkeypatch, 4)
    tm.appends_on_the_loop(case, monkeypatch, tune, loop, (4 if case[0][2] else 3) if m is tm else
                           (4 if case[1][2] else 2))


@pytest.mark.skipif(not _REAL_MMA(), reason="no CUDA GPU with mma.m16n8k16 (sm_80+): the tensor-core loop is not run")
@pytest.mark.parametrize("name, kw, knob, loop", [
    ("tq3-kivi2", dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2), "tc_mixed", src.TC_MIX),
    ("kivi4-tq4", dict(key_method="kivi", key_bits=4, value_method="turboquant", value_bits=4), "tc_mixkv",
     src.TC_MIXK)], ids=["tq3-kivi2", "kivi4-tq4"])
def test_mixed_splits_decode_steps_on_the_gpu_match_the_scalar_loop(monkeypatch, tune, name, kw, knob, loop):
    """With tc_mixed_splits 4: 200 decode steps on the tensor-core loop against the scalar loop, stored bytes identical
    and outputs within the attention tolerance (test_tc_mixed_emulated.loops_match_on_the_gpu)."""
    tm.loops_match_on_the_gpu(monkeypatch, tune, name, kw, knob, loop, tc_mixed_splits=4)
