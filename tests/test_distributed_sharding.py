"""Caches of a model sharded over KV heads with mx.distributed store, per head, the unsharded bytes
(spec/README.md 'Common parameters': per-head randomness derives from (seed, layer, global head index)).

The real thing: MLX's own launcher (`mlx.launch`, mlx._distributed_utils.launch) starts two processes of
tests/_distributed_worker.py on 127.0.0.1 with the ring backend. Each shards the same random llama (4 KV
heads of dim 64, 2 layers, float16) with mlx-lm's `model.shard(group)` (rank r keeps KV heads [2r, 2r + 2)),
builds our caches with `make_prompt_cache(model, ..., group=group)` and writes what they stored. This
process builds the unsharded model and caches and compares:

- layer 0, every method: rank r's records are heads [2r, 2r + 2) of the unsharded model's records, bit for
  bit (layer 0's keys/values come from the embedding through the sliced k_proj/v_proj, no cross-rank sum).
- every layer: the keys/values a rank's caches were fed differ from the unsharded model's after layer 0
  (the sharded o_proj/down_proj outputs are summed across ranks in another order), so the oracle there is
  an unsharded cache (global heads, no group) fed both ranks' inputs side by side: per head, same bytes.
- logits: rank 0 == rank 1 exactly, and close to the unsharded model's (stated tolerance).

The launcher's exit status is 0 even when a rank fails, so each rank writes a .done file last. Only a
failing `mx.distributed.init` (no ring backend / loopback) skips; any other rank failure fails.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc

REPO = Path(__file__).resolve().parents[1]
WORKER_PATH = Path(__file__).with_name("_distributed_worker.py")
_spec = importlib.util.spec_from_file_location("_distributed_worker", WORKER_PATH)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

RANKS = 2
LOCAL = worker.N_KV_HEADS // RANKS
METHODS = list(worker.SETTINGS)
LAUNCH_TIMEOUT_S = 120        # a hung ring (e.g. a rank stuck in connect) is killed after this
# Logits after all_sum vs the unsharded model: float16 partial sums added in another order, then amplified
# by quantization codes that flip on last-bit input differences in layer 1. Measured max |diff| when
# written: fp16 KVCache ~0.01, our caches 0.02-0.07 on logits of magnitude ~6.
LOGITS_ATOL = 0.25


def _free_port_pair() -> int:
    """A port p with p and p + 1 free on 127.0.0.1 (the launcher gives rank r the port p + r)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 1 > 65535:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no free pair of loopback ports")


def _kill_group(proc: subprocess.Popen) -> None:
    """End the launcher's process group (the launcher, its bash wrappers and the ranks), TERM then KILL."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Run the two ranks once; {method: [rank 0 arrays, rank 1 arrays]}."""
    tmp = tmp_path_factory.mktemp("distributed")
    out = tmp / "out"
    out.mkdir()
    log_path = tmp / "launch.log"
    cmd = [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())",
           "--backend", "ring", "--hosts", "127.0.0.1", "-n", str(RANKS),
           "--starting-port", str(_free_port_pair()), "--python", sys.executable, "--cwd", str(REPO),
           str(WORKER_PATH), str(out)]
    # TMPDIR: the launcher's per-rank mktemp files (pid, hostfile) land in our temp dir.
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log_path, "wb") as log:
        # stdin stays an open, silent pipe: the launcher polls stdin to forward input, and a closed one
        # (EOF always readable) would make it spin.
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=REPO, start_new_session=True)
        try:
            proc.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            timed_out = proc.poll() is None
            _kill_group(proc)
            proc.stdin.close()
    log_text = log_path.read_text(errors="replace")
    if timed_out:
        pytest.fail(f"mlx.launch did not finish in {LAUNCH_TIMEOUT_S} s; killed. Log:\n{log_text[-4000:]}")
    init_failures = sorted(out.glob("rank*.initfail"))
    if init_failures:  # the environment, not the caches: this MLX cannot form a ring over loopback
        pytest.skip("mx.distributed.init(backend='ring') failed on 127.0.0.1: "
                    + init_failures[0].read_text().strip())
    missing = [r for r in range(RANKS) if not (out / f"rank{r}.done").exists()]
    assert not missing, f"ranks {missing} did not finish (launcher rc {proc.returncode}). Log:\n{log_text[-4000:]}"
    return {m: [dict(np.load(out / f"rank{r}_{m}.npz")) for r in range(RANKS)] for m in ("fp16", *METHODS)}


@pytest.fixture(scope="module")
def unsharded():
    """The same model unsharded, same tokens; {method: arrays} plus the model itself."""
    model = worker.build_model()
    res = {}
    for method in ("fp16", *METHODS):
        rec, logits = worker.run(model, worker.make_caches(model, method))
        res[method] = worker.arrays(rec, logits)
    return model, res


def _heads(a: np.ndarray, r: int) -> np.ndarray:
    return a[:, r * LOCAL : (r + 1) * LOCAL]


def _records(arrays: dict, layer: int) -> dict:
    return {k: v for k, v in arrays.items() if k.startswith(f"L{layer}_") and k.split("_")[1] in ("k", "v")}


def _xor_note(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"shapes {a.shape} vs {b.shape}"
    x = np.bitwise_xor(a, b)
    return f"{np.count_nonzero(x)} of {x.size} elements differ; first XOR {x[x != 0][:4]}"


@pytest.mark.parametrize("method", METHODS)
def test_head_offset_is_derived_from_the_group(ranks, method):
    for r, arrays in enumerate(ranks[method]):
        for layer in range(2):
            assert list(arrays[f"L{layer}_head_offset"]) == [r * LOCAL] * 2


@pytest.mark.parametrize("method", METHODS)
def test_layer0_records_are_the_unsharded_models_heads(ranks, unsharded, method):
    full = unsharded[1][method]
    for r, arrays in enumerate(ranks[method]):
        inputs = [k for k in arrays if k.startswith("L0_in_")]
        assert inputs and set(inputs) == {k for k in full if k.startswith("L0_in_")}
        for k in inputs:  # precondition (MLX, not us): the sliced projections give the full one's heads
            assert np.array_equal(arrays[k], _heads(full[k], r)), f"rank {r} {k}: sliced k/v_proj differ"
        recs = _records(arrays, 0)
        assert recs.keys() == _records(full, 0).keys()
        for k, a in recs.items():
            b = _heads(full[k], r)
            assert np.array_equal(a, b), f"rank {r} {method} {k}: {_xor_note(a, b)}"


@pytest.mark.parametrize("method", METHODS)
def test_every_layer_stores_the_unsharded_caches_bytes(ranks, unsharded, method):
    model = unsharded[0]
    for layer in range(2):
        full_cache = worker.make_caches(model, method)[layer]        # unsharded: 4 heads, head_offset 0
        n_chunks = len([k for k in ranks[method][0] if k.startswith(f"L{layer}_in_k_")])
        assert n_chunks == 1 + worker.DECODE
        for i in range(n_chunks):
            kv = [np.concatenate([a[f"L{layer}_in_{role}_{i}"] for a in ranks[method]], axis=1)
                  for role in ("k", "v")]
            full_cache.update_and_fetch(*(mx.array(x.view(np.float16)) for x in kv))
        full = worker.arrays([worker.Recorder(full_cache)], np.zeros(0))
        for r, arrays in enumerate(ranks[method]):
            recs = _records(arrays, layer)
            assert recs.keys() == {f"L{layer}" + k[2:] for k in _records(full, 0)}
            for k, a in recs.items():
                b = _heads(full["L0" + k[len(f"L{layer}"):]], r)
                assert np.array_equal(a, b), f"rank {r} {method} {k}: {_xor_note(a, b)}"


@pytest.mark.parametrize("method", [m for m in METHODS if m != "kivi"])  # KIVI draws nothing per head
def test_the_head_offset_matters(ranks, method):
    """Negative control: rank 1's inputs in a cache at head_offset 0 store other bytes than rank 1 did."""
    rank1 = ranks[method][1]
    for layer in range(2):
        c = vc.CLASS_BY_METHOD[method](**worker.SETTINGS[method], seed=worker.CACHE_SEED, layer=layer)
        for i in range(1 + worker.DECODE):
            c.update_and_fetch(*(mx.array(rank1[f"L{layer}_in_{role}_{i}"].view(np.float16)) for role in "kv"))
        k_rec = worker.arrays([worker.Recorder(c)], np.zeros(0))
        differs = [n for n, a in _records(k_rec, 0).items()
                   if not n.endswith("_window") and not np.array_equal(a, rank1[f"L{layer}" + n[2:]])]
        assert differs, f"layer {layer}: head_offset 0 stored rank 1's bytes"


@pytest.mark.parametrize("method", ["fp16", *METHODS])
def test_logits_match_the_unsharded_model(ranks, unsharded, method):
    l0, l1 = (a["logits"] for a in ranks[method])
    assert np.array_equal(l0.view(np.uint32), l1.view(np.uint32))    # all_sum: one result on every rank
    ref = unsharded[1][method]["logits"]
    assert l0.shape == ref.shape == (1 + worker.DECODE, worker.VOCAB)
    np.testing.assert_allclose(l0, ref, rtol=0, atol=LOGITS_ATOL)


# ---- single process: argument checks with a stand-in group ------------------------------------------
class FakeGroup:
    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


@pytest.fixture(scope="module")
def small_model():
    return worker.build_model()


def _set_local_heads(model, n):
    for layer in model.layers:
        layer.self_attn.n_kv_heads = n


def test_group_sets_each_layers_head_offset(small_model):
    _set_local_heads(small_model, 1)            # as after shard over 4 ranks
    try:
        caches = vc.make_prompt_cache(small_model, method="turboquant", group=FakeGroup(3, 4))
        assert [(c.key_params.head_offset, c.value_params.head_offset) for c in caches] == [(3, 3)] * 2
        same = vc.make_prompt_cache(small_model, method="kivi", group=FakeGroup(3, 4), head_offset=3)
        assert [c.key_params.head_offset for c in same] == [3, 3]
        # fp16 layers stay mlx-lm KVCache; the others still get the derived offset
        mixed = vc.make_prompt_cache(small_model, method="rabitq", group=FakeGroup(2, 4), fp16_layers=(1, 0))
        assert type(mixed[0]).__name__ == "KVCache" and mixed[1].key_params.head_offset == 2
    finally:
        _set_local_heads(small_model, worker.N_KV_HEADS)
    assert [c.key_params.head_offset for c in vc.make_prompt_cache(small_model, head_offset=5)] == [5, 5]
    assert [c.key_params.head_offset for c in vc.make_prompt_cache(small_model)] == [0, 0]


def test_group_errors(small_model):
    with pytest.raises(ValueError, match="^head_offset"):
        vc.make_prompt_cache(small_model, group=FakeGroup(1, 2), head_offset=2 * worker.N_KV_HEADS + 1)
    with pytest.raises(ValueError, match="^group"):
        vc.make_prompt_cache(small_model, group=object())
    with pytest.raises(ValueError, match="^group"):
        vc.make_prompt_cache(small_model, group=FakeGroup(2, 2))
    attn = small_model.layers[1].self_attn
    saved = attn.n_kv_heads
    del attn.n_kv_heads
    try:
        with pytest.raises(ValueError, match="^group.*layer 1"):
            vc.make_prompt_cache(small_model, group=FakeGroup(0, 2))
    finally:
        attn.n_kv_heads = saved
