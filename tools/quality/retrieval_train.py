"""Train a byte-level llama that retrieves in context (issue 32 item 1): the model `veloxquant quality` needs
to tell the caches apart on passkey / needle retrieval.

The committed 1.2 M-parameter model (tools/quality/trained_model.py) never learned to copy. This trainer differs in
three ways: a model ~20x larger (default `retrieval-25m`: hidden 512, 8 layers, 4 query / 2 KV heads of
head_dim 128, rope_theta 500000, ~25 M parameters); more text (every .py file of the Python standard library
outside site-packages and the test suites, ~11 MB, every 8th file held out); and a retrieval curriculum mixed
into that text, whose answer bytes weigh more in the loss:
- passkey: `PASSKEY = 12345` at a random line start, the query `PASSKEY = ` and the digits at the end (the
  format tools/quality/trained_eval.py evaluates);
- key-value: several `key_abcdef = 12345` lines spread through the text, one of the keys queried at the end;
- repeated span: a 32-256 byte span of other text inserted twice, the second copy predictable only by
  copying (the induction-head signal).
Sequence lengths grow phase by phase (`--phases`), so short steps teach the tasks and long ones the distances.

The device machine runs a command for at most 10 minutes and has a different Python (so a different stdlib):
`pack-corpus` writes the corpus once here (a compressed .npz with its manifest and hash), `train` reads it
with `--corpus`, stops at `--max-minutes`, and writes a checkpoint (weights, optimizer state, step, data RNG
state) that the next call continues with `--resume`; the log (JSON lines) grows across calls.

    python -m veloxquant.tools.quality.retrieval_train pack-corpus --out .device/retrieval-corpus.npz
    python -m veloxquant.tools.quality.retrieval_train train --corpus .device/retrieval-corpus.npz \\
        --out-dir $OUT/run --max-minutes 8 [--resume]          # repeat until the phases are done
    python -m veloxquant.tools.quality.retrieval_train eval --corpus ... --run $OUT/run --contexts 1024 4096
    python -m veloxquant.tools.quality.retrieval_train export --run $OUT/run --out $OUT/model   # <= 15 MiB files
    python -m veloxquant.tools.quality.retrieval_train train --preset smoke --max-steps 30   # CPU, seconds

`eval` is passkey exact match with the full-precision forward pass (no cache): the precondition for the
cache comparison, which `veloxquant quality` then runs on the saved float16 weights.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import sys
import time

import numpy as np

from .retrieval_data import (COPY_ALPHABETS, DIGITS, answer_loss_by_task, batch, build_corpus, load_corpus,
                             make_sequence)
from .retrieval_weights import (PRESETS, checkpointed_layers, export, init_from, load_run,  # noqa: F401
                                model_args, n_params, new_model)

def parse_phases(spec_: str | None, preset: str) -> list[tuple[int, int, int]]:
    if not spec_:
        return [tuple(p) for p in PRESETS[preset][1]]
    out = []
    for part in spec_.split(","):
        try:
            s, b, l = (int(v) for v in part.split("x"))
        except ValueError:
            raise ValueError(f"--phases: expected STEPSxBATCHxLENGTH[,...], got {part!r}") from None
        out.append((s, b, l))
    return out


# ---- training ---------------------------------------------------------------------------------------------
def train(args) -> int:
    import mlx.core as mx
    import mlx.optimizers as optim

    corpus = load_corpus(args.corpus)
    text = corpus["train"]
    phases = parse_phases(args.phases, args.preset)
    total = sum(s for s, _, _ in phases)
    lr = args.lr or PRESETS[args.preset][2]
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (ckpt, state_path), log_path = _paths(out), out / "log.jsonl"
    mix = {"passkey": args.p_passkey, "kv": args.p_kv, "span": args.p_span, "copy": args.p_copy}
    model = new_model(args.preset, args.seed)
    if args.init_from and not args.resume:
        why = init_from(model, args.init_from, args.preset)
        if why:
            print(f"--init-from: {why}", file=sys.stderr)
            return 2
    warm = max(1, total // 50)
    sched = optim.join_schedules([optim.linear_schedule(lr / 50, lr, warm),
                                  optim.cosine_decay(lr, max(1, total - warm), lr / 20)], [warm])
    opt = optim.AdamW(learning_rate=sched, weight_decay=0.05)
    rng = np.random.default_rng(args.seed)
    step = 0
    if args.resume:
        step = _resume(args, phases, model, opt, rng)
        if isinstance(step, str):
            print(f"--resume: {step}", file=sys.stderr)
            return 2
    print(f"{args.preset}: {n_params(model):,} parameters; corpus {corpus['manifest']['sha256'][:12]} "
          f"({text.size:,} training bytes); phases {phases}; step {step}/{total}; device {mx.default_device()}",
          flush=True)

    if not args.resume:
        opt.init(model.trainable_parameters())
    step_fn = _step_fn(model, opt, args.compile)
    t0 = time.time()
    done_before = step
    bounds = np.cumsum([s for s, _, _ in phases])
    stopped = "done"
    with log_path.open("a") as log, checkpointed_layers(model) if args.grad_checkpoint else contextlib.nullcontext():
        while step < total:
            if args.max_steps is not None and step - done_before >= args.max_steps:
                stopped = "max-steps"
                break
            if (time.time() - t0) / 60 > args.max_minutes:
                stopped = "max-minutes"
                break
            ph = int(np.searchsorted(bounds, step, side="right"))
            _, bsz, length = phases[ph]
            seqs, masks, tasks = batch(text, bsz, length, rng, mix, args.copy_alphabet)
            x = mx.array(seqs)
            w = mx.array(np.where(masks[:, 1:], args.answer_weight, 1.0).astype(np.float32))
            loss, ans, gnorm, ce = step_fn(x[:, :-1], x[:, 1:], w, mx.array(masks[:, 1:]))
            mx.eval(loss, ans, ce, model.parameters(), opt.state)
            step += 1
            if step % args.log_every == 0 or step == total or step - done_before == 1:
                by_task = answer_loss_by_task(np.array(ce), masks, tasks)
                rec = {"step": step, "phase": ph, "length": length, "loss": round(float(loss), 4),
                       "answer_loss": round(float(ans), 4), "answer_by_task": by_task,
                       "grad_norm": round(float(gnorm), 3), "lr": float(sched(step)),
                       "seconds": round(time.time() - t0, 1)}
                log.write(json.dumps(rec) + "\n")
                log.flush()
                print(f"step {step}/{total} L={length} loss {rec['loss']:.3f} answer {rec['answer_loss']:.3f} ("
                      + " ".join(f"{k} {v:.2f}" for k, v in by_task.items()) + f") |g| {rec['grad_norm']:.2f} "
                      f"{rec['seconds']:.0f}s", flush=True)
    _save(args, model, opt, rng, dict(phases=phases, step=step, total=total, lr=lr, mix=mix,
                                      corpus=corpus["manifest"], init_from=_init_record(args)))
    if step >= total:   # the deliverable: float16 weights and their config next to the checkpoint
        model.set_dtype(mx.float16)
        model.save_weights(str(out / "model.safetensors"))
    print(f"stopped ({stopped}) at step {step}/{total}; wrote {ckpt}, {state_path}, {log_path}"
          + (f", {out / 'model.safetensors'}" if step >= total else ""), flush=True)
    return 0


def _init_record(args) -> dict | None:
    """What the run started from (state.json), kept across --resume."""
    if args.resume:
        return json.loads(_paths(args.out_dir)[1].read_text()).get("init_from")
    if not args.init_from:
        return None
    cfg = args.init_from / "config.json"
    st = json.loads((cfg if cfg.is_file() else args.init_from / "state.json").read_text())
    return {"path": str(args.init_from), "step": st.get("step"), "quantization": st.get("quantization"),
            "commands": st.get("commands", [])}


def _step_fn(model, opt, compiled: bool):
    """One optimizer step on (x, y, w, a): (loss weighted by w, loss on the answer bytes a alone, gradient norm,
    the per-byte losses). The answer mask comes apart from the weights: --answer-weight 1 still logs it."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    def loss_fn(m, x, y, w, a):
        ce = nn.losses.cross_entropy(m(x).astype(mx.float32), y)
        return (ce * w).sum() / w.sum(), (ce * a).sum() / mx.maximum(a.sum(), 1), ce

    grad = nn.value_and_grad(model, loss_fn)

    def step_fn(x, y, w, a):
        (loss, ans, ce), g = grad(model, x, y, w, a)
        g, gnorm = optim.clip_grad_norm(g, 1.0)
        opt.update(model, g)
        return loss, ans, gnorm, ce

    if compiled:   # one graph per sequence shape (a handful of phases): fewer launches on the GPU
        from functools import partial

        state = [model.state, opt.state]
        step_fn = partial(mx.compile, inputs=state, outputs=state)(step_fn)
    return step_fn


def _paths(out: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A run folder's checkpoint (model and optimizer state) and its state.json."""
    return out / "checkpoint.safetensors", out / "state.json"


def _resume(args, phases, model, opt, rng) -> int | str:
    """Load the run in args.out_dir into model, opt and rng: the step it stopped at, or why it cannot resume."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    ckpt, state_path = _paths(args.out_dir)
    if not state_path.is_file():
        return f"no checkpoint in {args.out_dir}"
    st = json.loads(state_path.read_text())
    if st["preset"] != args.preset or st["phases"] != [list(p) for p in phases]:
        return f"the checkpoint was trained with preset {st['preset']} phases {st['phases']}"
    flat = mx.load(str(ckpt))
    model.load_weights([(k[6:], v) for k, v in flat.items() if k.startswith("model.")], strict=True)
    opt.init(model.trainable_parameters())
    opt.state = tree_unflatten([(k[4:], v) for k, v in flat.items() if k.startswith("opt.")])
    rng.bit_generator.state = st["rng"]
    return st["step"]


def _save(args, model, opt, rng, run: dict) -> None:
    """The checkpoint and state.json of the run (phases, step, total, lr, mix, corpus), with the commands so far."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    ckpt, state_path = _paths(args.out_dir)
    flat = dict(("model." + k, v) for k, v in tree_flatten(model.parameters()))
    flat.update(("opt." + k, v) for k, v in tree_flatten(opt.state))
    mx.save_safetensors(str(ckpt), flat)
    state = {"preset": args.preset, "phases": [list(p) for p in run["phases"]], "step": run["step"],
             "total": run["total"], "seed": args.seed, "lr": run["lr"], "mix": run["mix"],
             "answer_weight": args.answer_weight, "copy_alphabet": args.copy_alphabet,
             "init_from": run.get("init_from"),
             "rng": rng.bit_generator.state, "corpus": run["corpus"],
             "model_args": {k: v for k, v in dataclasses.asdict(model_args(args.preset)).items() if v is not None},
             "parameters": n_params(model)}
    state.setdefault("commands", [])
    if args.resume:
        state["commands"] = json.loads(state_path.read_text()).get("commands", [])
    state["commands"].append(" ".join(["python -m veloxquant.tools.quality.retrieval_train", *sys.argv[1:]]))
    state_path.write_text(json.dumps(state, indent=1) + "\n")


# ---- evaluation -------------------------------------------------------------------------------------------
def passkey_eval(model, text: np.ndarray, context: int, count: int, seed: int) -> dict:
    """Exact match of the 5 passkey digits (teacher-forced argmax = greedy) and their mean NLL."""
    rng = np.random.default_rng(seed)
    sc = score_passkeys(model, [make_sequence(text, context, rng, {"passkey": 1.0})[0] for _ in range(count)])
    return {"context": context, "sequences": count, "exact_match": sum(s["hit"] for s in sc) / count,
            "answer_nll": float(np.mean([s["answer_nll"] for s in sc]))}


def evaluate(args) -> int:
    import mlx.core as mx

    model, st = load_run(args.run)
    # MLX's CPU float16 matmul is ~30x slower than float32 (DEVELOPERS.md): the CPU evaluates in float32
    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "float16")
    model.set_dtype(getattr(mx, dtype))
    corpus = load_corpus(args.corpus)
    res = []
    for c in args.contexts:
        r = passkey_eval(model, corpus["heldout"], c, args.sequences, args.seed)
        res.append(r)
        print(f"context {r['context']}: passkey exact match {r['exact_match']:.0%} (answer NLL "
              f"{r['answer_nll']:.2f}; chance ln 10 = 2.30)", flush=True)
    (args.run / "eval.json").write_text(json.dumps({"step": st["step"], "dtype": dtype, "results": res},
                                                   indent=1) + "\n")
    return 0


# ---- the committed model's record: held-out windows and passkeys with what the model scored on them --------
RECORD_FILE = "heldout.json"
# the committed model (8-bit export of the retrieval-4m run in docs/retrieval-model.md), in the source checkout
COMMITTED = pathlib.Path(__file__).resolve().parent / "trained" / "retrieval_4m"
RECORD_TOLERANCE = 0.01       # nats: float32 on another CPU / BLAS / MLX build


def window_losses(model, windows: list[np.ndarray]) -> list[float]:
    """Mean next-byte NLL of each window (float32 logits)."""
    import mlx.core as mx

    out = []
    for w in windows:
        logits = model(mx.array(w[None, :-1].astype(np.int32)))[0].astype(mx.float32)
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        out.append(float(-mx.take_along_axis(lp, mx.array(w[1:, None].astype(np.int32)), axis=-1).mean()))
    return out


def score_passkeys(model, seqs: list[np.ndarray]) -> list[dict]:
    """Exact match and answer NLL of the 5 digits closing each passkey sequence (as passkey_eval)."""
    import mlx.core as mx

    out = []
    for seq in seqs:
        logits = model(mx.array(seq[None, :-1].astype(np.int32)))[0, -DIGITS:].astype(mx.float32)
        lp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        tgt = seq[-DIGITS:]
        out.append({"hit": bool((lp.argmax(-1) == tgt).all()), "answer_nll": float(-lp[np.arange(DIGITS), tgt].mean())})
    return out


def record(args) -> int:
    """Write RECORD_FILE into the export: held-out windows and passkey sequences (their bytes, so the check
    needs no corpus) with the losses and hits this model scores on them in float32."""
    import mlx.core as mx

    model, st = load_run(args.run)
    model.set_dtype(mx.float32)
    corpus = load_corpus(args.corpus)
    text, rng = corpus["heldout"], np.random.default_rng(args.seed)
    starts = rng.integers(0, text.size - args.length - 1, args.windows)
    windows = [np.asarray(text[s:s + args.length + 1], np.uint8) for s in starts]
    seqs = [make_sequence(text, args.passkey_context, rng, {"passkey": 1.0})[0].astype(np.uint8)
            for _ in range(args.passkeys)]
    rec = {"corpus": corpus["manifest"].get("sha256"), "seed": args.seed, "dtype": "float32",
           "device": str(mx.default_device()), "mlx": mx.__version__, "tolerance": RECORD_TOLERANCE,
           "windows": [w.tobytes().hex() for w in windows], "losses": window_losses(model, windows),
           "passkeys": [dict(tokens=q.tobytes().hex(), **r) for q, r in zip(seqs, score_passkeys(model, seqs))]}
    (args.run / RECORD_FILE).write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {args.run / RECORD_FILE}: held-out losses {[round(x, 4) for x in rec['losses']]}, passkeys "
          f"{sum(p['hit'] for p in rec['passkeys'])}/{len(seqs)} at {args.passkey_context}")
    return 0


def load_record(run: pathlib.Path) -> dict:
    """RECORD_FILE with its byte strings back as uint8 arrays."""
    rec = json.loads((run / RECORD_FILE).read_text())
    rec["windows"] = [np.frombuffer(bytes.fromhex(w), np.uint8) for w in rec["windows"]]
    for p in rec["passkeys"]:
        p["tokens"] = np.frombuffer(bytes.fromhex(p["tokens"]), np.uint8)
    return rec


def pack_corpus(args) -> int:
    c = build_corpus()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, train=c["train"], heldout=c["heldout"], manifest=json.dumps(c["manifest"]))
    print(f"wrote {args.out}: {c['manifest']['files']} files, {c['manifest']['bytes']}, corpus "
          f"{c['manifest']['sha256'][:12]} (Python {c['manifest']['python']})")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m veloxquant.tools.quality.retrieval_train",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack-corpus", help="write this Python's stdlib corpus to one .npz")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p = sub.add_parser("train", help="train (or --resume) until the phases end or --max-minutes")
    p.add_argument("--preset", choices=sorted(PRESETS), default="retrieval-25m")
    p.add_argument("--phases", default=None, help="STEPSxBATCHxLENGTH,... (default: the preset's)")
    p.add_argument("--corpus", type=pathlib.Path, default=None, help="pack-corpus output (default: this stdlib)")
    p.add_argument("--out-dir", type=pathlib.Path, required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--init-from", type=pathlib.Path, default=None, metavar="RUN",
                   help="start from the weights of a run folder or export of the same preset (fine-tune)")
    p.add_argument("--grad-checkpoint", action="store_true",
                   help="recompute each layer in the backward pass (long phases: 32k bytes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--p-passkey", type=float, default=0.2)
    p.add_argument("--p-kv", type=float, default=0.1)
    p.add_argument("--p-span", type=float, default=0.1)
    p.add_argument("--p-copy", type=float, default=0.4,
                   help="share of sequences with a random span (of --copy-alphabet; 16 bytes to a third of the "
                        "sequence, at most 512) repeated: only copying predicts it")
    p.add_argument("--copy-alphabet", choices=sorted(COPY_ALPHABETS), default="high",
                   help="the copy task's bytes: letters (like the text around them: copying needs several "
                        "matching bytes) or high (bytes 128-255, rare in the corpus: one matching byte suffices)")
    p.add_argument("--answer-weight", type=float, default=4.0, help="loss weight of answer bytes")
    p.add_argument("--max-minutes", type=float, default=8.0)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in this call")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="mx.compile the training step (default on; --no-compile to debug)")
    p = sub.add_parser("export", help="float16 weights of a run in shards of <= 15 MiB, with config.json")
    p.add_argument("--run", type=pathlib.Path, required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--bits", type=int, choices=[16, 8, 4], default=16,
                   help="16: float16; 8 or 4: affine-quantized layers (MLX's format, as mlx_lm.load reads it)")
    p = sub.add_parser("record", help=f"write {RECORD_FILE} (held-out windows, passkeys, their scores) into an export")
    p.add_argument("--run", type=pathlib.Path, required=True)
    p.add_argument("--corpus", type=pathlib.Path, required=True)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--passkeys", type=int, default=2)
    p.add_argument("--passkey-context", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("eval", help="passkey exact match of a run (no cache)")
    p.add_argument("--run", type=pathlib.Path, required=True)
    p.add_argument("--corpus", type=pathlib.Path, default=None)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--dtype", choices=["float16", "float32"], default=None,
                   help="compute dtype (default: float32 on the CPU, float16 on a GPU)")
    p.add_argument("--sequences", type=int, default=20)
    p.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    if args.cmd == "train":
        mix = args.p_passkey + args.p_kv + args.p_span + args.p_copy
        if not 0 <= mix <= 1:
            ap.error(f"--p-passkey + --p-kv + --p-span + --p-copy: must be within [0, 1], got {mix}")
        try:
            parse_phases(args.phases, args.preset)
        except ValueError as e:
            ap.error(str(e))
    return {"pack-corpus": pack_corpus, "train": train, "eval": evaluate, "export": export,
            "record": record}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
