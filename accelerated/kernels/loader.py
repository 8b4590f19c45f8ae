"""The kernel sources under csrc/ (package data) composed into the texts MLX compiles (mx.fast.metal_kernel, and
backend.cuda_kernel on CUDA): preludes and headers per backend (`<backend>_*`, `.cuh` CUDA, `.metal` Metal), one
file per kernel body and per shared fragment (`.h`, the same text for both backends).

Two mechanisms, both the C preprocessor's:
- `#include "file"` in a source file is spliced in here (recursively), since MLX hands NVRTC and Metal one text;
  `#include NAME` (a computed include) is spliced in from the file the composing call binds NAME to;
- a file's parameters are macros (listed in its first comment): the composing call writes them as `#define` lines
  before it (`defines`), and a fragment included several times `#undef`s its own at its end.
No Python edits the text: a kernel is files and #define lines in order, with the #include lines resolved as the
C preprocessor would (tests/_kernel_texts.py compares kernels as preprocessed tokens). A body file is a kernel
function's body (MLX writes the signature): C++ to editors and formatters, not a translation unit of its own.
"""
from __future__ import annotations

import functools
import pathlib
import re

from ... import spec

CSRC = pathlib.Path(__file__).with_name("csrc")
EXT = {"cuda": "cuh", "metal": "metal"}
_INCLUDE = re.compile(r'^#include[ \t]+(?:"([\w.]+)"|([A-Z_][A-Z0-9_]*))[ \t]*$', re.M)


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    path = CSRC / name
    if not path.is_file():
        raise ValueError(f"name: no kernel source {name!r} in {CSRC}")
    return path.read_text()


def text(name: str, files: dict[str, str] | None = None) -> str:
    """csrc file `name` with its includes spliced in; `files` binds the computed includes (#include NAME)."""
    files = files or {}

    def splice(m: re.Match) -> str:
        target = m.group(1) or files.get(m.group(2))
        if target is None:
            raise ValueError(f"files: {name} includes {m.group(2)}, which is not bound to a file")
        body = text(target, files)
        return body[:-1] if body.endswith("\n") else body

    return _INCLUDE.sub(splice, _read(name))


def backend_file(stem: str, backend: str) -> str:
    """`stem` for `backend` ("cuda" | "metal"): the file `<stem>.cuh` or `<stem>.metal`, text spliced."""
    if backend not in EXT:
        raise ValueError(f"backend: {backend!r} is not one of {sorted(EXT)}")
    return text(f"{stem}.{EXT[backend]}")


def defines(params: dict) -> str:
    """`#define NAME value` lines binding a file's parameters (an empty value defines NAME as nothing)."""
    return "".join(f"#define {k} {v}\n" if str(v) else f"#define {k}\n" for k, v in params.items())


@functools.lru_cache(maxsize=None)
def hadamard() -> str:
    """VQ_H<m> and VQ_HT<m>, m = 12, 20, 28: the rows of H_m and H_m^T of spec/formats.toml as 32-bit masks (bit k
    set where entry (j, k) is -1), which the encode body (hadamard.h, VQ_H*) and the decode body (VQ_HT*) compile in."""
    out = {}
    for t in (False, True):
        for m in (12, 20, 28):
            hm = spec.hadamard_matrix(m)
            hm = hm.T if t else hm
            words = [sum(1 << k for k in range(m) if hm[j, k] < 0) for j in range(m)]
            out[f"VQ_H{'T' if t else ''}{m}"] = ", ".join(f"0x{w:07x}u" for w in words)
    return defines(out)
