"""The retrieval model's training data (tools/quality/retrieval_train.py): the Python standard library's text as
a corpus, and the curriculum's sequences built from it (passkey, key-value lookup, repeated span, copy), each with
the mask of its answer bytes, the bytes the loss weighs more."""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys

import numpy as np

PASSKEY_PREFIX = b"PASSKEY = "          # the format of tools/quality/trained_model.py and tools/quality/trained_eval.py
DIGITS = 5
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
# the copy task's alphabets: lowercase letters also fill the Python text around the span, so one matching byte
# finds many earlier places (copying needs 2-3 matching bytes); bytes 128..255 are rare in the ASCII corpus,
# so one matching byte finds the first copy (see docs/retrieval-model.md, CPU experiments)
COPY_ALPHABETS = {"letters": LETTERS, "high": np.arange(128, 256, dtype=np.uint8)}



# ---- corpus ---------------------------------------------------------------------------------------------
def stdlib_files(base: pathlib.Path | None = None) -> list[pathlib.Path]:
    import sysconfig

    base = base or pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
    return sorted((p for p in base.rglob("*.py") if not skip & set(p.relative_to(base).parts)),
                  key=lambda p: str(p.relative_to(base)))


def build_corpus(heldout_every: int = 8) -> dict:
    """{"train": uint8, "heldout": uint8, "manifest": {...}} from this Python's stdlib."""
    import sysconfig

    base = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts = {"train": [], "heldout": []}
    names = []
    for i, p in enumerate(stdlib_files(base)):
        split = "heldout" if i % heldout_every == heldout_every - 1 else "train"
        data = p.read_bytes()
        parts[split].append(data)
        names.append([str(p.relative_to(base)), split, hashlib.sha256(data).hexdigest()[:16]])
    out = {s: np.frombuffer(b"\n\n".join(v), np.uint8) for s, v in parts.items()}
    h = hashlib.sha256(json.dumps(names).encode()).hexdigest()
    out["manifest"] = {"python": sys.version.split()[0], "files": len(names), "sha256": h,
                       "bytes": {s: int(out[s].size) for s in ("train", "heldout")}, "heldout_every": heldout_every}
    return out


def load_corpus(path: pathlib.Path | None) -> dict:
    if path is None:
        return build_corpus()
    if not path.is_file():
        raise FileNotFoundError(f"--corpus: {path} does not exist (write it with pack-corpus)")
    z = np.load(path)
    return {"train": z["train"], "heldout": z["heldout"], "manifest": json.loads(str(z["manifest"]))}


# ---- sequences ----------------------------------------------------------------------------------------------
def _line_start(seq: np.ndarray, pos: int, hi: int) -> int:
    """The first line start at or after pos (bounded by hi), else pos."""
    nl = np.flatnonzero(seq[pos:hi] == 10)
    return pos + int(nl[0]) + 1 if nl.size else pos


def _digits(rng) -> bytes:
    return bytes(rng.integers(48, 58, DIGITS, dtype=np.uint8))


def _insert(body: np.ndarray, at: int, piece: bytes) -> np.ndarray:
    return np.concatenate([body[:at], np.frombuffer(piece, np.uint8), body[at:]])


def _repeated(text: np.ndarray, span: np.ndarray, length: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Text with `span` inserted twice; the mask marks the second copy after its first byte."""
    n = span.size
    mask = np.zeros(length, bool)
    body_len = length - 2 * n
    s = int(rng.integers(0, text.size - body_len))
    body = text[s : s + body_len]
    a = int(rng.integers(0, max(1, body_len // 2)))
    b = int(rng.integers(a, body_len + 1))
    seq = np.concatenate([body[:a], span, body[a:b], span, body[b:]])
    mask[a + n + (b - a) + 1 : a + n + (b - a) + n] = True
    return seq[:length], mask


TASKS = ("passkey", "kv", "span", "copy")


def make_sequence(text: np.ndarray, length: int, rng, mix: dict,
                  copy_alphabet: str = "letters") -> tuple[np.ndarray, np.ndarray]:
    """(`length` bytes, answer mask): plain text or one task, chosen with the probabilities in `mix`
    (keys passkey, kv, span, copy; the rest is plain text). The mask marks the bytes only retrieval predicts."""
    seq, mask, _ = make_task_sequence(text, length, rng, mix, copy_alphabet)
    return seq, mask


def make_task_sequence(text: np.ndarray, length: int, rng, mix: dict,
                       copy_alphabet: str = "letters") -> tuple[np.ndarray, np.ndarray, str]:
    """make_sequence's (bytes, answer mask) and the task drawn ("text" or one of TASKS)."""
    if copy_alphabet not in COPY_ALPHABETS:
        raise ValueError(f"copy_alphabet: expected one of {sorted(COPY_ALPHABETS)}, got {copy_alphabet!r}")
    r = rng.random()
    task = "text"
    for name in TASKS:
        p = mix.get(name, 0.0)
        if r < p:
            task = name
            break
        r -= p
    mask = np.zeros(length, bool)
    if task == "text":
        s = int(rng.integers(0, text.size - length))
        return text[s : s + length].copy(), mask, task
    if task in ("span", "copy"):
        if task == "span":
            n = min(int(rng.integers(32, 257)), max(8, length // 4))
            src = int(rng.integers(0, text.size - n))
            span = text[src : src + n]
        else:      # random bytes of the copy alphabet: only copying predicts them; long spans carry much of the loss
            hi = max(8, min(512, length // 3))      # short sequences keep room for the text around both copies
            n = int(rng.integers(min(16, hi), hi + 1))
            span = rng.choice(COPY_ALPHABETS[copy_alphabet], n)
        return (*_repeated(text, span, length, rng), task)
    # passkey / key-value: needles in the body, a query line at the end
    if task == "passkey":
        needles = [(PASSKEY_PREFIX, _digits(rng))]
        q = 0
    else:
        k = int(rng.integers(2, 9))
        needles = [(b"key_" + bytes(rng.choice(LETTERS, 6)) + b" = ", _digits(rng)) for _ in range(k)]
        q = int(rng.integers(0, k))
    prefix, answer = needles[q]
    tail = prefix + answer
    need = sum(len(a) + len(b) + 1 for a, b in needles) + len(tail)
    body_len = length - need
    s = int(rng.integers(0, text.size - body_len - 1))
    body = text[s : s + body_len]
    # the query starts a line: end the body at its last newline if there is one near the end
    cut = np.flatnonzero(body[-200:] == 10)
    if cut.size:
        body = body[: body_len - 200 + int(cut[-1]) + 1] if body_len > 200 else body
    spots = sorted(int(rng.uniform(0.05, 0.9) * body.size) for _ in needles)
    seq = body
    for (pre, ans), at in sorted(zip(needles, spots), key=lambda t: -t[1]):   # from the end: offsets hold
        at = _line_start(seq, at, min(seq.size, at + 200))
        seq = _insert(seq, at, pre + ans + b"\n")
    if seq.size and seq[-1] != 10:
        seq = np.concatenate([seq, np.frombuffer(b"\n", np.uint8)])
    seq = np.concatenate([seq, np.frombuffer(tail, np.uint8)])
    if seq.size < length:      # pad at the front with text so the query stays last
        pad = text[s - (length - seq.size) : s] if s >= length - seq.size else np.full(length - seq.size, 10, np.uint8)
        seq = np.concatenate([pad, seq])
    seq = seq[-length:]
    mask[length - DIGITS :] = True
    return seq, mask, task


def batch(text, n: int, length: int, rng, mix: dict,
          copy_alphabet: str = "letters") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """n sequences of length + 1 bytes (inputs and next-byte targets), their answer masks and tasks."""
    seqs, masks, tasks = zip(*(make_task_sequence(text, length + 1, rng, mix, copy_alphabet) for _ in range(n)))
    return np.stack(seqs).astype(np.int32), np.stack(masks), list(tasks)


def answer_loss_by_task(ce: np.ndarray, masks: np.ndarray, tasks: list[str]) -> dict:
    """Mean loss on the answer bytes of each task in a batch. ce[i, j] is the loss of the target byte j + 1 of
    sequence i (masks[:, 1:] aligns with it). The tasks' floors differ (a passkey digit at chance is ln 10, an
    uncopied random letter ln 26, a copied byte ~0), so their mean alone cannot say which task is learned."""
    out = {}
    for t in TASKS:
        rows = [i for i, k in enumerate(tasks) if k == t]
        m = masks[rows, 1:]
        if m.any():
            out[t] = round(float(ce[rows][m].mean()), 4)
    return out
