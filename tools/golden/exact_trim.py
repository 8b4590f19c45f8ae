"""Golden stream cases for spec 1.1's "Exact trims" (spec/streaming.md): the common parameter `exact_trim` E.

Three cases per method, appended to `cases/<method>-rules.toml` after the other rule cases (every earlier
case keeps its bytes; with E = 0, the default, a manifest entry leaves `exact_trim` out):
- `exact-trim`: the speculative-decoding pattern (append a draft, trim at most E of it, repeat): the final
  record is the one-shot encode of the surviving tokens;
- `exact-trim-short`: a trim deeper than the kept tokens reach: the window is refilled only partly (per-token)
  or kivi's step 2 falls back to decoded tokens;
- `exact-trim-save-load`: the kept tokens survive save/load (the trim after the load needs them).
`check_cases` re-checks on the reference that each case pins its rule: replaying it with E = 0 stores other
bytes, and the `exact-trim` case ends in the one-shot state of its survivors.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ... import spec
from ...conformance.golden_format import replay
from .cases import CaseDef, GenerationError, _reference_reload
from .rules import _rule_x

FLAGS = ("exact-trim", "exact-trim-short", "exact-trim-save-load")


def case_defs(method: str) -> list[CaseDef]:
    info = spec.method_info(method)
    b = info["default_bits"]
    kivi, affine = method == "kivi", method == "mlx_affine"
    d = 32 if affine else 16
    base = {"bits": b, **({"bits2": b} if method == "turboquant_rvq" else {}),
            **({"group_size": 16} if kivi else {}), **({"group_size": 32} if affine else {})}
    out = []

    def stream(tag, flag, dtype, ops, comment, **kw):
        p = spec.Params(method=method, **{**base, **kw}).resolved()
        n_in = sum(n for op, n in ops if op == "append")
        cid = f"{method}-{tag}"
        x = _rule_x(cid, (1, 2, n_in, d), dtype)
        desc = " ".join(f"{op}{'' if op == 'save_load' else ' ' + str(n)}" for op, n in ops)
        flags = (flag, "trim", "window", "chunked") if p.window else (flag, "trim", "chunked")
        out.append(CaseDef(cid, "stream", method, p, dtype, x, flags, f"{comment} [ops: {desc}]",
                           f"cases/{method}-rules.toml", ops=tuple(ops)))

    if kivi:
        stream(f"b{b}-g16-k-d{d}-f16-exact-trim-000", "exact-trim", "float16",
               [("append", 35), ("append", 3), ("trim", 3), ("append", 2), ("trim", 1), ("append", 20),
                ("trim", 5)],
               "pins streaming.md 'Exact trims' and 'Trim' 3 (kivi): R = 4, E = 5 (C = 16); the append of 3 "
               "flushes a group, the trim of 3 leaves 3 < R window tokens and the refill moves the kept group "
               "back (again for the append of 20 and trim of 5): every trim leaves the one-shot state of the "
               "survivors", window=4, exact_trim=5, role="k")
        stream(f"b{b}-g16-v-d{d}-bf16-exact-trim-short-000", "exact-trim-short", "bfloat16",
               [("append", 40), ("append", 9), ("trim", 20), ("append", 4), ("append", 16), ("trim", 2)],
               "pins streaming.md 'Trim' 2 (kivi): R = 0, E = 2 (C = 16); trim 20 truncates to Q' = 16, whose "
               "group is not kept: tokens 16..28 come back decoded (lossy); after two flushes, trim 2 "
               "truncates to Q' = 32 and tokens 32..46 come back from the kept tokens (exact)",
               window=0, exact_trim=2, role="v")
        stream(f"b{b}-g16-k-d{d}-f32-exact-trim-save-load-000", "exact-trim-save-load", "float32",
               [("append", 40), ("append", 10), ("save_load", 0), ("trim", 4), ("append", 1)],
               "pins streaming.md 'Save and load' (kept tokens): R = 2, E = 3 (C = 16); the append of 10 "
               "flushes a group; after save/load the trim of 4 refills the window from the kept group",
               window=2, exact_trim=3, role="k")
    else:
        stream(f"b{b}-d{d}-f16-exact-trim-000", "exact-trim", "float16",
               [("append", 12), ("append", 3), ("trim", 2), ("append", 1), ("append", 3), ("trim", 3),
                ("append", 2), ("trim", 1), ("append", 1)],
               "pins streaming.md 'Exact trims' and 'Trim' 3: R = 4, E = 3; each trim of n <= E tokens after "
               "appends moves n kept tokens back into the window: every trim leaves the one-shot state of "
               "the survivors (speculative decoding)", window=4, exact_trim=3)
        stream(f"b{b}-d{d}-bf16-exact-trim-short-000", "exact-trim-short", "bfloat16",
               [("append", 12), ("trim", 4), ("append", 1)],
               "pins streaming.md 'Trim' 3 when the kept tokens run out: R = 5, E = 2; trim 4 leaves 1 window "
               "token, the refill brings back the 2 kept ones (window 3 < R), and the append of 1 flushes "
               "nothing", window=5, exact_trim=2)
        stream(f"b{b}-d{d}-f32-exact-trim-save-load-000", "exact-trim-save-load", "float32",
               [("append", 10), ("append", 2), ("save_load", 0), ("trim", 2), ("append", 1)],
               "pins streaming.md 'Save and load' (kept tokens): R = 3, E = 4; after save/load the trim of 2 "
               "refills the window from the kept tokens", window=3, exact_trim=4)
    return out


def _record_after(c, params):
    from ...reference import stream as _reference_stream
    from ... import reference
    s, _ = replay(reference.stream.Stream(params, c.dtype), c.x, c.ops, _reference_reload)
    return s.record()


def check_cases(cases) -> None:
    """Each exact-trim case pins its rule (else GenerationError): E = 0 stores other bytes; the
    `exact-trim` case ends in the one-shot state of its survivors."""
    from ... import reference
    for c in cases:
        if not set(FLAGS) & set(c.flags):
            continue
        plain = _record_after(c, dataclasses.replace(c.params, exact_trim=0))
        if all(np.array_equal(plain[k], c.record[k]) and plain[k].shape == c.record[k].shape for k in plain):
            raise GenerationError(f"{c.id}: replaying with exact_trim = 0 stores the same record")
        if "exact-trim" in c.flags:
            t = sum(n for op, n in c.ops if op == "append") - sum(n for op, n in c.ops if op == "trim")
            xs, pos = c.x[:, :, :0], 0
            for op, n in c.ops:
                if op == "append":
                    xs, pos = np.concatenate([xs, c.x[:, :, pos:pos + n]], axis=2), pos + n
                elif op == "trim":
                    xs = xs[:, :, :xs.shape[2] - n]
            one = reference.encode(np.ascontiguousarray(xs), c.params, c.dtype)
            if xs.shape[2] != t or any(one[k].tobytes() != c.record[k].tobytes() for k in one):
                raise GenerationError(f"{c.id}: the final record is not the one-shot encode of the survivors")
