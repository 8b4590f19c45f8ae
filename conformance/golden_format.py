"""The golden file format (golden/README.md): bit-pattern codec, case objects, manifest entries, readers,
the stream-op replay that a stream case means, and the bit-level array diff.

The one module that both the conformance suite and the generator (tools/golden/) use; it imports only
spec and numpy. Writing the files (TOML emitter, deterministic npz) is the generator's job
(tools/golden/write.py); generating expected values is tools/golden/generate.py's.
"""
from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import re
import struct
import sys
import zipfile
from typing import Iterator

import numpy as np

from .. import spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# golden/ sits next to conformance/ both in the repository and in the installed package;
# VELOXQUANT_GOLDEN_DIR points elsewhere (a copy under test).
ROOT = pathlib.Path(os.environ.get("VELOXQUANT_GOLDEN_DIR") or
                    pathlib.Path(__file__).resolve().parent.parent / "golden")
COMPONENT_FILES = ("prng", "rotation", "packing", "codebooks", "headdims", "cast")


# ----------------------------------------------------------------------------------------------------
# Exact array <-> bit-pattern conversion (numpy interchange of docs/interfaces.md)

_STORAGE = {  # label -> (numpy dtype of the interchange array, unsigned view, hex digits)
    "float16": (np.float16, np.uint16, 4),
    "bfloat16": (np.uint16, np.uint16, 4),
    "float32": (np.float32, np.uint32, 8),
    "float64": (np.float64, np.uint64, 16),
    "uint16": (np.uint16, np.uint16, 4),
    "uint32": (np.uint32, np.uint32, 8),
    "uint64": (np.uint64, np.uint64, 16),
    "int64": (np.int64, np.uint64, 16),
}


def _label(a: np.ndarray, input_dtype: str | None = None) -> str:
    """Storage label of an interchange array; uint16 arrays are bf16 bit patterns when the input is bf16."""
    if a.dtype == np.uint16 and input_dtype == "bfloat16":
        return "bfloat16"
    return a.dtype.name


def _bits(a: np.ndarray, label: str) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=_STORAGE[label][0]).view(_STORAGE[label][1])


def _from_hex(label: str, shape, hexes) -> np.ndarray:
    npdt, view, _ = _STORAGE[label]
    raw = np.array([int(h, 16) for h in hexes], dtype=view)
    return raw.view(npdt).reshape(shape)



def hx(v: int, digits: int) -> str:
    return f"0x{v:0{digits}X}"


def hexarr(a: np.ndarray, label: str) -> list[str]:
    digits = _STORAGE[label][2]
    return [hx(int(v), digits) for v in _bits(a, label).reshape(-1)]


# ----------------------------------------------------------------------------------------------------
# Case objects


@dataclasses.dataclass(frozen=True)
class ExpectedError:
    type: str       # exception class name, e.g. "ValueError"
    argument: str   # the argument name the message must mention


@dataclasses.dataclass
class GoldenCase:
    id: str
    kind: str                       # "encode" | "stream" | "error" | "decode_error"
    method: str
    params: spec.Params
    dtype: str
    shape: tuple
    flags: tuple
    comment: str
    file: str
    x: np.ndarray | None = None
    ops: tuple | None = None        # stream: (("append", n) | ("trim", n), ...); see replay
    record: dict | None = None      # expected record (field -> array)
    decoded: np.ndarray | None = None
    trimmed: np.ndarray | None = None  # stream: return values of trim, in order
    error: ExpectedError | None = None

    def expected_error_matches(self, exc: BaseException) -> bool:
        """The exception is of the expected type and its message names the argument (as a word)."""
        return (type(exc).__name__ == self.error.type
                and re.search(rf"(?<![A-Za-z0-9_]){re.escape(self.error.argument)}(?![A-Za-z0-9_])",
                              str(exc)) is not None)




def params_to_toml(p: spec.Params) -> dict:
    d = {}
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        if v is None or f.name == "method" or (f.name == "exact_trim" and v == 0):
            continue
        d[f.name] = f"0x{v:X}" if f.name == "seed" and isinstance(v, int) and v >= 0 else v
    return d


def params_from_toml(method: str, d: dict) -> spec.Params:
    kw = dict(d)
    if isinstance(kw.get("seed"), str):
        kw["seed"] = int(kw["seed"], 16)
    return spec.Params(method=method, **kw)




def case_arrays(c: GoldenCase) -> dict[str, np.ndarray]:
    """Field name -> array: x, record.<field>, decoded, trimmed (what the data files hold)."""
    out = {"x": c.x}
    for k, v in (c.record or {}).items():
        out[f"record.{k}"] = v
    if c.decoded is not None:
        out["decoded"] = c.decoded
    if c.trimmed is not None:
        out["trimmed"] = c.trimmed
    return out



def manifest_entry(c: GoldenCase) -> dict:
    e = {"id": c.id, "kind": c.kind, "method": c.method, "file": c.file, "dtype": c.dtype,
         "shape": list(c.shape), "flags": list(c.flags), "comment": c.comment,
         "params": params_to_toml(c.params)}
    if c.ops is not None:
        e["ops"] = [{"op": op, "n": n} for op, n in c.ops]
    if c.error is not None:
        e["error"] = {"type": c.error.type, "argument": c.error.argument}
    return e



# ----------------------------------------------------------------------------------------------------
# Reading golden/

def npz_read(data: bytes) -> dict[str, np.ndarray]:
    """Read every member without trusting its CRC, so that a flipped byte is reported per field."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            off = info.header_offset
            name_len, extra_len = struct.unpack("<HH", data[off + 26:off + 30])
            start = off + 30 + name_len + extra_len
            raw = data[start:start + info.compress_size]
            if info.compress_type != zipfile.ZIP_STORED:
                raw = z.read(info)
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            out[key] = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    return out



def _root(root) -> pathlib.Path:
    return ROOT if root is None else pathlib.Path(root)


def load_manifest(root=None) -> dict:
    with open(_root(root) / "manifest.toml", "rb") as f:
        return tomllib.load(f)


def _arrays_from_toml(data: bytes) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for c in tomllib.loads(data.decode()).get("case", []):
        fields = {}
        for k, v in c.items():
            if k in ("id", "comment"):
                continue
            if k == "record":
                for rk, rv in v.items():
                    fields[f"record.{rk}"] = _from_hex(rv["dtype"], rv["shape"], rv["hex"])
            else:
                fields[k] = _from_hex(v["dtype"], v["shape"], v["hex"])
        out[c["id"]] = fields
    return out


def _arrays_from_npz(data: bytes) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, a in npz_read(data).items():
        cid, field = key.split("/", 1)
        out.setdefault(cid, {})[field.replace("/", ".")] = a
    return out


def file_arrays(path: pathlib.Path) -> dict[str, dict[str, np.ndarray]]:
    data = path.read_bytes()
    return _arrays_from_toml(data) if path.suffix == ".toml" else _arrays_from_npz(data)


def case_from_entry(e: dict, arrays: dict[str, np.ndarray]) -> GoldenCase:
    rec = {k[len("record."):]: v for k, v in arrays.items() if k.startswith("record.")}
    err = e.get("error")
    return GoldenCase(
        id=e["id"], kind=e["kind"], method=e["method"], params=params_from_toml(e["method"], e["params"]),
        dtype=e["dtype"], shape=tuple(e["shape"]), flags=tuple(e["flags"]), comment=e["comment"],
        file=e["file"], x=arrays.get("x"), ops=tuple((o["op"], o["n"]) for o in e["ops"]) if "ops" in e else None,
        record=rec or None, decoded=arrays.get("decoded"), trimmed=arrays.get("trimmed"),
        error=ExpectedError(err["type"], err["argument"]) if err else None)


def iter_cases(root=None, *, methods=None, kinds=None, flags=None) -> Iterator[GoldenCase]:
    """Golden method cases in manifest order, optionally filtered by method, kind or any flag."""
    root = _root(root)
    man = load_manifest(root)
    cache: dict[str, dict] = {}
    for e in man.get("case", []):
        if methods is not None and e["method"] not in methods:
            continue
        if kinds is not None and e["kind"] not in kinds:
            continue
        if flags is not None and not set(flags) & set(e["flags"]):
            continue
        if e["file"] not in cache:
            cache[e["file"]] = file_arrays(root / e["file"])
        yield case_from_entry(e, cache[e["file"]].get(e["id"], {}))


def iter_vectors(name: str, root=None) -> dict[str, list[dict]]:
    """Component vectors of cases/<name>.toml (prng, rotation, packing, codebooks), hex strings as stored."""
    with open(_root(root) / "cases" / f"{name}.toml", "rb") as f:
        return tomllib.load(f)


# ----------------------------------------------------------------------------------------------------


def on_disk_files(root) -> set[str]:
    root = _root(root)
    if not root.is_dir():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------------------------------
# What a stream case's ops mean (run on any stream object: the reference's, an implementation's)

class ReplayMismatch(AssertionError):
    """A stream op of a golden case did not behave as the case requires (a rejected append was accepted,
    raised something else, or changed the state)."""


def _same_state(a: dict | None, b: dict | None) -> bool:
    a, b = a or {}, b or {}
    return list(a) == list(b) and all(
        np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.asarray(a[k]).shape == np.asarray(b[k]).shape
        and np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)


# Spec 1.2: rejected chunks that do not continue the stream (number-model.md 'Which error is reported'
# step 7 and step 4). Each takes the next n tokens of x, like `reject`, and changes them so:
def _other_dtype(c: np.ndarray) -> np.ndarray:
    """float16 / bfloat16 (uint16 patterns) chunk -> float32 array of the same values; float32 -> float16."""
    if c.dtype == np.float32:
        with np.errstate(over="ignore"):
            return c.astype(np.float16)
    if c.dtype == np.uint16:   # bfloat16 bit patterns
        return (c.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return c.astype(np.float32)


CHUNK_MISMATCH = {
    "reject_dtype": _other_dtype,                                 # the array's dtype is not the stream's
    "reject_batch": lambda c: np.concatenate([c, c], axis=0),     # B doubled
    "reject_heads": lambda c: np.concatenate([c, c], axis=1),     # H doubled
    "reject_dim": lambda c: np.concatenate([c, c], axis=3),       # d doubled (a supported head dim)
}
STREAM_OPS = ("append", "trim", "reject", "save_load", "reject_trim") + tuple(CHUNK_MISMATCH)


def _names(e: Exception, arg: str) -> bool:
    """The message starts with the argument's name and a colon (number-model.md 'Error messages')."""
    return re.match(rf"\s*{re.escape(arg)}\s*:", str(e)) is not None


def replay(stream, x: np.ndarray, ops, reload=None):
    """Run a stream case's ops on any stream object (append, trim, record, tokens); returns
    (final stream, what each trim returned). Ops:
    ("append", n): feed the next n tokens of x (as a C-contiguous array);
    ("trim", n): trim n;
    ("reject", n): feed the next n tokens, which must raise ValueError naming `x` and leave the stream's
      tokens and record unchanged (else ReplayMismatch);
    ("reject_dtype" | "reject_batch" | "reject_heads" | "reject_dim", n): the next n tokens changed by
      CHUNK_MISMATCH (another dtype; B, H or d doubled): rejected like "reject";
    ("reject_trim", n): trim(-n) must raise ValueError naming `n` and leave the state unchanged;
    ("save_load", 0): stream = reload(stream), the stream saved and loaded (`reload` must be given)."""
    pos, trimmed = 0, []
    for i, (op, n) in enumerate(ops):
        if op in CHUNK_MISMATCH or op == "reject_trim":
            before = (stream.tokens, stream.record())
            chunk = None if op == "reject_trim" else np.ascontiguousarray(CHUNK_MISMATCH[op](x[:, :, pos:pos + n]))
            arg = "n" if op == "reject_trim" else "x"
            try:
                stream.trim(-n) if chunk is None else stream.append(chunk)
            except ValueError as e:
                if not _names(e, arg):
                    raise ReplayMismatch(f"op {i} ({op} {n}): ValueError does not name {arg}: {e}") from e
            else:
                raise ReplayMismatch(f"op {i} ({op} {n}): accepted; expected ValueError naming {arg}")
            if chunk is not None:
                pos += n
            if stream.tokens != before[0] or not _same_state(stream.record(), before[1]):
                raise ReplayMismatch(f"op {i} ({op} {n}): the rejected call changed the state")
            continue
        if op == "append":
            try:
                stream.append(np.ascontiguousarray(x[:, :, pos:pos + n]))
            except ValueError as e:
                raise ReplayMismatch(f"op {i} (append {n}): rejected ({e}); the case expects it accepted") from e
            pos += n
        elif op == "trim":
            trimmed.append(int(stream.trim(n)))
        elif op == "reject":
            before = (stream.tokens, stream.record())
            try:
                stream.append(np.ascontiguousarray(x[:, :, pos:pos + n]))
            except ValueError as e:
                if not re.match(r"\s*x\b", str(e)):
                    raise ReplayMismatch(f"op {i} (reject {n}): ValueError does not name x: {e}") from e
            else:
                raise ReplayMismatch(f"op {i} (reject {n}): the append was accepted; expected ValueError naming x")
            pos += n
            if stream.tokens != before[0] or not _same_state(stream.record(), before[1]):
                raise ReplayMismatch(f"op {i} (reject {n}): the rejected append changed the state")
        elif op == "save_load":
            if reload is None:
                raise ValueError("ops: a save_load op needs `reload`")
            stream = reload(stream)
        else:
            raise ValueError(f"ops: unknown op {op!r}")
    return stream, trimmed



# ----------------------------------------------------------------------------------------------------
# Bit-level comparison of two arrays

_VIEW = {2: np.uint16, 4: np.uint32, 8: np.uint64, 1: np.uint8}


def diff_arrays(where: str, golden: np.ndarray, fresh: np.ndarray) -> str | None:
    """None if bit-identical, else: first differing index, both values in hex, XOR popcount."""
    if golden.dtype != fresh.dtype or golden.shape != fresh.shape:
        return (f"{where}: golden {golden.dtype}{list(golden.shape)} vs regenerated "
                f"{fresh.dtype}{list(fresh.shape)}")
    view = _VIEW[golden.dtype.itemsize]
    g = np.ascontiguousarray(golden).view(view).reshape(-1)
    f = np.ascontiguousarray(fresh).view(view).reshape(-1)
    bad = np.flatnonzero(g != f)
    if bad.size == 0:
        return None
    i = int(bad[0])
    digits = 2 * golden.dtype.itemsize
    x = int(g[i]) ^ int(f[i])
    idx = tuple(int(v) for v in np.unravel_index(i, golden.shape)) if golden.ndim else ()
    return (f"{where}: first difference at index {list(idx)} (flat {i}): golden 0x{int(g[i]):0{digits}X}, "
            f"regenerated 0x{int(f[i]):0{digits}X}, xor 0x{x:0{digits}X} ({bin(x).count('1')} bit(s)); "
            f"{bad.size} of {g.size} element(s) differ")



# ----------------------------------------------------------------------------------------------------
# Attention cases (spec 1.2, spec/attention.md): manifest `[[attention]]` + bulk/attention.npz

@dataclasses.dataclass
class AttentionCase:
    id: str
    method: str
    k_params: spec.Params
    v_params: spec.Params
    dtype: str
    scale: float                    # a binary32 value (stored as a hex float)
    mask: str | None                # None | "causal"
    flags: tuple
    comment: str
    q: np.ndarray                   # float32 (B, Hq, Tq, d)
    k_record: dict
    v_record: dict
    out: np.ndarray                 # float64 (B, Hq, Tq, d): the formula on the decoded records
    budget: np.ndarray              # float64, per output (spec/attention.md 'Budget')
    k_x: np.ndarray | None = None   # the inputs the records were encoded from (absent for the long case)
    v_x: np.ndarray | None = None


def iter_attention_cases(root=None, *, methods=None) -> Iterator[AttentionCase]:
    root = _root(root)
    arrays: dict[str, dict] = {}
    for e in load_manifest(root).get("attention", []):
        if methods is not None and e["method"] not in methods:
            continue
        if e["file"] not in arrays:
            raw: dict[str, dict] = {}
            for key, a in npz_read((root / e["file"]).read_bytes()).items():
                cid, field = key.split("/", 1)
                raw.setdefault(cid, {})[field] = a
            arrays[e["file"]] = raw
        a = arrays[e["file"]][e["id"]]
        rec = {r: {k.split("/", 2)[2]: v for k, v in a.items() if k.startswith(f"{r}/record/")} for r in "kv"}
        yield AttentionCase(e["id"], e["method"], params_from_toml(e["method"], e["k_params"]),
                            params_from_toml(e["method"], e["v_params"]), e["dtype"], float.fromhex(e["scale"]),
                            None if e["mask"] == "none" else e["mask"], tuple(e["flags"]), e["comment"], a["q"],
                            rec["k"], rec["v"], a["out"], a["budget"], a.get("k/x"), a.get("v/x"))
