"""What the retrieval table measures on one sequence through one configuration's caches
(tools/quality/retrieval.py): the logits as generate_step would produce them, then per scored row the next-byte
NLL, the KL against the fp16 cache's log-probabilities, and whether the answer's digits come out.
"""
from __future__ import annotations

import numpy as np

from . import retrieval_data as qrd


def forward(model, caches, tokens: np.ndarray, chunk: int) -> np.ndarray:
    """Logits (len - 1, vocab) float32: prefill in chunks up to the answer, then one byte per call."""
    from .trained_eval import run_sequence

    return run_sequence(model, caches, tokens, qrd.DIGITS, chunk)


def log_softmax(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    m = a.max(axis=-1, keepdims=True)
    return a - m - np.log(np.exp(a - m).sum(axis=-1, keepdims=True))


def score(logits: np.ndarray, seq: dict, ref: dict | None) -> dict:
    """NLL over text rows, exact match of the answer, KL against the reference's log-probs (rows scored)."""
    toks = seq["tokens"]
    n, a = toks.size - 1, qrd.DIGITS
    rows = np.flatnonzero(seq["score_mask"])
    ans = np.arange(n - a, n)     # the rows predicting the digits (the first from the query's last byte)
    lp_t, lp_a = log_softmax(logits[rows]), log_softmax(logits[ans])
    nll = -lp_t[np.arange(rows.size), toks[rows + 1]]
    ans_nll = -lp_a[np.arange(a), toks[ans + 1]]
    out = {"nll": nll, "hit": bool(np.all(lp_a.argmax(-1) == toks[ans + 1])), "answer_nll": float(ans_nll.mean()),
           "lp": (lp_t, lp_a)}
    if ref is not None:
        rt, ra = ref["lp"]
        out["kl"] = np.sum(np.exp(rt) * (rt - lp_t), axis=-1)
        out["kl_answer"] = np.sum(np.exp(ra) * (ra - lp_a), axis=-1)
    return out
