"""Loader for the machine-readable spec data (formats.toml, codebooks.toml).

The only code in spec/: it turns the TOML into small typed objects. Every layer (reference, accelerated,
conformance, tools) reads constants through here, never by copying them.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = pathlib.Path(__file__).resolve().parent
METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "kivi", "rabitq", "mlx_affine")
DTYPES = ("float16", "bfloat16", "float32")


@functools.lru_cache(maxsize=None)
def formats() -> dict:
    with open(HERE / "formats.toml", "rb") as f:
        return tomllib.load(f)


@functools.lru_cache(maxsize=None)
def codebooks() -> dict:
    with open(HERE / "codebooks.toml", "rb") as f:
        return tomllib.load(f)


SPEC_VERSION: str = formats()["spec_version"]
HEAD_DIMS: tuple[int, ...] = tuple(formats()["head_dims"])
HADAMARD_RADICES: tuple[int, ...] = tuple(formats()["head_dim_radices"])   # m of d = m * 2^k


def split_head_dim(d: int) -> tuple[int, int]:
    """(m, n) with d = m * n, m in HADAMARD_RADICES, n a power of two (rotation.md). The odd part of d
    decides m (1, 3, 5, 7 for m = 1, 12, 20, 28), so the split is unique. ValueError (naming x) otherwise."""
    for m in HADAMARD_RADICES:
        if d % m == 0 and d // m > 0 and (d // m) & (d // m - 1) == 0:
            return m, d // m
    raise ValueError(f"x: head dim {d} is not m * 2^k with m in {HADAMARD_RADICES}")


@functools.lru_cache(maxsize=None)
def hadamard_matrix(m: int) -> np.ndarray:
    """H_m of formats.toml `[hadamard]` as a read-only float32 (m, m) array of +-1 (row j, column k);
    H_1 = [[1]]."""
    if m == 1:
        h = np.ones((1, 1), dtype=np.float32)
    else:
        rows = formats()["hadamard"][str(m)]
        h = np.array([[1.0 if c == "+" else -1.0 for c in row] for row in rows], dtype=np.float32)
        if h.shape != (m, m) or any(len(r) != m or set(r) - {"+", "-"} for r in rows):
            raise ValueError(f"spec: hadamard {m} is not an {m} x {m} matrix of '+'/'-'")
    h.setflags(write=False)
    return h


def hexf32(s: str) -> np.float32:
    """A hex-float string as binary32; raises if the value is not exactly representable."""
    v = float.fromhex(s)
    f = np.float32(v)
    if float(f) != v:
        raise ValueError(f"spec constant {s} is not a binary32 value")
    return f


def scale(d: int) -> np.float32:
    """s_d = 1/sqrt(d) rounded to binary32 (rotation.md)."""
    return hexf32(formats()["scale"][str(d)])


def qjl_scale(d: int) -> np.float32:
    """A_d = sqrt(pi/(2d)) rounded to binary32 (methods/turboquant_prod.md)."""
    return hexf32(formats()["qjl_scale"][str(d)])


def rint_magic() -> np.float32:
    return hexf32(formats()["rint_magic"])


@dataclasses.dataclass(frozen=True)
class Codebook:
    """Centroids C (K values) and boundaries B (K-1 values) in N(0,1) units, binary32."""
    centroids: np.ndarray
    boundaries: np.ndarray

    @property
    def bits(self) -> int:
        return int(self.centroids.size).bit_length() - 1


def _table(t: dict) -> Codebook:
    c = np.array([hexf32(v) for v in t["centroids"]], dtype=np.float32)
    b = np.array([hexf32(v) for v in t["boundaries"]], dtype=np.float32)
    c.setflags(write=False)
    b.setflags(write=False)
    return Codebook(c, b)


@functools.lru_cache(maxsize=None)
def gaussian(bits: int) -> Codebook:
    """Stage-1 / MSE Lloyd-Max table of N(0,1) at `bits` (codebooks.md)."""
    return _table(codebooks()["gaussian"][str(bits)])


@functools.lru_cache(maxsize=None)
def residual(bits: int, bits2: int) -> Codebook:
    """Laplacian-fit residual table for stage-1 `bits`, stage-2 `bits2` (codebooks.md)."""
    return _table(codebooks()["residual"][str(bits)][str(bits2)])


def words_per_row(n: int, bits: int) -> int:
    """W_b(n) = ceil(n / (32 div b)) (packing.md)."""
    k = 32 // bits
    return -(-n // k)


def method_info(method: str) -> dict:
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r}; expected one of {', '.join(METHODS)}")
    return formats()["methods"][method]


@dataclasses.dataclass(frozen=True)
class Params:
    """Parameters of one stream (spec/README.md 'Common parameters'). `None` fields take defaults."""
    method: str
    bits: int | None = None
    bits2: int | None = None
    group_size: int | None = None
    window: int | None = None
    seed: int = 0
    layer: int = 0
    head_offset: int = 0
    role: str = "k"
    exact_trim: int | None = None   # E (streaming.md "Exact trims"); None: formats.toml default_exact_trim

    def __hash__(self) -> int:
        # the dataclass's hash of the fields, made once: Params key the kernels' per-shape caches, looked up
        # several times per layer and decode step
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(dataclasses.astuple(self))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # str hashes differ between processes: a pickled Params must not carry this one's
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def resolved(self) -> "Params":
        """A copy with defaults filled in and every value checked; ValueError names the parameter."""
        info = method_info(self.method)
        lim = formats()["limits"]
        bits = info["default_bits"] if self.bits is None else self.bits
        _check_int("bits", bits, allowed=info["bits"])
        bits2 = None
        if self.method == "turboquant_rvq":
            if self.bits2 is None:   # formats.toml default_bits2 = "bits": equal to bits
                bits2 = bits if info["default_bits2"] == "bits" else info["default_bits2"]
            else:
                bits2 = self.bits2
            _check_int("bits2", bits2, allowed=info["bits2"])
        elif self.bits2 is not None:
            raise ValueError(f"bits2: only turboquant_rvq takes bits2, not {self.method}")
        group = None
        if "group_sizes" in info:
            group = info["default_group_size"] if self.group_size is None else self.group_size
            _check_int("group_size", group, allowed=info["group_sizes"])
        elif self.group_size is not None:
            raise ValueError(f"group_size: {self.method} takes no group_size")
        window = info["default_window"] if self.window is None else self.window
        _check_int("window", window, lo=0, hi=lim["window_max"])
        _check_int("seed", self.seed, lo=0, hi=int(lim["seed_max"], 16))
        _check_int("layer", self.layer, lo=0, hi=lim["layer_max"])
        _check_int("head_offset", self.head_offset, lo=0, hi=lim["head_offset_max"])
        if self.role not in ("k", "v"):
            raise ValueError(f"role: must be 'k' or 'v', got {self.role!r}")
        exact = formats()["default_exact_trim"] if self.exact_trim is None else self.exact_trim
        _check_int("exact_trim", exact, lo=0, hi=lim["exact_trim_max"])
        return dataclasses.replace(self, bits=bits, bits2=bits2, group_size=group, window=window,
                                   exact_trim=int(exact))

    @property
    def role_id(self) -> int:
        return 0 if self.role == "k" else 1

    def check_head_dim(self, d: int) -> None:
        """x's head dim d is supported (x), and the group size fits it (group_size): methods whose groups
        run along d (formats.toml group_divides_head_dim: kivi values, mlx_affine) need G to divide d.
        Called after the shape checks of x and before any check of x's values (number-model.md
        'Which error is reported')."""
        if d not in HEAD_DIMS:
            raise ValueError(f"x: head dim {d} is not supported; expected one of {HEAD_DIMS}")
        info = method_info(self.method)
        g = self.group_size
        if g is not None and self.role in info.get("group_divides_head_dim", ()) and d % g:
            what = "exceeds" if g > d else "does not divide"
            raise ValueError(f"group_size: {g} {what} head dim {d} ({self.method}, role {self.role!r}: "
                             "groups run along the head dim, so G must divide d)")

    def encoded_tokens(self, t: int) -> int:
        """Q(T): tokens in the encoded prefix after one-shot encode of T tokens (streaming.md)."""
        r = max(t - self.window, 0)
        if self.method == "kivi":
            return self.group_size * (r // self.group_size)
        return r

    def kept_capacity(self) -> int:
        """C: how many flushed tokens a stream keeps exactly (streaming.md "Exact trims"): E for per-token
        methods, E rounded up to whole groups of G for kivi."""
        e = self.exact_trim or 0
        if self.method == "kivi":
            return self.group_size * -(-e // self.group_size)
        return e

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _check_int(name: str, v, *, allowed=None, lo=None, hi=None) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name}: must be an integer, got {type(v).__name__} {v!r}")
    if allowed is not None and int(v) not in allowed:
        raise ValueError(f"{name}: {v} is not supported; expected one of {list(allowed)}")
    if lo is not None and not (lo <= int(v) <= hi):
        raise ValueError(f"{name}: {v} is outside [{lo}, {hi}]")
