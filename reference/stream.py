"""Streaming cache semantics: chunked append, flush, trim, save/load (spec/streaming.md).

The state is (encoded prefix fields, window tokens in the input dtype, kept tokens, T); the kept tokens are the
exact values of the newest flushed tokens ("Exact trims"). Every flushed token (or KIVI
group) is encoded by the method's own one-shot `encode`, so the stored bytes are those of a one-shot
encode of the same tokens, whatever the chunking.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import spec
from . import method_module, numerics, record as rec_mod


class Stream:
    """One stream (one layer, one role, all heads) of a cache, in the numpy interchange format."""

    def __init__(self, params: spec.Params, dtype: str):
        self.params = params.resolved()
        self.dtype = numerics.check_dtype(dtype)
        self._method = method_module(self.params)
        self._fields = [name for name, _dt in rec_mod.fields(self.params) if name != "window"]
        self._prefix: dict[str, np.ndarray] | None = None  # encoded fields, token axis 2
        self._window: np.ndarray | None = None             # (B, H, T − Q, d), input dtype storage
        self._kept: np.ndarray | None = None               # (B, H, L, d): tokens Q − L .. Q − 1, exact
        self._tokens = 0

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        """T: tokens appended minus tokens trimmed."""
        return self._tokens

    def _is_group_field(self, name: str) -> bool:
        """KIVI key scale/zero have one row per G tokens along axis 2."""
        return self.params.method == "kivi" and self.params.role == "k" and name in ("scale", "zero")

    def _encode_oldest(self, tokens: np.ndarray, count: int) -> dict[str, np.ndarray]:
        """Encoded fields of the oldest `count` tokens (count = 0 gives correctly shaped empty fields).

        Encoding with window = T − count makes the one-shot encode's Q exactly `count` (count is a
        multiple of G for kivi).
        """
        p = dataclasses.replace(self.params, window=tokens.shape[2] - count)
        rec = self._method.encode(tokens, p, self.dtype)
        return {name: rec[name] for name in self._fields}

    def _flush_count(self, window_len: int) -> int:
        """Tokens that leave the window: all beyond R (per-token), whole groups of G beyond R (kivi)."""
        over = max(window_len - self.params.window, 0)
        if self.params.method == "kivi":
            return self.params.group_size * (over // self.params.group_size)
        return over

    def _slice_prefix(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        g = self.params.group_size
        return {name: (a[:, :, lo // g:hi // g] if self._is_group_field(name) else a[:, :, lo:hi])
                for name, a in self._prefix.items()}

    # -- streaming operations --------------------------------------------------------------------
    def append(self, x) -> None:
        """Append a chunk (B, H, t, d). Validates everything before changing any state."""
        # 1. validate the chunk (dtype, shape, finiteness, head dim, agreement with earlier chunks).
        numerics.check_x(x, self.dtype, self.params)
        if self._window is not None:
            b, h, _t, d = self._window.shape
            if (x.shape[0], x.shape[1], x.shape[3]) != (b, h, d):
                raise ValueError(f"x: chunk shape {x.shape} does not match the stream's (B, H, d) = {(b, h, d)}")
        # 2. append the chunk to the window.
        window = x.copy() if self._window is None else np.concatenate([self._window, x], axis=2)
        # 3. flush; encoding may still reject (norm overflow, kivi float16 range): nothing committed yet.
        count = self._flush_count(window.shape[2])
        new = self._encode_oldest(window, count)
        prefix = new if self._prefix is None else {
            name: np.concatenate([self._prefix[name], new[name]], axis=2) for name in self._fields}
        # commit; the flushed tokens join the kept tokens, of which the newest C stay ("Exact trims")
        kept = window[:, :, :count] if self._kept is None else np.concatenate([self._kept, window[:, :, :count]], 2)
        cap = self.params.kept_capacity()
        self._kept = np.ascontiguousarray(kept[:, :, kept.shape[2] - min(cap, kept.shape[2]):])
        self._prefix = prefix
        self._window = np.ascontiguousarray(window[:, :, count:])
        self._tokens += x.shape[2]

    def trim(self, n) -> int:
        """Remove the newest min(n, T) tokens; returns that count (mlx-lm's trim contract)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n: must be a non-negative integer, got {n!r}")
        removed = min(int(n), self._tokens)
        if removed == 0:
            return 0
        # 1. window tokens first.
        w = self._window.shape[2]
        from_window = min(removed, w)
        self._window = self._window[:, :, :w - from_window]
        new_t = self._tokens - removed
        q = self._tokens - w
        kept_lo = q - self._kept.shape[2]                 # kept tokens are kept_lo .. q − 1
        if removed > from_window:
            if self.params.method == "kivi":
                # 2 (kivi). truncate to Q' = G·⌊T'/G⌋; tokens Q'..T'−1 come back: kept values if held,
                # else decoded and cast RNE (lossy).
                g = self.params.group_size
                q_new = g * (new_t // g)
                back = self._window
                if new_t > q_new and q_new >= kept_lo:
                    back = self._kept[:, :, q_new - kept_lo:new_t - kept_lo]
                elif new_t > q_new:
                    part = dict(self._slice_prefix(q_new, q_new + g))
                    part["window"] = self._window[:, :, :0]
                    decoded = self._method.decode(part, self.params, self.dtype)
                    back = numerics.downcast(decoded[:, :, :new_t - q_new], self.dtype)
                self._window = np.ascontiguousarray(back)
            else:
                # 2 (per-token). drop the newest encoded records.
                q_new = new_t
            self._prefix = self._slice_prefix(0, q_new)
            self._kept = self._kept[:, :, :max(q_new - kept_lo, 0)]
            q = q_new
        # 3. refill: the newest kept tokens (g at a time) go back to the front of the window.
        g = self.params.group_size if self.params.method == "kivi" else 1
        while self._window.shape[2] < self.params.window and self._kept.shape[2] >= g:
            L = self._kept.shape[2]
            self._window = np.concatenate([self._kept[:, :, L - g:], self._window], axis=2)
            self._kept = self._kept[:, :, :L - g]
            q -= g
            self._prefix = self._slice_prefix(0, q)
        self._window = np.ascontiguousarray(self._window)
        self._kept = np.ascontiguousarray(self._kept)
        self._tokens = new_t
        return removed

    def record(self) -> dict[str, np.ndarray] | None:
        """The stored record (spec field order), equal to one-shot encode of the same tokens; None
        before the first append (B, H, d unknown)."""
        if self._prefix is None:
            return None
        arrays = dict(self._prefix)
        arrays["window"] = self._window
        return {k: v.copy() for k, v in rec_mod.assemble(self.params, self.dtype, arrays).items()}

    def decode(self) -> np.ndarray | None:
        rec = self.record()
        return None if rec is None else self._method.decode(rec, self.params, self.dtype)

    # -- save / load -----------------------------------------------------------------------------
    def state(self) -> dict:
        """Record arrays (bytes as stored) plus what is needed to continue: method, params, T, dtype."""
        return {"spec_version": spec.SPEC_VERSION, "method": self.params.method,
                "params": self.params.to_dict(), "dtype": self.dtype, "tokens": self._tokens,
                "record": self.record(), "kept": None if self._kept is None else self._kept.copy()}

    @classmethod
    def from_state(cls, state: dict) -> "Stream":
        s = cls(spec.Params(**state["params"]), state["dtype"])
        rec = state["record"]
        if rec is not None:
            _b, _h, q, t, _d = rec_mod.geometry(rec, s.params, s.dtype)
            if t != state["tokens"]:
                raise ValueError(f"state: tokens {state['tokens']} disagree with the record's T = {t}")
            s._prefix = {name: np.array(rec[name]) for name in s._fields}
            s._window = np.array(rec["window"])
            s._tokens = t
            kept = state.get("kept")
            s._kept = np.array(rec["window"][:, :, :0]) if kept is None else np.array(kept)
            if (s._kept.dtype != s._window.dtype or s._kept.shape[:2] + s._kept.shape[3:] != s._window.shape[:2]
                    + s._window.shape[3:] or s._kept.shape[2] > min(s.params.kept_capacity(), q)):
                raise ValueError(f"state: kept tokens {s._kept.dtype} {s._kept.shape} do not fit the record")
        return s
