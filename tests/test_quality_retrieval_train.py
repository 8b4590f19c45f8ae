"""tools/quality/retrieval_train.py: the curriculum's sequences hold what their answers need, and a few CPU
steps of the smoke preset lower the loss, checkpoint and resume."""
from __future__ import annotations

import json

import numpy as np
import pytest

from veloxquant.tools.quality import retrieval_data as rd
from veloxquant.tools.quality import retrieval_train as rt

TEXT = np.frombuffer(("def f(x):\n    return x + 1\n\n# a comment line\nclass A:\n    pass\n" * 400).encode(), np.uint8)


@pytest.mark.parametrize("task", ["passkey", "kv", "span", "copy", "copy-high"])
def test_sequences_hold_their_answers(task):
    rng = np.random.default_rng(0)
    task, alphabet = (task, "letters") if task != "copy-high" else ("copy", "high")
    for _ in range(50):
        seq, mask = rd.make_sequence(TEXT, 512, rng, {task: 1.0}, alphabet)
        assert seq.shape == (512,) and mask.shape == (512,) and mask.any()
        b = seq.tobytes()
        if task in ("span", "copy"):
            idx = np.flatnonzero(mask)
            n = idx.size + 1                       # the mask skips the second copy's first byte
            second = b[idx[0] - 1 : idx[-1] + 1]
            assert len(second) == n and b.find(second) < idx[0] - 1   # an earlier copy exists
            if task == "copy":     # random letters, 16 bytes up to a third of the sequence
                assert 16 <= n <= 512 // 3 and set(second) <= set(rd.COPY_ALPHABETS[alphabet].tobytes()), n
                if alphabet == "high":    # the text is ASCII: the bytes >= 128 are the two copies and nothing else
                    assert int((seq >= 128).sum()) == 2 * n
        else:
            assert mask[-rd.DIGITS :].all() and mask.sum() == rd.DIGITS
            line_end = b.rfind(b"\n")
            query = b[line_end + 1 :]                 # "<prefix><digits>" on the last line
            prefix, answer = query[: -rd.DIGITS], query[-rd.DIGITS :]
            assert answer.isdigit() and prefix.endswith(b" = ")
            assert b[: line_end + 1].count(b"\n" + prefix + answer + b"\n") == 1   # the needle, once


def test_smoke_training_lowers_the_loss_and_resumes(tmp_path):
    mx = pytest.importorskip("mlx.core")
    out = tmp_path / "run"
    corpus = tmp_path / "corpus.npz"           # a small corpus: the stdlib scan is not what is tested here
    np.savez_compressed(corpus, train=TEXT, heldout=TEXT, manifest=json.dumps({"sha256": "test"}))
    common = ["train", "--preset", "smoke", "--phases", "16x4x64", "--out-dir", str(out), "--log-every", "1",
              "--corpus", str(corpus)]
    assert rt.main(common + ["--max-steps", "10"]) == 0                      # compiled step (the default)
    st = json.loads((out / "state.json").read_text())
    assert st["step"] == 10 and not (out / "model.safetensors").exists()
    plain = tmp_path / "plain"                                              # the same steps, not compiled
    assert rt.main(common[:6] + [str(plain)] + common[7:] + ["--max-steps", "10", "--no-compile"]) == 0
    losses = lambda d: [json.loads(l)["loss"] for l in (d / "log.jsonl").read_text().splitlines()]  # noqa: E731
    assert np.allclose(losses(out), losses(plain), atol=2e-3)
    assert rt.main(common + ["--resume", "--no-compile"]) == 0
    log = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 17))
    first, last = np.mean([r["loss"] for r in log[:3]]), np.mean([r["loss"] for r in log[-3:]])
    assert last < first - 0.5, (first, last)            # from ~ln 256 = 5.5 at init
    assert (out / "model.safetensors").exists()
    assert rt.main(common + ["--resume", "--phases", "8x4x64", "--no-compile"]) == 2   # another recipe: refused
    assert rt.main(["export", "--run", str(out), "--out", str(tmp_path / "export")]) == 0
    a, _ = rt.load_run(out)
    b, cfg = rt.load_run(tmp_path / "export")
    x = mx.array([list(range(40, 104))])
    assert cfg["step"] == 16 and np.allclose(np.array(a(x)), np.array(b(x)), atol=1e-3)
    res = rt.passkey_eval(b, TEXT, 96, 2, 0)
    assert res["sequences"] == 2 and 0 <= res["exact_match"] <= 1 and res["answer_nll"] > 0
    # the eval command on the float16 export computes in float32 on the CPU (float16 matmuls are ~30x slower there)
    assert rt.main(["eval", "--run", str(tmp_path / "export"), "--corpus", str(corpus), "--contexts", "96",
                    "--sequences", "2"]) == 0
    ev = json.loads((tmp_path / "export" / "eval.json").read_text())
    assert ev["dtype"] == ("float32" if mx.default_device() == mx.cpu else "float16") and len(ev["results"]) == 1
    # an 8-bit export (the committable size): quantized layers reload from its config, logits near the float16 ones
    q8 = tmp_path / "export8"
    assert rt.main(["export", "--run", str(out), "--out", str(q8), "--bits", "8"]) == 0
    c, cfg8 = rt.load_run(q8)
    assert cfg8["quantization"] == {"group_size": 64, "bits": 8}
    assert sum(f.stat().st_size for f in q8.glob("model-*")) < 0.6 * sum(
        f.stat().st_size for f in (tmp_path / "export").glob("model-*"))
    la, lc = np.array(a(x)), np.array(c(x))
    assert np.abs(la - lc).max() < 0.02 * np.abs(la).max() and not np.array_equal(la, lc), (np.abs(la - lc).max(), np.abs(la).max())
    assert rt.main(["export", "--run", str(q8), "--out", str(tmp_path / "again"), "--bits", "8"]) != 0


def test_init_from_starts_at_the_exported_weights_and_checkpointing_keeps_the_gradient(tmp_path):
    """A fine-tune (--init-from, e.g. a 32k phase) starts from the export's weights, an 8-bit one dequantized, and
    refuses another preset; per-layer checkpointing changes memory, not the loss or the gradient."""
    mx = pytest.importorskip("mlx.core")
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model
    corpus = tmp_path / "corpus.npz"
    np.savez_compressed(corpus, train=TEXT, heldout=TEXT, manifest=json.dumps({"sha256": "test"}))
    base = ["--preset", "smoke", "--corpus", str(corpus), "--log-every", "1", "--no-compile"]
    assert rt.main(["train", *base, "--phases", "6x4x64", "--out-dir", str(tmp_path / "src")]) == 0
    assert rt.main(["export", "--run", str(tmp_path / "src"), "--out", str(tmp_path / "q8"), "--bits", "8"]) == 0
    model = rt.new_model("smoke", seed=7)
    assert rt.init_from(model, tmp_path / "q8", "smoke") is None
    src = dict(tree_flatten(dequantize_model(rt.load_run(tmp_path / "q8")[0]).parameters()))
    got = dict(tree_flatten(model.parameters()))
    assert src.keys() == got.keys() and all(np.array_equal(np.array(src[k]), np.array(got[k])) for k in src), \
        "init_from: the model's weights differ from the dequantized export's"
    assert "retrieval-4m" in rt.init_from(rt.new_model("smoke", 0), tmp_path / "q8", "retrieval-4m")
    # the fine-tune's first logged loss is the export's own loss on that batch, not a fresh model's (~ln 256)
    assert rt.main(["train", *base, "--phases", "2x4x64", "--out-dir", str(tmp_path / "ft"), "--init-from",
                    str(tmp_path / "q8"), "--grad-checkpoint"]) == 0
    first = json.loads((tmp_path / "ft" / "log.jsonl").read_text().splitlines()[0])["loss"]
    fresh = json.loads((tmp_path / "src" / "log.jsonl").read_text().splitlines()[0])["loss"]
    assert first < fresh - 0.3, (first, fresh)
    st = json.loads((tmp_path / "ft" / "state.json").read_text())
    assert st["init_from"]["path"] == str(tmp_path / "q8") and st["init_from"]["quantization"]["bits"] == 8
    # checkpointed layers: the same loss and gradient as the plain forward
    x = mx.array(TEXT[None, :65].astype(np.int32))
    loss = lambda m: nn.losses.cross_entropy(m(x[:, :-1]), x[:, 1:]).mean()  # noqa: E731
    plain = rt.new_model("smoke", 3)
    lp, gp = nn.value_and_grad(plain, loss)(plain)
    ck = rt.new_model("smoke", 3)
    fn = type(ck.model.layers[0]).__call__
    with rt.checkpointed_layers(ck):
        assert type(ck.model.layers[0]).__call__ is not fn
        lc, gc = nn.value_and_grad(ck, loss)(ck)
    assert type(ck.model.layers[0]).__call__ is fn, "checkpointed_layers: the block's class is left patched"
    gp, gc = dict(tree_flatten(gp)), dict(tree_flatten(gc))
    assert abs(float(lp) - float(lc)) < 1e-5
    assert all(np.allclose(np.array(gp[k]), np.array(gc[k]), atol=1e-5) for k in gp), "checkpointed gradient differs"


def test_bad_copy_alphabet_is_named():
    with pytest.raises(ValueError, match="copy_alphabet"):
        rd.make_sequence(TEXT, 128, np.random.default_rng(0), {"copy": 1.0}, "greek")
    with pytest.raises(SystemExit):
        rt.main(["train", "--preset", "smoke", "--copy-alphabet", "greek", "--out-dir", "/tmp/unused"])


def test_bad_phases_are_named():
    with pytest.raises(SystemExit):
        rt.main(["train", "--preset", "smoke", "--phases", "10x4", "--out-dir", "/tmp/unused"])


def test_answer_loss_is_logged_per_task_and_without_upweighting(tmp_path):
    """The logged answer loss (computed in the training graph) is the byte-weighted mean of the per-task answer
    losses (computed on the host from the masks): both read the same answer bytes, next-byte aligned. With
    --answer-weight 1 it is still logged (the answer bytes are a mask of their own, not `weight > 1`)."""
    pytest.importorskip("mlx.core")
    corpus = tmp_path / "corpus.npz"
    np.savez_compressed(corpus, train=TEXT, heldout=TEXT, manifest=json.dumps({"sha256": "test"}))
    out = tmp_path / "run"
    assert rt.main(["train", "--preset", "smoke", "--phases", "3x8x96", "--out-dir", str(out), "--log-every", "1",
                    "--corpus", str(corpus), "--answer-weight", "1", "--p-passkey", "0.3", "--p-kv", "0.2",
                    "--p-span", "0.2", "--p-copy", "0.3", "--no-compile"]) == 0
    log = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    rng = np.random.default_rng(0)                          # the run's data order (seed 0)
    for rec in log:
        seqs, masks, tasks = rd.batch(TEXT, 8, 96, rng, {"passkey": 0.3, "kv": 0.2, "span": 0.2, "copy": 0.3})
        counts = {t: int(masks[[i for i, k in enumerate(tasks) if k == t], 1:].sum()) for t in rd.TASKS}
        by = rec["answer_by_task"]
        assert set(by) == {t for t, c in counts.items() if c}, (by, counts)
        assert rec["answer_loss"] > 3, rec                 # ~ln 256 at initialisation, not 0
        mean = sum(by[t] * counts[t] for t in by) / sum(counts.values())
        assert abs(mean - rec["answer_loss"]) < 2e-3, (mean, rec)


@pytest.mark.skipif(not (rt.COMMITTED / rt.RECORD_FILE).is_file(), reason="the committed retrieval model is not in this "
                    "installation (it lives in the source checkout, not the wheel)")
def test_committed_retrieval_model_reproduces_its_recorded_heldout_loss_and_passkeys():
    mx = pytest.importorskip("mlx.core")
    model, cfg = rt.load_run(rt.COMMITTED)
    rec = rt.load_record(rt.COMMITTED)
    assert cfg["preset"] == "retrieval-4m" and cfg["quantization"]["bits"] == 8 and cfg["step"] == cfg["total"]
    assert sum(f.stat().st_size for f in rt.COMMITTED.iterdir()) < 6e6        # small enough to keep in the tree
    model.set_dtype(mx.float32)
    got = rt.window_losses(model, rec["windows"][:2])
    for i, (g, w) in enumerate(zip(got, rec["losses"][:2])):
        assert abs(g - w) <= rec["tolerance"], f"held-out window {i}: loss {g:.5f}, recorded {w:.5f}"
    assert max(rec["losses"]) < 0.3 * np.log(256)                           # far below a uniform byte
    for i, (p, s) in enumerate(zip(rec["passkeys"], rt.score_passkeys(model, [p["tokens"] for p in rec["passkeys"]]))):
        assert s["hit"] == p["hit"] and abs(s["answer_nll"] - p["answer_nll"]) <= rec["tolerance"], (i, s, p)
    assert all(p["hit"] for p in rec["passkeys"])
    # the check can fail: 15 % on one layer's attention output scales moves the loss past the tolerance
    o_proj = model.layers[0].self_attn.o_proj
    o_proj.scales = o_proj.scales * 1.15
    assert abs(rt.window_losses(model, rec["windows"][:1])[0] - rec["losses"][0]) > rec["tolerance"]
