"""The retrieval table's evaluation sequences (tools/quality/retrieval.py): the trainer's passkey format
(tools/quality/retrieval_train.py: PASSKEY_PREFIX, DIGITS; held-out corpus text with `PASSKEY = 12345` at a line
start and the query `PASSKEY = ` plus the digits at the end), with the needle depth set instead of drawn, and the
check that a sequence is in that format.
"""
from __future__ import annotations

import numpy as np

from . import retrieval_data as qrd


def passkey_sequence(text: np.ndarray, length: int, rng, depth: float) -> dict:
    """The trainer's passkey sequence (make_sequence's "passkey" task) with the needle at `depth` of the body.

    Returns tokens (int32, `length` bytes), digits, needle_at/needle_len, and score_mask: rows p (predicting
    tokens[p + 1]) whose target is corpus text, i.e. neither the needle line nor the query and answer."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth: expected a fraction in [0, 1], got {depth}")
    answer = qrd._digits(rng)
    line = qrd.PASSKEY_PREFIX + answer + b"\n"
    tail = qrd.PASSKEY_PREFIX + answer
    body_len = length - len(line) - len(tail)
    if body_len < 8:
        raise ValueError(f"length: {length} bytes leaves no room for text around the passkey")
    s = int(rng.integers(length, text.size - body_len - 1))
    body = text[s : s + body_len]
    cut = np.flatnonzero(body[-200:] == 10)   # the query starts a line, as in make_sequence
    if cut.size and body_len > 200:
        body = body[: body_len - 200 + int(cut[-1]) + 1]
    at = int(depth * body.size)
    at = qrd._line_start(body, at, min(body.size, at + 200))
    seq = qrd._insert(body, at, line)
    if seq[-1] != 10:
        seq = np.concatenate([seq, np.frombuffer(b"\n", np.uint8)])
    seq = np.concatenate([seq, np.frombuffer(tail, np.uint8)])
    pad = length - seq.size          # text in front so the query stays last (make_sequence pads the same way)
    seq = np.concatenate([text[s - pad : s], seq]) if pad > 0 else seq
    at += max(pad, 0)
    is_text = np.ones(length, bool)
    is_text[at : at + len(line)] = False
    is_text[length - len(tail) :] = False
    return {"tokens": seq.astype(np.int32), "digits": answer.decode(), "needle_at": at, "needle_len": len(line),
            "depth": depth, "score_mask": is_text[1:].copy()}


def check_passkey_format(seq: np.ndarray) -> str:
    """The digits of a passkey sequence in the trainer's format; ValueError saying what is wrong otherwise."""
    b = bytes(np.asarray(seq, np.uint8))
    p, n = qrd.PASSKEY_PREFIX, qrd.DIGITS
    tail = b[-(len(p) + n) :]
    if not tail.startswith(p) or not tail[len(p) :].isdigit():
        raise ValueError(f"seq: does not end in {p!r} and {n} digits: {tail!r}")
    if b[-(len(p) + n) - 1 : -(len(p) + n)] != b"\n":
        raise ValueError("seq: the query does not start a line")
    needle = tail + b"\n"
    if b[: -len(tail)].count(needle) != 1:
        raise ValueError(f"seq: the needle line {needle!r} occurs {b[: -len(tail)].count(needle)} times")
    return tail[len(p) :].decode()
