"""Issue 29's fast path: on a CUDA backend every method and window setting must run each decode step of an mlx-lm
forward as accelerated/kernels/decode_step.py's DecodeStep (the append inside the attention's partial launch, then the
combine), never the general path's separate encode / commit launches, never the ops path, and never a decode of
the cache's records. No GPU here: the backend is a stand-in "CUDA" whose kernels record their launches and return
zeros (what a kernel computes is tested by the emulator tests; this checks which launches a step makes).

Configurations that do not take it yet are strict xfails naming what keeps them off it, so fixing one flips its
test to a failure until the mark is removed."""
from __future__ import annotations

import gc
import pathlib
import re

import mlx.core as mx
import numpy as np
import pytest

from veloxquant.accelerated import attention as vattention
from veloxquant.accelerated import kernels
from veloxquant.accelerated.cache import VeloxKVCache, base as cache_base, make_prompt_cache
from veloxquant.accelerated.kernels import decode_step
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend, commit
from veloxquant.accelerated.kernels import methods as km
from veloxquant.accelerated.ops import attention as ops_attention
from veloxquant.tools.quality import tiny_llama

PROMPT = 200        # past KIVI's default window (128) plus a group (32): every role has encoded tokens
STEPS = 34          # more than a KIVI key group: the steps that flush a group are among them


class _Recorder:
    """A compiled kernel's stand-in: logs its name, returns zeros (a clean token: no check hit)."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def specialized(self, template=None):
        return self

    def __call__(self, *, inputs, output_shapes, output_dtypes, **kw):
        self.log.append(self.name)
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]


def _launch_caches():
    mods = (fused, katt, km, commit, backend, vattention, cache_base)
    return {id(f): f for m in mods for f in vars(m).values() if callable(getattr(f, "cache_clear", None))}.values()


@pytest.fixture
def cuda(monkeypatch):
    """A stand-in CUDA backend with tensor cores (an H200's); yields the list of launched kernels' names."""
    log = []
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded launches"))
    monkeypatch.setattr(backend, "available", lambda: (True, "recorded launches"))
    monkeypatch.setattr(kernels, "available", lambda: (True, "recorded launches"))
    monkeypatch.setattr(backend, "cuda_kernel", lambda name, input_names, output_names, source, header="",
                        ensure_row_contiguous=True: _Recorder(log, name))
    monkeypatch.setattr(backend, "kernel", lambda kind, method, dtype_name: _Recorder(log, f"vq_{kind}_{method}"))
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    for f in _launch_caches():
        f.cache_clear()
    yield log
    for f in _launch_caches():       # no recorder kept in a cached launch plan for the next test
        f.cache_clear()
    km._RANGE.clear()
    gc.collect()


@pytest.fixture
def paths(monkeypatch):
    """What each layer's step took: DecodeStep.step / .attend results, the general path's choices, decodes."""
    seen = {"step": [], "attend": [], "path": [], "decoded": 0}
    real_step, real_attend, real_path = decode_step.DecodeStep.step, decode_step.DecodeStep.attend, vattention.path
    real_deq = ops_attention.PackedRecord.dequantized

    def step(self, *a, **k):
        out = real_step(self, *a, **k)
        seen["step"].append(out is not None)
        return out

    def attend(self, *a, **k):
        out = real_attend(self, *a, **k)
        seen["attend"].append(out is not None)
        return out

    def path(*a, **k):
        p = real_path(*a, **k)
        seen["path"].append(p)
        return p

    def dequantized(self, *a, **k):
        seen["decoded"] += 1
        return real_deq(self, *a, **k)
    monkeypatch.setattr(decode_step.DecodeStep, "step", step)
    monkeypatch.setattr(decode_step.DecodeStep, "attend", attend)
    monkeypatch.setattr(vattention, "path", path)
    monkeypatch.setattr(ops_attention.PackedRecord, "dequantized", dequantized)
    return seen


def _off(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


_MIXED = ("keys turboquant 3-bit (R = 0: one record per token) and values KIVI 2-bit (R = 128, groups of 32): one "
          "launch moves both roles' windows or neither (in_place.InPlace, cache.base._one_launch: the keys have none), "
          "and the roles' encoded prefixes differ, which the partial takes as one count (nenc) for both: "
          "accelerated.attention.aligned decodes the keys' extra tokens (at most R + G - 1) per step (kernel body "
          "work: a count per role, the keys' tokens past the values' prefix attended from their records beside "
          "the values' window)")

CONFIGS = [
    # id, make_prompt_cache arguments, mark
    ("turboquant-w0", dict(method="turboquant", window=0), None),
    ("turboquant_rvq-w0", dict(method="turboquant_rvq", window=0), None),
    ("turboquant_prod-w0", dict(method="turboquant_prod", window=0), None),
    ("rabitq-w0", dict(method="rabitq", window=0), None),
    ("mlx_affine-w0", dict(method="mlx_affine", window=0), None),
    ("kivi-w0", dict(method="kivi", window=0), None),
    ("turboquant-w32", dict(method="turboquant", window=32), None),
    ("turboquant_rvq-w32", dict(method="turboquant_rvq", window=32), None),
    ("turboquant_prod-w32", dict(method="turboquant_prod", window=32), None),
    ("rabitq-w32", dict(method="rabitq", window=32), None),
    ("mlx_affine-w32", dict(method="mlx_affine", window=32), None),
    ("kivi-w32", dict(method="kivi", window=32), None),
    ("kivi-default-window", dict(method="kivi"), None),
    ("keys-turboquant3-values-kivi2", dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2),
     None),
    ("keys-turboquant4-values-rabitq", dict(key_method="turboquant", key_bits=4, value_method="rabitq"), None),
]

# launches of the general path: a role's own encode or decode, the commit of encoded rows, the append alone
_SLOW = ("vq_encode", "vq_decode", "vq_commit", "vq_append")


def _decode(model, caches, steps=STEPS):
    for i in range(steps):
        model(mx.array([[2 + i]]), cache=caches)


def _reset(cuda, paths):
    cuda.clear()
    for k in paths:
        paths[k] = [] if isinstance(paths[k], list) else 0


def _assert_fast(cuda, paths, caches, layer_steps):
    """Every layer step of the decode steps since _reset was one DecodeStep launch pair and nothing else."""
    why = [type(c._fast).__name__ if c._fast is not None else
           f"no DecodeStep (in-place plan {c._in_place is not None}, one launch "
           f"{cache_base._one_launch(c.key_params, c.value_params)})" for c in caches]
    assert paths["step"].count(True) == layer_steps, \
        f"DecodeStep.step ran {paths['step'].count(True)} of {layer_steps} layer steps: {why}"
    assert paths["attend"].count(True) == layer_steps, \
        f"DecodeStep.attend launched {paths['attend'].count(True)} of {layer_steps}; general path: " \
        f"{sorted(set(paths['path']))}"
    assert not paths["path"], f"the general attention path ran: {sorted(set(paths['path']))}"
    assert not paths["decoded"], f"the cache was decoded {paths['decoded']} times in decode steps"
    slow = sorted({n for n in cuda if n.startswith(_SLOW)})
    assert not slow, f"general-path launches in decode steps: {slow}"
    partials = sum(n.startswith("vq_attention_partial") for n in cuda)
    assert partials == layer_steps, f"{partials} partial launches for {layer_steps} layer steps"


def _fast_steps(cuda, paths, kw, steps: int = STEPS, head_dim: int = 64, layers: int = 2):
    """A tiny llama's caches of `kw` after a prompt and one decode step (which makes each layer's DecodeStep on the
    general path), then `steps` decode steps recorded from a reset, checked by _assert_fast; (the caches, the
    partial kernels' names those steps launched)."""
    model = tiny_llama(head_dim, layers=layers)
    caches = make_prompt_cache(model, **kw)
    model(mx.array(np.arange(PROMPT) % 500)[None], cache=caches)
    _decode(model, caches, 1)
    _reset(cuda, paths)
    _decode(model, caches, steps)
    _assert_fast(cuda, paths, caches, len(caches) * steps)
    return caches, {n for n in cuda if n.startswith("vq_attention_partial")}


def _partials_with(cuda, paths, tune, knob: str, kw):
    """(on, the partial kernels' names) of 4 fast decode steps of a tiny llama with caches of `kw`, tuning's `knob`
    on and then off (each launch checked by _assert_fast)."""
    for on in (True, False):
        tune(**{knob: on})
        yield on, _fast_steps(cuda, paths, kw, steps=4)[1]


@pytest.mark.parametrize("kw", [pytest.param(kw, id=i, marks=m or ()) for i, kw, m in CONFIGS])
def test_every_decode_step_takes_the_fast_path(cuda, paths, kw):
    caches, _ = _fast_steps(cuda, paths, kw)
    assert all(isinstance(c, VeloxKVCache) for c in caches)


_METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "rabitq", "mlx_affine", "kivi")
_PAIRS = [(k, v, w) for w in (0, 32) for k in _METHODS for v in _METHODS if k != v]


@pytest.mark.parametrize("k, v, window", _PAIRS, ids=[f"keys-{k}-values-{v}-w{w}" for k, v, w in _PAIRS])
def test_every_key_value_method_pair_takes_the_fast_path(cuda, paths, k, v, window):
    """Issue 29's second point: any two methods (their default bits) in one layer, window 0 and 32, take the same
    fast decode step as one method does: one DecodeStep launch pair per layer step, nothing decoded."""
    _fast_steps(cuda, paths, dict(key_method=k, value_method=v, window=window))


def _documented_tc_pairs() -> dict:
    """{(keys' method, values' method, knob): 'tc' or 'scalar'} of docs/caches.md's pair table: knob None for a cell's
    loop with the default knobs, and a knob of accelerated/tuning.py for a cell's "(knob: loop)" note, the loop with
    that knob on (a loop still off by default)."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "caches.md").read_text()
    rows = text.split("<!-- tc-pairs: rows keys, columns values -->\n", 1)[1].split("\n\n", 1)[0].splitlines()
    values = [c.strip() for c in rows[0].strip("|").split("|")][1:]
    table = {}
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for v, c in zip(values, cells[1:]):
            loop, _, note = c.partition(" (")
            table[cells[0], v, None] = loop
            table.update({(cells[0], v, knob): on for knob, on in re.findall(r"(\w+): (\w+)", note)})
    return table


@pytest.mark.parametrize("window", [0, 32])
def test_the_documented_pairs_take_the_loops_the_table_says(cuda, paths, window):
    """docs/caches.md's table of the loop each key / value pair takes (one method in both roles included), against
    the partial each pair launches (its compiled name's 't' tag) at head dim 128 and the default bits: every cell with
    the default knobs, and a cell's knob note (a loop off by default: tuning's tc_mixkv for KIVI keys beside turboquant
    values) with that knob alone turned on."""
    from veloxquant.accelerated import tuning
    documented = _documented_tc_pairs()
    assert {(k, v) for k, v, _ in documented} == {(k, v) for k in _METHODS for v in _METHODS}, sorted(documented)
    assert all(knob in tuning.NAMES for _, _, knob in documented if knob), sorted(documented)
    got = {}
    for k, v, knob in documented:
        with tuning.override(**({knob: True} if knob else {})):
            _, partials = _fast_steps(cuda, paths, dict(key_method=k, value_method=v, window=window), steps=2,
                                      head_dim=128, layers=1)
        tags = {n.removeprefix("vq_attention_partial_") for n in partials}
        got[k, v, knob] = "tc" if all("t" in t for t in tags) else "scalar"
    wrong = {p: (documented[p], got[p]) for p in documented if documented[p] != got[p]}
    assert not wrong, f"window {window}: (documented, launched) {wrong}"


@pytest.mark.parametrize("kw", [dict(key_method="turboquant", key_bits=3, value_method="turboquant", value_bits=2),
                                dict(key_method="turboquant", key_bits=3, value_method="rabitq"),
                                dict(key_method="turboquant", key_bits=4, value_method="turboquant", value_bits=3)],
                         ids=["keys-turboquant3-values-turboquant2", "keys-turboquant3-values-rabitq",
                              "keys-turboquant4-values-turboquant3"])
def test_3bit_turboquant_steps_take_the_tensor_core_loop(cuda, paths, tune, kw):
    """tuning's tc_3bit: the quality docs' recommended pair (keys turboquant 3 bits, values turboquant 2) and the
    other pairs with a 3-bit role step on the fast path with the 3-bit tensor-core partial (its own kernel, name
    ...c3) and the append inside it; off, the same steps take the scalar loop's partial."""
    for on, partials in _partials_with(cuda, paths, tune, "tc_3bit", kw):
        assert partials and all(("t2c3a" in n) == on for n in partials), (on, partials)


def _batch_mark(name, mark):
    """A configuration's mark for the merged batch: the B-row cache itself holds every per-token method, windows
    included (batch_shared), and KIVI prompts not whole groups apart one ragged B-row cache (tuning's ragged, on by
    default: each row flushing at its own step, cache/ragged.py); what would keep its step off the DecodeStep is the
    single-sequence kernel-body reason."""
    if mark is None:
        return ()
    return _off("merge makes one B-row cache; its step is off the DecodeStep for the single-sequence cache's "
                "reason: " + mark.kwargs["reason"])


def _merge_prefilled(kw, lengths):
    """(model, per layer the merge of one prompt cache per length, each prefilled with that many tokens)."""
    model = tiny_llama(64, layers=2)
    rows = []
    for n in lengths:
        caches = make_prompt_cache(model, **kw)
        model(mx.array(np.arange(n) % 500)[None], cache=caches)
        rows.append(caches)
    return model, [layer[0].merge(list(layer)) for layer in zip(*rows)]


def _assert_batch_steps_fast(model, merged, cuda, paths):
    """Two-row decode steps on a merged batch (the first makes the DecodeStep): each one DecodeStep launch pair
    per layer for the whole batch."""
    q = mx.array([[1], [1]])
    model(q, cache=merged)
    _reset(cuda, paths)
    for i in range(STEPS):
        model(q + 1 + i, cache=merged)
    _assert_fast(cuda, paths, [c.inner for c in merged], len(merged) * STEPS)


@pytest.mark.parametrize("kw", [pytest.param(kw, id=i, marks=_batch_mark(i, m)) for i, kw, m in CONFIGS])
def test_a_merged_batch_takes_one_fast_step_per_layer(cuda, paths, kw):
    """mlx-lm's BatchGenerator merges per-sequence prompt caches (VeloxKVCache.merge): every configuration must
    become one B-row cache whose decode step is one DecodeStep launch pair per layer for the whole batch."""
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    # ragged prompts
    model, merged = _merge_prefilled(kw, (PROMPT, PROMPT - 37))
    kinds = sorted({type(c).__name__ for c in merged})
    assert kinds == [SharedBatchVeloxKVCache.__name__], f"merge made {kinds}"
    _assert_batch_steps_fast(model, merged, cuda, paths)


def _attended_through_the_kernels(paths, layer_steps):
    """Every layer step attended through the kernels: the DecodeStep's launch or the general path's kernels (never
    the ops path), and nothing decoded the cache."""
    fast = paths["attend"].count(True)
    assert fast + len(paths["path"]) == layer_steps and set(paths["path"]) <= {"kernels"}, \
        f"{fast} DecodeStep launches, general path {sorted(set(paths['path']))} x {len(paths['path'])}"
    assert not paths["decoded"], f"the cache was decoded {paths['decoded']} times in decode steps"


@pytest.mark.parametrize("kw", [pytest.param(kw, id=i) for i, kw, _ in CONFIGS if "kivi" not in i and "w32" in i])
def test_a_merged_windowed_batch_attends_through_the_kernels(cuda, paths, kw):
    """An exact window: merge makes one B-row cache whose rows' left padding lies below the encoded tokens (every row
    past R), so each decode step attends through the kernels with the rows' starts (not the ops path, no decode)."""
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    model, merged = _merge_prefilled(kw, (PROMPT, PROMPT - 37))
    assert {type(c) for c in merged} == {SharedBatchVeloxKVCache}
    q = mx.array([[1], [1]])
    _reset(cuda, paths)
    for i in range(STEPS):
        model(q + i, cache=merged)
    _attended_through_the_kernels(paths, len(merged) * STEPS)
    assert all(c.inner._k._window.shape[2] == kw["window"] for c in merged)


@pytest.mark.parametrize("kw", [pytest.param(kw, id=i) for i, kw, _ in CONFIGS])
def test_a_sliding_window_cache_takes_the_fast_path(cuda, paths, kw):
    """VeloxRotatingKVCache (issue 29 item 4) past max_size, every configuration: each step evicts (rows skipped: the
    launch reads the buffers from row lo) and is one DecodeStep launch pair per layer. max_size 96, or 200 where a
    window of 128 would hold every token of 96 (nothing encoded: the window-only record's ops path)."""
    from veloxquant.accelerated.cache import VeloxRotatingKVCache
    max_size = 96 if kw.get("window") is not None or "kivi" not in str(kw) else 200
    model = tiny_llama(64, layers=2)
    caches = [VeloxRotatingKVCache(max_size, layer=i, **kw) for i in range(2)]
    # (460 tokens: the record buffers get room for every step's rows; one that grows takes the general path once)
    model(mx.array(np.arange(460) % 500)[None], cache=caches)
    # the first eviction leaves most rows dead: their compaction (a new plan, so a step on the general path, before
    # the steps counted) copies the held rows into buffers with room for the rows appended until the next one, so no
    # later step grows a buffer (KIVI's group flushes among the counted steps included)
    _decode(model, caches, 40)
    _reset(cuda, paths)
    _decode(model, caches)
    _assert_fast(cuda, paths, caches, len(caches) * STEPS)
    assert all(r.lo for c in caches for r in c._k._rows.values()), "no evicted rows under the steps"


@pytest.mark.parametrize("kw", [dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2),
                                dict(key_method="turboquant", key_bits=4, value_method="kivi", value_bits=4),
                                dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2,
                                     window=32)],
                         ids=["keys-turboquant3-values-kivi2", "keys-turboquant4-values-kivi4", "tq3-kivi2-window32"])
def test_mixed_steps_take_the_tc_mixed_loop(cuda, paths, tune, kw):
    """tuning's tc_mixed: the recommended quality configuration (keys turboquant 3 bits, values KIVI 2 bits with
    their window: the MIXED partial, HASWIN 3; with a window of 32 on both roles, HASWIN 4) steps on the fast path with
    the TC_MIX tensor-core partial (its own kernel, name ...t2mx) and the append inside it; off, the same steps take
    the scalar loop's MIXED partial."""
    for on, partials in _partials_with(cuda, paths, tune, "tc_mixed", kw):
        haswin = "4" if "window" in kw else "3"
        assert partials and all(n.split("_")[3][:3] == "04" + haswin and ("t2mxa" in n) == on for n in partials), \
            (on, partials)


@pytest.mark.parametrize("kw", [dict(key_method="kivi", key_bits=4, value_method="turboquant", value_bits=4),
                                dict(key_method="kivi", key_bits=2, value_method="turboquant", value_bits=3),
                                dict(key_method="kivi", key_bits=4, value_method="turboquant", value_bits=4,
                                     window=32),
                                dict(key_method="kivi", key_bits=2, value_method="rabitq")],
                         ids=["keys-kivi4-values-turboquant4", "keys-kivi2-values-turboquant3", "kivi4-tq4-window32",
                              "keys-kivi2-values-rabitq"])
def test_mixed_steps_take_the_tc_mixkv_loop(cuda, paths, tune, kw):
    """tuning's tc_mixkv: docs/quality-retrieval.md's pick at the 5-bit budget (keys KIVI 4 bits with their window,
    values turboquant 4 bits: the MIXED partial, HASWIN 2; with a window of 32 on both roles, HASWIN 4) steps on the
    fast path with the TC_MIXK tensor-core partial (its own kernel, name ...t2mk) and the append inside it, beside
    rabitq values too; off, the same steps take the scalar loop's MIXED partial."""
    for on, partials in _partials_with(cuda, paths, tune, "tc_mixkv", kw):
        tag = ("42" if kw["value_method"] == "rabitq" else "40") + ("4" if "window" in kw else "2")   # MK, MV, HASWIN
        assert partials and all(n.split("_")[3][:3] == tag and ("t2mka" in n) == on for n in partials), \
            (on, partials)


def test_mixed_methods_attend_through_the_kernels_without_decoding_the_cache(cuda, paths, monkeypatch):
    """Keys turboquant 3-bit (R = 0) and values KIVI 2-bit (R = 128, groups of 32): the roles' encoded prefixes
    differ, which sent every step to the ops path (the whole cache decoded per step: 0.05x fp16 on the H200). The
    first decode step of a layer (no DecodeStep yet) takes the kernels' general path and every later step the
    DecodeStep's launch, both the MIXED partial, which reads each role's own tokens past the common prefix: no
    token decoded (accelerated.attention.aligned, which decoded the keys' extra tokens, is not called)."""
    fronts = []
    real = vattention._decoded_front
    monkeypatch.setattr(vattention, "_decoded_front",
                        lambda r, n: fronts.append((r.params.role, r.encoded - n)) or real(r, n))
    model = tiny_llama(64, layers=2)
    caches = make_prompt_cache(model, key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2)
    model(mx.array(np.arange(PROMPT) % 500)[None], cache=caches)
    _reset(cuda, paths)       # (the prefill's attention decodes: more than MAX_PACKED_QUERIES queries)
    fronts.clear()
    _decode(model, caches)
    assert paths["path"] == ["kernels"] * len(caches), sorted(set(paths["path"]))
    assert paths["attend"].count(True) == len(caches) * (STEPS - 1), paths["attend"].count(True)
    assert all(c._fast is not None and c._fast.mixed for c in caches), "no MIXED DecodeStep"
    assert not paths["decoded"], f"the cache was decoded {paths['decoded']} times in decode steps"
    assert not [f for f in fronts if f[1]], f"tokens decoded in front of a window: {fronts[:4]}"
    partials = [n for n in cuda if n.startswith("vq_attention_partial")]
    assert len(partials) == len(caches) * STEPS and all(n.split("_")[3][2] == "3" for n in partials), \
        f"not every step's partial is the MIXED one (HASWIN 3: the values' window only): {sorted(set(partials))}"


def _merged_sliding_window_batch(short: bool):
    from veloxquant.accelerated.cache import VeloxRotatingKVCache
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    model = tiny_llama(64, layers=2)
    rows = []
    for n in (PROMPT, 40 if short else PROMPT - 37):
        caches = [VeloxRotatingKVCache(96, method="turboquant", bits=4, layer=i) for i in range(2)]
        model(mx.array(np.arange(n) % 500)[None], cache=caches)
        rows.append(caches)
    merged = [layer[0].merge(list(layer)) for layer in zip(*rows)]
    assert {type(c) for c in merged} == {SharedBatchVeloxKVCache}
    return model, merged


@pytest.mark.parametrize("short", [False, True], ids=["rows-past-max-size", "a-row-shorter"])
def test_a_merged_sliding_window_batch_attends_through_the_kernels(cuda, paths, short):
    """Sliding-window caches merged by mlx-lm's BatchGenerator: one B-row VeloxRotatingKVCache whose decode steps
    attend through the kernels (a row shorter than max_size: its start in the held tokens as the rows' starts), not
    the ops path, and never decode the cache."""
    model, merged = _merged_sliding_window_batch(short)
    q = mx.array([[1], [1]])
    _reset(cuda, paths)
    for i in range(STEPS):
        model(q + i, cache=merged)
    _attended_through_the_kernels(paths, len(merged) * STEPS)


@pytest.mark.parametrize("short", [False, True], ids=["rows-past-max-size", "a-row-shorter"])
def test_a_merged_sliding_window_batch_takes_one_fast_step_per_layer(cuda, paths, short):
    """... and each of them is one DecodeStep launch pair per layer for the whole batch."""
    model, merged = _merged_sliding_window_batch(short)
    _assert_batch_steps_fast(model, merged, cuda, paths)


def test_a_sliding_window_kivi_cache_takes_the_fast_path_past_its_mask(cuda, paths):
    """A sliding-window KIVI cache holds up to G - 1 tokens older than the window, which its make_mask hides with an
    array (rotating.py); remembered as a row start (moved past the evicted rows), the step stays the DecodeStep's
    launch pair (the kernels take no array mask)."""
    from veloxquant.accelerated.cache import VeloxRotatingKVCache
    model = tiny_llama(64, layers=2)
    caches = [VeloxRotatingKVCache(300, method="kivi", layer=i) for i in range(2)]
    model(mx.array(np.arange(460) % 500)[None], cache=caches)
    _decode(model, caches, 40)     # (the compaction and the growth after it: see above)
    hidden = []
    real = caches[0].make_mask
    caches[0].make_mask = lambda *a, **k: hidden.append(real(*a, **k)) or hidden[-1]
    _reset(cuda, paths)
    _decode(model, caches)
    _assert_fast(cuda, paths, caches, len(caches) * STEPS)
    assert any(isinstance(m, mx.array) for m in hidden) and caches[0]._k._q > 0, "no step with held tokens hidden"


@pytest.mark.parametrize("window", [0, 32, 128])
@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
def test_kivi_steps_hand_the_launch_a_group_every_g_steps(cuda, paths, monkeypatch, tune, window, whole):
    """KIVI's fast step alternates two plans: the partial launch with the append inside gets, per step, the
    constants whose meta Q says how many tokens it encodes (0, or G where the window before the step held
    R + G - 1), the encoded count after the step and the window after it (R .. R + G - 1 rows): the host's
    bookkeeping, no sync, must match the window's length. With R = 0 a flush's last token is the step's own (meta
    own = 1) and the launch's window is its row alone (the record's window is then empty)."""
    tune(whole_windows=whole)
    seen = _partial_inputs(monkeypatch)
    model = tiny_llama(64, layers=1)
    caches = make_prompt_cache(model, method="kivi", window=window)
    model(mx.array(np.arange(PROMPT) % 500)[None], cache=caches)
    _decode(model, caches, 1)
    s = caches[0]._k
    p = s.params
    g, w, q = p.group_size, s._window.shape[2], s._q
    seen.clear()
    _decode(model, caches, 2 * g + 3)
    launches = [a for _, a in seen]
    assert len(launches) == 2 * g + 3 and all("kconst" in a for a in launches), "a partial launch per step"
    assert all(("wrow" in a) == whole for a in launches), "whole_windows: the launch's inputs"
    sw = s._bhd[1] * ((s._bhd[2] + 31) // 32)
    flushes = 0
    for a in launches:
        meta = {r: np.array(a[f"{r}const"])[2 * sw + 4 * fused.TABLE + 8:] for r in "kv"}
        nq = {r: (int(m[5]), int(m[7])) for r, m in meta.items()}
        want = g if w + 1 == p.window + g else 0
        own = int(bool(want) and p.window == 0)
        assert nq == {"k": (want, own), "v": (want, own)}, \
            f"window {w} before the step: the launch encodes (Q, own) {nq}, not {(want, own)}"
        q, w = q + want, w + 1 - want
        flushes += want > 0
        assert int(np.array(a["nenc"]).reshape(-1)[0]) == q, "the encoded count after the step"
        # (tuning's whole_windows: the windows' rows in wrow, csrc/window_bind.h)
        rows = [a[f"{r}w"].shape[2] for r in "kv"] if "kw" in a else np.array(a["wrow"]).tolist()[3::4]
        assert rows == [w + own] * 2, "the launch's window (after the step)"
    assert flushes == 2 and s._q == q and s._window.shape[2] == w


def _partial_inputs(monkeypatch) -> list:
    """The input arrays (by name) of every partial launch from here on (the stand-in backend's kernels)."""
    launches = []
    real = backend.cuda_kernel

    def cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True):
        k = real(name, input_names, output_names, source, header, ensure_row_contiguous)
        if not name.startswith("vq_attention_partial"):
            return k

        class _Seen:
            def specialized(self, template=None):
                return self

            def __call__(self, *, inputs, **kw):
                launches.append((name, dict(zip(input_names, inputs))))
                return k(inputs=inputs, **kw)
        return _Seen()
    monkeypatch.setattr(backend, "cuda_kernel", cuda_kernel)
    return launches


@pytest.mark.parametrize("kw", [dict(key_method="kivi", key_bits=4, value_method="turboquant", value_bits=4,
                                     window=0, group_size=64),
                                dict(key_method="kivi", key_bits=2, value_method="turboquant", value_bits=3,
                                     window=0, group_size=32)],
                         ids=["kivi4-g64-tq4-w0", "kivi2-g32-tq3-w0"])
@pytest.mark.parametrize("on", [False, True], ids=["scalar", "tc_mixkv"])
def test_mixed_kivi_keys_window_0_hand_the_launch_the_chunks_row_at_a_flush(cuda, paths, monkeypatch, tune, kw, on):
    """The quality recommendation's 5-bit pick at window 0 (KIVI 4-bit keys, R = 0, beside turboquant values: the
    MIXED partial, HASWIN 2, with the append inside), on the scalar loop and TC_MIXK: at a flush the keys' constants
    say (Q, own) = (G, 1), kf holds the G tokens leaving the window and the launch's window kw is the chunk's row
    (the window after the step, empty, plus own), so the append's window row of the chunk
    (csrc/check_count_window.h vq_wrow = kw rows - kx rows) is 0 and the keys' window past their records (RK = kw
    rows - own, csrc/partial_setup_tokens.h) is the window after the step; other steps (0, 0) and kw the window
    after the step; the values (Q, own) = (1, 0) beside no window; nenc the roles' common encoded prefix."""
    tune(tc_mixkv=on)
    launches = _partial_inputs(monkeypatch)
    model = tiny_llama(64, layers=1)
    caches = make_prompt_cache(model, **kw)
    model(mx.array(np.arange(PROMPT) % 500)[None], cache=caches)
    _decode(model, caches, 1)
    ks, vs = caches[0]._k, caches[0]._v
    g, w, qk, qv = ks.params.group_size, ks._window.shape[2], ks._q, vs._q
    launches.clear()
    _decode(model, caches, 2 * g + 3)
    assert len(launches) == 2 * g + 3, "a partial launch per step"
    sw = ks._bhd[1] * ((ks._bhd[2] + 31) // 32)
    flushes = 0
    for name, a in launches:
        assert name.split("_")[3][:3] == "402" and ("t2mka" in name) == on, name      # MK, MV, HASWIN; the loop
        meta = {r: np.array(a[f"{r}const"])[2 * sw + 4 * fused.TABLE + 8:] for r in "kv"}
        nq = {r: (int(m[5]), int(m[7])) for r, m in meta.items()}
        flush = w + 1 == g
        own = int(flush)
        assert nq == {"k": (g if flush else 0, own), "v": (1, 0)}, f"keys' window {w} before the step: (Q, own) {nq}"
        qk, qv, w = qk + (g if flush else 0), qv + 1, w + 1 - (g if flush else 0)
        flushes += flush
        assert int(np.array(a["nenc"]).reshape(-1)[0]) == min(qk, qv), "the common encoded prefix after the step"
        rows = a["kw"].shape[2]
        assert rows - a["kx"].shape[2] >= 0 and rows - own == w, \
            f"the launch's keys window: {rows} rows for a chunk of {a['kx'].shape[2]}, own {own}, {w} after the step"
        assert a["kf"].shape[2] == (g if flush else a["kx"].shape[2]) and a["vw"].shape[2] == 0 and "vf" not in a
    assert flushes == 2 and ks._q == qk and vs._q == qv and ks._window.shape[2] == w

@pytest.mark.parametrize("kw", [pytest.param(kw, id=i) for i, kw, _ in CONFIGS if "kivi" in i])
def test_a_kivi_batch_whole_groups_apart_takes_one_fast_step_per_layer(cuda, paths, kw):
    """KIVI prompts whole groups apart (G = 32: 200 and 136 tokens): merge makes one B-row cache (batch_shared
    `alignment`) whose decode steps, flushes among them, are one DecodeStep launch pair per layer for the whole batch
    (what those launches compute: tests/test_batch_kivi_kernels_emulated.py)."""
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    model, merged = _merge_prefilled(kw, (PROMPT, PROMPT - 64))
    assert all(type(c) is SharedBatchVeloxKVCache and c._seq is None for c in merged), \
        sorted({type(c).__name__ for c in merged})
    _assert_batch_steps_fast(model, merged, cuda, paths)


# ---- ragged KIVI batches (tuning's ragged: accelerated/cache/ragged.py; docs/ragged-kivi.md) ----------------------
_KIVI_BOTH = [(i, kw) for i, kw, _ in CONFIGS if i.startswith("kivi")]


def _ragged_batch(kw):
    from veloxquant.accelerated.cache import ragged
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    model, merged = _merge_prefilled(kw, (PROMPT, PROMPT - 37))
    assert all(type(c) is SharedBatchVeloxKVCache and c._seq is None and ragged.is_ragged(c.inner) for c in merged), \
        "not one ragged B-row cache per layer"
    return model, merged


@pytest.mark.parametrize("kw", [pytest.param(kw, id=i) for i, kw in _KIVI_BOTH])
def test_a_ragged_kivi_batch_attends_through_the_ragged_partial(cuda, paths, kw, tune, monkeypatch):
    """KIVI prompts 37 tokens apart (G = 32) with tuning's ragged: one B-row cache per layer whose every decode step
    attends through one ragged partial launch (VQ_RAGGED) and its combine, never the ops path or a decode of the
    cache (the first step's append is the ragged append kernel's own launch, the later ones inside the partial:
    test_a_ragged_kivi_batch_takes_one_fast_step_per_layer)."""
    from veloxquant.accelerated.cache import ragged
    tune(ragged=True)
    decoded = []
    real = ragged.RaggedStream.dequantized
    monkeypatch.setattr(ragged.RaggedStream, "dequantized", lambda self: decoded.append(1) or real(self))
    model, merged = _ragged_batch(kw)
    q = mx.array([[1], [1]])
    _reset(cuda, paths)
    for i in range(STEPS):
        model(q + i, cache=merged)
    layer_steps = len(merged) * STEPS
    partials = [n for n in cuda if n.startswith("vq_attention_partial")]
    assert len(partials) == layer_steps and all(n.endswith("rg") for n in partials), sorted(set(partials))
    assert sum(n.startswith("vq_attention_combine") for n in cuda) == layer_steps
    assert not paths["path"] and not paths["decoded"] and not decoded, (paths["path"], paths["decoded"], decoded)


@pytest.mark.parametrize("kw", [pytest.param(kw, id=i) for i, kw in _KIVI_BOTH])
def test_a_ragged_kivi_batch_takes_one_fast_step_per_layer(cuda, paths, kw, tune):
    """... and each step of it is one DecodeStep launch pair per layer (cache/ragged_step.py's plan: each row's
    group flush inside the partial launch's append, VQ_RAGGED + APPEND), nothing else."""
    tune(ragged=True)
    _assert_batch_steps_fast(*_ragged_batch(kw), cuda, paths)
