"""One layout per method of the spec, built from spec/formats.toml (`[methods.*]`): the record fields, the code
streams with their bit widths and tables, the side information, the sign streams (rotation, QJL sketch), the
grouping, and the kernels' method id. accelerated/ops, accelerated/kernels, accelerated/stream.py, attention and
the caches ask a layout instead of switching on method names.

A layout is read by role: KIVI's keys and values share field names but not shapes (formats.toml record_k /
record_v). Code streams are the record's uint32 fields in order; the kernels call them codes1 and codes2 and the
float fields after them f_s1 and f_s2 (accelerated/kernels/source.py). Pure Python: no MLX needed.
"""
from __future__ import annotations

import dataclasses
import functools
import re

from .. import spec

# The kernels' method ids (template arguments M, MK, MV; csrc/ switches on them). Not spec data: the numbering is
# the compiled kernels', fixed here once.
KERNEL_IDS = {"turboquant": 0, "turboquant_rvq": 1, "rabitq": 2, "turboquant_prod": 3, "kivi": 4, "mlx_affine": 5}

ROLES = ("k", "v")
TABLES = ("gaussian", "residual", "sign", "affine")
SIGN_PURPOSES = ("rotation", "qjl")       # rotation.md: purpose 0 and 1 of the PRNG streams
_WORDS = re.compile(r"W\((bits2|bits|1)(?:-(\d+))?\)")


@dataclasses.dataclass(frozen=True)
class Field:
    """One record field as formats.toml writes it: name, dtype ("uint32", "float32", "float16", "input") and
    shape axes (e.g. ("B", "H", "Q", "W(bits-1)"))."""
    name: str
    dtype: str
    shape: tuple[str, ...]

    def code_bits(self, p: spec.Params) -> int:
        """Bits per code of a uint32 code field, from its W(...) axis, for resolved params p."""
        m = _WORDS.fullmatch(self.shape[-1])
        if m is None:
            raise ValueError(f"spec: field {self.name} has no W(...) axis")
        base = {"bits": p.bits, "bits2": p.bits2, "1": 1}[m.group(1)]
        return base - int(m.group(2) or 0)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A method's layout. Traits:
    - `codes`: the code fields (record order), `tables`: the table each reads (formats.toml `tables`);
    - `side`: the float fields besides the window, `side_dtype` their dtype ("input": the input dtype);
    - `rotation` / `sketch`: draws the rotation signs sigma / the QJL signs tau (formats.toml `signs`);
    - `per_token`: each token encodes alone (else whole groups of G tokens: streaming.md);
    - `grouped`: takes a group size; `token_groups`: roles whose side rows cover G tokens (per-channel keys);
    - `kernel_id`: the kernels' template M."""
    name: str
    kernel_id: int
    records: tuple[tuple[str, tuple[Field, ...]], ...]      # (role, fields) for "k" and "v"
    tables: tuple[str, ...]
    signs: tuple[str, ...]
    per_token: bool
    grouped: bool
    token_groups: frozenset

    def record(self, role: str = "k") -> tuple[Field, ...]:
        if role not in ROLES:
            raise ValueError(f"role: must be 'k' or 'v', got {role!r}")
        return dict(self.records)[role]

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.record("k"))

    @property
    def codes(self) -> tuple[Field, ...]:
        return tuple(f for f in self.record("k") if f.dtype == "uint32")

    @property
    def side(self) -> tuple[Field, ...]:
        return tuple(f for f in self.record("k") if f.dtype != "uint32" and f.name != "window")

    @property
    def side_dtype(self) -> str:
        return self.side[0].dtype

    @property
    def rotation(self) -> bool:
        return "rotation" in self.signs

    @property
    def sketch(self) -> bool:
        return "qjl" in self.signs

    @property
    def affine(self) -> bool:
        return self.tables == ("affine",)

    def groups_tokens(self, role: str) -> bool:
        """Whether this role's side rows each cover G tokens (KIVI keys: scale and zero per channel)."""
        return role in self.token_groups

    def group_rows(self, role: str) -> frozenset:
        """Names of this role's fields with one row per group of G tokens (formats.toml axis Q/G)."""
        return self._group_rows[role]

    @functools.cached_property
    def _group_rows(self) -> dict:
        return {r: frozenset(f.name for f in fields if "Q/G" in f.shape) for r, fields in self.records}

    def code_bits(self, p: spec.Params) -> tuple[int, int]:
        """(bits of codes1, bits of codes2) as the kernels see them; 1 for codes2 where there is none."""
        bits = [f.code_bits(p) for f in self.codes]
        return bits[0], bits[1] if len(bits) > 1 else 1

    def kernel_fields(self) -> tuple[str | None, str | None, str | None, str | None]:
        """Record field names of the kernels' codes1, codes2, f_s1, f_s2 (None: the method has none)."""
        c, s = [f.name for f in self.codes], [f.name for f in self.side]
        return (c[0], c[1] if len(c) > 1 else None, s[0], s[1] if len(s) > 1 else None)

    def levels(self, p: spec.Params) -> int:
        """L = 2^bits - 1 of the affine methods (the kernels' f_k[K_LEVELS]), 0 for the others."""
        return (1 << p.bits) - 1 if self.affine else 0


def _fields(rows: list) -> tuple[Field, ...]:
    return tuple(Field(str(n), str(dt), tuple(s.split(","))) for n, dt, s in rows)


def build(name: str, info: dict, kernel_id: int) -> Layout:
    """The layout of method `name` from its formats.toml table `info`; ValueError (naming spec) where the data
    does not make one."""
    records = tuple((r, _fields(info["record"] if "record" in info else info[f"record_{r}"])) for r in ROLES)
    for role, fields in records:
        names = [f.name for f in fields]
        if names[-1] != "window" or names != [f.name for f in records[0][1]]:
            raise ValueError(f"spec: {name}'s record_{role} fields {names} must match the other role's and end "
                             "with window")
        codes = [f for f in fields if f.dtype == "uint32"]
        if not 1 <= len(codes) <= 2 or any(_WORDS.fullmatch(f.shape[-1]) is None for f in codes):
            raise ValueError(f"spec: {name} needs one or two uint32 code fields with a W(...) axis")
        side = [f for f in fields if f.dtype != "uint32" and f.name != "window"]
        if not 1 <= len(side) <= 2 or len({f.dtype for f in side}) != 1:
            raise ValueError(f"spec: {name} needs one or two side fields of one dtype, got {side}")
    tables = tuple(info["tables"])
    n_codes = sum(f.dtype == "uint32" for f in records[0][1])
    if len(tables) != n_codes or set(tables) - set(TABLES):
        raise ValueError(f"spec: {name}'s tables {list(tables)} must name one of {TABLES} per code field")
    signs = tuple(info["signs"])
    if set(signs) - set(SIGN_PURPOSES) or ("qjl" in signs and "rotation" not in signs):
        raise ValueError(f"spec: {name}'s signs {list(signs)} must be purposes of {SIGN_PURPOSES}, qjl with rotation")
    token_groups = frozenset(r for r, fields in records for f in fields if "Q/G" in f.shape)
    return Layout(name, kernel_id, records, tables, signs, bool(info["per_token"]), "group_sizes" in info,
                  token_groups)


@functools.lru_cache(maxsize=None)
def _all() -> dict[str, Layout]:
    if set(KERNEL_IDS) != set(spec.METHODS) or sorted(KERNEL_IDS.values()) != list(range(len(KERNEL_IDS))):
        raise ValueError(f"KERNEL_IDS: {KERNEL_IDS} must number the spec's methods {spec.METHODS} 0..n-1")
    return {m: build(m, spec.method_info(m), KERNEL_IDS[m]) for m in spec.METHODS}


def layout(method: str) -> Layout:
    """The layout of a method by name; ValueError naming `method` if unknown."""
    if method not in spec.METHODS:
        raise ValueError(f"method: unknown method {method!r}; expected one of {', '.join(spec.METHODS)}")
    return _all()[method]


def of(p: spec.Params) -> Layout:
    """The layout of p's method."""
    return layout(p.method)


def by_kernel_id(m: int) -> Layout:
    """The layout with kernel method id m (the kernels' template M / MK / MV)."""
    for lay in _all().values():
        if lay.kernel_id == m:
            return lay
    raise ValueError(f"m: no method has kernel id {m!r}")
