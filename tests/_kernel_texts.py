"""Every kernel text the library assembles, as (kind, variant, backend) -> hashes, to show that a change to how
the texts are composed leaves the kernels alone.

Two hashes per text (header and source together, as MLX writes them into one translation unit):
- `raw`: sha256 of the bytes (header, a NUL, source): byte-identical texts;
- `tokens`: sha256 of the C++ token stream after the C preprocessor (g++ -E -P: macros expanded, directives
  and comments gone): what the compiler sees is the same even where the text around it (a macro binding a
  name, a file spliced in place of an #include line) is not.

Usage: python tests/_kernel_texts.py write OUT.json        (from the repository root, PYTHONPATH=$PWD)
       python tests/_kernel_texts.py compare BEFORE.json AFTER.json
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
import subprocess
import sys

METHODS = ("turboquant", "turboquant_rvq", "rabitq", "turboquant_prod", "kivi", "mlx_affine")
BACKENDS = ("cuda", "metal")
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[A-Za-z_]\w*|\d[\w.]*|\S')


def _commit(be: str, writes: tuple, checks: tuple, after: bool) -> tuple[str, str]:
    from veloxquant.accelerated.kernels import commit
    if hasattr(commit, "assemble"):
        return "", commit.assemble(be, writes, checks, after)
    src = commit.PRELUDES[be] + commit.body(writes, checks)      # the composition before the csrc loader
    if after:
        src = src.replace("  uint32_t mine = 0u;\n", "  uint32_t mine = 0u;\n  (void)after;\n", 1)
    return "", src


def _nsmid() -> tuple[str, str]:
    try:
        from veloxquant.accelerated.kernels import loader
    except ImportError:        # before the csrc loader
        return "", '  unsigned v;\n  asm("mov.u32 %0, %%nsmid;" : "=r"(v));\n  n[0] = (int)v;\n'
    return "", loader.text("nsmid.cuh")


def texts():
    """Yield ((kind, variant, backend), (header, source)) for every text the library can assemble."""
    from veloxquant.accelerated.kernels import append, attention_source, source
    for be in BACKENDS:
        for kind in ("encode", "decode"):
            yield (kind, "-", be), source.assemble(kind, be)
        for mk, mv, apart in itertools.product(METHODS, METHODS, (False, True)):
            yield ("append", f"{mk}/{mv}/apart={int(apart)}", be), append.assemble(be, mk, mv, apart)
        for app in (False, True):
            yield ("combine", f"append={int(app)}", be), attention_source.assemble("combine", be, append=app)
        for mk, mv, haswin, fused, tc, app, starts in itertools.product(range(6), range(6), *[(False, True)] * 5):
            if (tc and be != "cuda") or (app and (fused or haswin)):
                continue
            variant = f"{mk}{mv} win={int(haswin)} fused={int(fused)} tc={int(tc)} append={int(app)} starts={int(starts)}"
            yield ("partial", variant, be), attention_source.assemble("partial", be, mk, mv, haswin, fused, tc, app,
                                                                       starts)
        # the tensor-core loop that reads 3-bit codes (turboquant 0 and rabitq 2 in the other role; prod 3: tc_prod3)
        for mk, mv, haswin, fused, app, starts in itertools.product((0, 2, 3), (0, 2, 3), *[(False, True)] * 4):
            tens = getattr(attention_source, "TC_TENS", None)
            if be != "cuda" or tens is None or (app and (fused or haswin)):
                continue
            variant = f"{mk}{mv} win={int(haswin)} fused={int(fused)} tc={tens} append={int(app)} starts={int(starts)}"
            yield ("partial", variant, be), attention_source.assemble("partial", be, mk, mv, haswin, fused, tens, app,
                                                                       starts)
        # MIXED (roles whose encoded counts differ): HASWIN 2-4 (attention_source.MIXED_WINDOWS), the scalar loop only;
        # the append with one role's window (kernels/append.py MIXED)
        for mk, mv, haswin, fused, app, starts in itertools.product(range(6), range(6),
                                                                    sorted(getattr(attention_source, "MIXED_WINDOWS", ())),
                                                                    *[(False, True)] * 3):
            if app and fused:
                continue
            variant = f"{mk}{mv} win={haswin} fused={int(fused)} tc=0 append={int(app)} starts={int(starts)}"
            yield ("partial", variant, be), attention_source.assemble("partial", be, mk, mv, haswin, fused, False, app,
                                                                       starts)
        # turboquant keys (0) beside KIVI values (4) on their tensor-core loop (TC_MIX: tuning's tc_mixed), no window,
        # one window, and MIXED with the values' window only (HASWIN 3) or both roles' apart (HASWIN 4)
        mixed_tc = getattr(attention_source, "TC_MIX", None)
        for haswin, fused, app, starts in itertools.product((0, 1, 3, 4), *[(False, True)] * 3):
            if be != "cuda" or mixed_tc is None or (app and (fused or haswin == 1)):
                continue
            variant = f"04 win={haswin} fused={int(fused)} tc={mixed_tc} append={int(app)} starts={int(starts)}"
            yield ("partial", variant, be), attention_source.assemble("partial", be, 0, 4, haswin, fused, mixed_tc, app,
                                                                       starts)
        # KIVI keys (4) beside turboquant (0) or rabitq (2) values on their tensor-core loop (TC_MIXK: tuning's
        # tc_mixkv), no window, one window, and MIXED with the keys' window only (HASWIN 2) or both roles' (HASWIN 4)
        mixk_tc = getattr(attention_source, "TC_MIXK", None)
        for mv, haswin, fused, app, starts in itertools.product((0, 2), (0, 1, 2, 4), *[(False, True)] * 3):
            if be != "cuda" or mixk_tc is None or (app and (fused or haswin == 1)):
                continue
            variant = f"4{mv} win={haswin} fused={int(fused)} tc={mixk_tc} append={int(app)} starts={int(starts)}"
            yield ("partial", variant, be), attention_source.assemble("partial", be, 4, mv, haswin, fused, mixk_tc,
                                                                       app, starts)
        if hasattr(append, "MIXED"):
            for mk, mv, apart, win in itertools.product(METHODS, METHODS, (False, True), ((True, False), (False, True))):
                yield ("append", f"{mk}/{mv}/apart={int(apart)}/win={int(win[0])}{int(win[1])}", be), \
                    append.assemble(be, mk, mv, apart, win)
        yield from _ragged(be)
        yield from _whole(be)
        types = ("uint32_t", "float", "__half" if be == "cuda" else "half", "uint8_t", "bool")
        shapes = [((t, n),) for t in types for n in (1, 2, 3, 4)] + [(("uint32_t", 4), ("float", 3))]
        checks = [()] + [((k, n),) for k in ("nonfinite", "flag") for n in (1, 2, 3, 4)] + \
            [(("nonfinite", 4), ("flag", 1))]
        for w, c, after in itertools.product([()] + shapes, checks, (False, True)):
            if w or c:
                yield ("commit", f"{w} {c} after={int(after)}", be), _commit(be, w, c, after)
    yield ("nsmid", "-", "cuda"), _nsmid()


def _whole(be: str):
    """The texts with the windows passed whole (tuning's whole_windows, csrc/window_bind.h): every windowed append
    and every windowed partial a decode step can launch (HASWIN 1-4, the scalar loop, and on CUDA the tensor-core
    loops), those the composers accept."""
    from veloxquant.accelerated.kernels import append, attention_source as src
    if not hasattr(append, "window_bind"):
        return
    for mk, mv, apart, win in itertools.product(METHODS, METHODS, (False, True),
                                                (True, (True, False), (False, True), (True, True))):
        yield ("append", f"{mk}/{mv}/apart={int(apart)}/win={win}/whole", be), \
            append.assemble(be, mk, mv, apart, win, False, True)
    tcs = (False, True, src.TC_TENS, src.TC_MIX) if be == "cuda" else (False,)
    for mk, mv, haswin, fused, tc, app, starts in itertools.product(range(6), range(6), (1, 2, 3, 4),
                                                                    (False, True), tcs, (False, True), (False, True)):
        try:
            text = src.assemble("partial", be, mk, mv, haswin, fused, tc, app, starts, False, True)
        except ValueError:
            continue
        yield ("partial", f"{mk}{mv} win={haswin} fused={int(fused)} tc={tc} append={int(app)} starts={int(starts)} "
                          "whole", be), text


def _ragged(be: str):
    """The ragged texts (rows of their own group phase: cache/ragged.py): every partial with row starts and every
    append with `rphase` that the composers accept (they refuse the rest with ValueError)."""
    from veloxquant.accelerated.kernels import append, attention_source as src
    tcs = (False, True, getattr(src, "TC_TENS", None), getattr(src, "TC_MIX", None),
           getattr(src, "TC_MIXK", None)) if be == "cuda" else (False,)
    for mk, mv, haswin, tc, app, ragged in itertools.product(range(6), range(6), (False, True, 2, 3, 4),
                                                             [t for t in tcs if t is not None], (False, True),
                                                             (True, getattr(src, "OWN", True))):
        try:
            text = src.assemble("partial", be, mk, mv, haswin, False, tc, app, True, ragged)
        except ValueError:
            continue
        yield ("partial", f"{mk}{mv} win={int(haswin)} tc={tc} append={int(app)} ragged={ragged}", be), text
    for mk, mv, apart, win in itertools.product(METHODS, METHODS, (False, True),
                                                (True, (True, False), (False, True), (True, True))):
        try:
            text = append.assemble(be, mk, mv, apart, win, True)
        except ValueError:
            continue
        yield ("append", f"{mk}/{mv}/apart={int(apart)}/win={win}/ragged", be), text


def tokens(header: str, source: str) -> list[str]:
    """The preprocessed token stream of header + source (one translation unit)."""
    out = subprocess.run(["g++", "-E", "-P", "-x", "c++", "-"], input=header + "\n" + source, text=True,
                         capture_output=True, check=True).stdout
    return _TOKEN.findall(out)


def hashes() -> dict[str, dict[str, str]]:
    out, seen = {}, {}
    for key, (header, source) in texts():
        raw = hashlib.sha256((header + "\0" + source).encode()).hexdigest()
        if raw not in seen:
            seen[raw] = hashlib.sha256("\n".join(tokens(header, source)).encode()).hexdigest()
        out[" | ".join(key)] = {"raw": raw, "tokens": seen[raw]}
    return out


def compare(before: dict, after: dict) -> int:
    missing = sorted(set(before) ^ set(after))
    same = [k for k in before if k in after and before[k]["raw"] == after[k]["raw"]]
    token_same = [k for k in before if k in after and before[k]["tokens"] == after[k]["tokens"]]
    differ = [k for k in before if k in after and before[k]["tokens"] != after[k]["tokens"]]
    kinds = sorted({k.split(" | ")[0] + " | " + k.split(" | ")[2] for k in before})
    print(f"{len(before)} texts: {len(same)} byte-identical, {len(token_same)} token-identical, "
          f"{len(differ)} different, {len(missing)} only on one side")
    for kb in kinds:
        ks = [k for k in before if k.split(" | ")[0] + " | " + k.split(" | ")[2] == kb]
        print(f"  {kb}: {len(ks)} texts, {sum(k in same for k in ks)} byte-identical, "
              f"{sum(k in token_same for k in ks)} token-identical")
    for k in differ[:20] + missing[:20]:
        print("  DIFFERS:", k)
    return 1 if differ or missing else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        with open(sys.argv[2], "w") as f:
            json.dump(hashes(), f, indent=0, sort_keys=True)
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(*(json.load(open(p)) for p in sys.argv[2:4])))
    else:
        sys.exit(__doc__)
