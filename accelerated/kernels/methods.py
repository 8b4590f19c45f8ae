"""Every method of the spec through the fused kernels (spec/methods/*.md). Each `KernelMethod` looks like an
accelerated.ops method module to its callers (`NAME`, `encode_tokens`, `decode_tokens`, `encode`, `decode`),
so accelerated.stream.Stream can use it, and adds `encode_chunk` (encode a prefix and check a chunk for
NaN/Inf in the same launch) and `encode_launch` (the kernel alone, lazy).

Record layout and the shape/parameter checks are accelerated.ops's (accelerated.ops.record / numerics), so
both paths frame the same bytes. The data-dependent checks (NaN/Inf in x, then the method's rule: norm
overflow, KIVI's float16 overflow, mlx_affine's span overflow) come out of the encode kernel as flags, one
pair per threadgroup, and go to accelerated.ops.numerics.fault in that order: outside `deferred_checks()`
that raises the same ValueError as accelerated.ops (one host sync, after the launch); inside, it records the
lazy flags and nothing waits. Tables and sign vectors are accelerated.ops's (host-side, cached).
Whatever a kernel does not cover (no GPU now, launch limits) runs accelerated.ops.
"""
from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from ... import spec
from .. import layouts, ops, tuning
from . import backend, source
from ..ops import codebooks, numerics, packing, prng, record

# record field names of the kernel outputs codes1, codes2, f_s1, f_s2 (None: output unused)
FIELDS = {m: layouts.layout(m).kernel_fields() for m in spec.METHODS}
# The rule each method applies to the tokens it encodes (its accelerated.ops module's RULE, word for word).
RULES = {m: ops.method_module(m).RULE for m in spec.METHODS}
NONFINITE = numerics.NONFINITE
# Launch shape (tuning's big_warps, block_cap, max_warps) and code specialization (specialize_rows: launches of at
# least that many rows compile their code widths, group size and KIVI role in, one kernel per configuration;
# smaller ones read them from meta, one kernel per method, head dim and dtype) come from accelerated.tuning.
GENERIC = (0, 0, 0, -1)  # code constants meaning "read meta" (csrc/common.h)
_MAX_ROWS = 2**31 - 1    # rows are counted in int32 in the kernels
_EPS = float.fromhex("0x1.ad7f2ap-24")
_FMAX = float(np.finfo(np.float32).max)


@functools.lru_cache(maxsize=None)
def _dummy(dtype) -> mx.array:
    """A one-element stand-in for an input or output a method does not use."""
    return mx.zeros((1,), dtype=dtype)


def order(token: mx.array | None) -> mx.array:
    """A store's token as an input that only orders a launch after that store (the kernels never read it), in one
    dtype, bool, whichever store made it (a commit's uint32, a decode step's bool): the launches that take it then
    compile once, not again mid-generation when a buffer's growth first puts a commit before a decode step."""
    if token is None:
        return _dummy(mx.bool_)
    return token if token.dtype == mx.bool_ else token.astype(mx.bool_)


@functools.lru_cache(maxsize=None)
def _consts(d: int, levels: int = 0) -> mx.array:
    """f_k (source.py): [s_d, A_d, 2^23, rint magic, EPS, L, FLT_MAX, 0]."""
    k = mx.array([float(spec.scale(d)), float(spec.qjl_scale(d)), 8388608.0, float(spec.rint_magic()),
                  _EPS, float(levels), _FMAX, 0.0], dtype=mx.float32)
    mx.eval(k)
    return k


@functools.lru_cache(maxsize=4096)
def _meta(bits1: int, bits2: int, group: int, keys: int, q: int = 0, lo: int = 0) -> mx.array:
    """meta (source.py): [0, bits of codes1, bits of codes2, G, keys, Q, first checked token, 0]
    (cached: a decode step reuses the same small array instead of making one per call)."""
    m = mx.array([0, bits1, bits2, group, keys, q, lo, 0], dtype=mx.int32)
    mx.eval(m)
    return m


# CUDA (tuning's device_counts): counts are views into an arange in device memory instead of arrays the host
# writes. MLX's CUDA allocator puts every array the host creates, and every buffer of at most 8 bytes, in managed
# memory (the scalar pool shares a few pages): a count written by the host each decode step is a page the GPU must
# fault back. A view makes no host write and no launch (a slice shares its buffer).
_RANGE: list = []            # [the arange the views point into]


def count(n: int) -> mx.array:
    """A token or row count as a one-element int32 input (append's first row, attention's encoded count),
    made once per value: a decode step's layers, and the next step's other kernel, reuse it."""
    return _count(n, tuning.current().device_counts)


@functools.lru_cache(maxsize=1 << 16)
def _count(n: int, device_counts: bool) -> mx.array:
    # the backend is asked once per value (a few us of host time per call on the H200's host)
    if device_counts and backend.backend() == "cuda":
        return _device_count(n)
    return _host_count(n)


def _host_count(n: int) -> mx.array:
    a = mx.array([n], dtype=mx.int32)
    mx.eval(a)
    return a


def _device_count(n: int) -> mx.array:
    if n < 0:
        raise ValueError(f"count: n must be >= 0, got {n}")
    if not _RANGE or _RANGE[0].shape[0] <= n:     # grown by doubling: a few arange launches per process
        _RANGE[:] = [mx.arange(max(1 << 16, 1 << n.bit_length() + 1), dtype=mx.int32)]
    return _RANGE[0][n:n + 1]


def _code_bits(p: spec.Params) -> tuple[int, int]:
    """(bits of codes1, bits of codes2) as the kernels see them (layouts.Layout.code_bits)."""
    return layouts.of(p).code_bits(p)


def _sorted(b: mx.array) -> mx.array:
    """The kernels count crossings by binary search, which equals the spec's count only for sorted tables."""
    v = np.array(b)
    if np.any(v[1:] < v[:-1]):
        raise RuntimeError("codebook boundaries are not sorted: the kernels' binary search needs them sorted")
    return b


@functools.lru_cache(maxsize=None)
def _tables_for(method: str, bits: int, bits2: int, d: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    z = _dummy(mx.float32)
    tables = layouts.layout(method).tables
    if tables[0] != "gaussian":         # the encode kernel quantizes with gaussian / residual tables only
        return z, z, z, z
    c1, bd1 = codebooks.gaussian(bits, d)
    if tables[1:] == ("residual",):
        c2, bd2 = codebooks.residual(bits, bits2, d)
        return c1, _sorted(bd1), c2, _sorted(bd2)
    return c1, _sorted(bd1), z, z


def _tables(p: spec.Params, d: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(C1_d, B1_d, C2_d, B2_d); unused ones are dummies."""
    b1, b2 = _code_bits(p)
    return _tables_for(p.method, b1, b2, d)


@functools.lru_cache(maxsize=1024)
def _sign_words(seed: int, layer: int, head_offset: int, heads: int, role: int, purpose: int,
                d: int) -> mx.array:
    """Sign vectors as bits (H, ceil(d/32)) uint32: bit j mod 32 of word j div 32 set where sigma_j = -1
    (the bit order of rotation.md's 64-bit words)."""
    sig = prng.signs(seed, layer, head_offset, heads, role, purpose, d).reshape(heads, d)
    w = packing.pack((sig < 0).astype(mx.uint32), 1)
    mx.eval(w)
    return w


def _signs(p: spec.Params, heads: int, d: int) -> tuple[mx.array, mx.array]:
    lay = layouts.of(p)
    if not lay.rotation:
        z = _dummy(mx.uint32)
        return z, z
    args = (p.seed, p.layer, p.head_offset, heads, p.role_id)
    sig = _sign_words(*args, prng.PURPOSE_ROTATION, d)
    if not lay.sketch:
        return sig, sig
    return sig, _sign_words(*args, prng.PURPOSE_QJL, d)


def _side_dtype(p: spec.Params, dtype) -> mx.Dtype:
    """TS: the dtype of the side information (norm and friends float32, KIVI float16, mlx_affine T)."""
    side = layouts.of(p).side_dtype
    return numerics.DTYPES[numerics.dtype_name(dtype)] if side == "input" else record.FIELD_DTYPES[side]


def launch_shape(rows: int, d: int) -> tuple[tuple, tuple, int]:
    """(grid in threads, threadgroup, threadgroups) for `rows` rows of head dim d (any d = m * 2^k of the
    spec): one warp per row; a single threadgroup when the rows fit in one (a decode step: one fault slot,
    nothing to reduce), of at most tuning's max_warps warps (the register file of a block, at any register
    count)."""
    if rows <= 0 or rows > _MAX_ROWS:
        raise NotImplementedError(f"no kernel launch for {rows} rows")
    tune = tuning.current()
    most = max(1, min(tune.max_warps, source.SMEM_CODES // (2 * d)))
    if rows <= most:
        warps, groups = rows, 1
    else:
        warps = min(tune.big_warps, most)
        groups = min(-(-rows // warps), tune.block_cap)
    return (groups * warps * 32, 1, 1), (warps * 32, 1, 1), groups


def _field_shapes(p: spec.Params, b: int, h: int, q: int, d: int) -> list[tuple]:
    """Shapes of codes1, codes2, f_s1, f_s2 for q encoded tokens ((1,) where the method has no field)."""
    shapes = record.expected_shapes(p, b, h, q, d, q)
    return [shapes[n] if n else (1,) for n in FIELDS[p.method]]


def code_constants(p: spec.Params) -> tuple[int, int, int, int]:
    """(B1, B2, GS, KR): codes1's and codes2's bit widths, the group size and KIVI's role (1: keys), the
    values meta[1..4] carries, as the kernels' template constants (the compiler specializes on them)."""
    bits1, bits2 = _code_bits(p)
    return bits1, bits2, p.group_size or 1, int(layouts.of(p).groups_tokens(p.role))


def code_template(p: spec.Params, rows: int) -> tuple[int, int, int, int]:
    """The code constants a launch of `rows` rows compiles in: code_constants(p) for a large launch (a
    prefill, a sweep), GENERIC (read from meta at run time) below tuning's specialize_rows, so that small launches
    of many configurations (the conformance suite draws bits, groups and head dims per example) share one
    compiled kernel per method, head dim and dtype. The same body either way; tests/test_kernels_gpu.py
    checks the two give the same bits."""
    return code_constants(p) if rows >= tuning.current().specialize_rows else GENERIC


def _template(method: str, p: spec.Params, d: int, ts: mx.Dtype, rows: int) -> list:
    """The encode / decode kernels' template arguments."""
    b1, b2, gs, kr = code_template(p, rows)
    return [("M", layouts.layout(method).kernel_id), ("D", d), ("TS", ts), ("B1", b1), ("B2", b2), ("GS", gs),
            ("KR", kr)]


@functools.lru_cache(maxsize=4096)
def _encode_static(name: str, p: spec.Params, b: int, h: int, t: int, d: int, q: int, lo: int, xdt, dtype,
                   tune: tuning.Tuning) -> tuple:
    """Everything of an encode launch but x, per method, parameters, shape and counts (a decode step's
    launches, one per layer and role, build none of it): rows, the fields of q = 0 tokens (empty arrays, shared:
    nothing writes them), the constant inputs, template, grid, threadgroup, output shapes and dtypes, groups.
    Keyed by the tuning too (`tune`, the launch shape and specialize_rows): a run that changes it gets its own
    plans."""
    lay = layouts.layout(name)
    keys = int(lay.groups_tokens(p.role))
    g = p.group_size or 1
    ne = q // g if keys else q
    rows = b * h * (ne + t - max(q, lo))
    ts = _side_dtype(p, dtype)
    shapes = _field_shapes(p, b, h, q, d)
    zeros = tuple((n, mx.zeros(s, dtype=mx.uint32 if i < 2 else ts)) for i, (n, s) in
                  enumerate(zip(FIELDS[name], shapes)) if n) if not q else ()
    if zeros:
        mx.eval([z for _, z in zeros])
    if rows == 0:
        return rows, zeros, None, None, None, None, None, None, 0
    grid, group, groups = launch_shape(rows, d)
    bits1, bits2 = _code_bits(p)
    sig, tau = _signs(p, h, d)
    levels = lay.levels(p)
    consts = (sig, tau, *_tables(p, d), _consts(d, levels), _meta(bits1, bits2, g, keys, q, lo))
    out_shapes = (shapes if q else [(1,)] * 4) + [(groups, 2)]
    return (rows, zeros, consts, _template(name, p, d, ts, rows), grid, group, out_shapes,
            [mx.uint32, mx.uint32, ts, ts, mx.bool_], groups)


class KernelMethod:
    """One method through the kernels, with accelerated.ops's module as the fallback."""

    def __init__(self, name: str):
        self.NAME = name
        self.ops_module = ops.method_module(name)
        self.layout = layouts.layout(name)
        self.method_id = self.layout.kernel_id

    def __repr__(self):
        return f"<accelerated.kernels method {self.NAME}>"

    # -- the kernel ------------------------------------------------------------------------------------
    def encode_launch(self, x: mx.array, p: spec.Params, q: int, check_from: int | None = None,
                      dtype=None) -> tuple[dict[str, mx.array], tuple[mx.array, mx.array] | None]:
        """The encode kernel alone (lazy, nothing evaluated): the fields of tokens 0..q-1 of x (any input
        dtype, any strides) and the fault flags (NaN/Inf in tokens 0..q-1 and check_from..T-1, the method's
        rule on tokens 0..q-1) as two lazy bool scalars, or None when there was nothing to launch.
        `dtype` is the input dtype (mlx_affine stores its scales in it; default x.dtype).
        NotImplementedError where no kernel can run (the caller falls back to accelerated.ops)."""
        if not backend.available()[0]:
            raise NotImplementedError(backend.available()[1])
        b, h, t, d = x.shape
        lo = t if check_from is None else check_from
        st = _encode_static(self.NAME, p, b, h, t, d, q, lo, x.dtype, x.dtype if dtype is None else dtype,
                            tuning.current())
        rows, zeros, consts, template, grid, group, out_shapes, out_dtypes, groups = st
        if rows == 0:
            return dict(zeros), None
        k = backend.kernel("encode", self.NAME, numerics.dtype_name(x.dtype))
        outs = k(inputs=[x, *consts], template=template, grid=grid, threadgroup=group, output_shapes=out_shapes,
                 output_dtypes=out_dtypes)
        fault = outs[4]
        flags = fault[0] if groups == 1 else mx.any(fault, axis=0)
        if q:
            fields = {n: o for n, o in zip(FIELDS[self.NAME], outs[:4]) if n}
        else:
            fields = dict(zeros)
        return fields, (flags[0], flags[1])

    def encode_chunk(self, x: mx.array, p: spec.Params, q: int, check_from: int = 0,
                     dtype=None) -> dict[str, mx.array]:
        """Fields of tokens 0..q-1 of x; rejects (through numerics.fault, in this order) NaN/Inf in tokens
        0..q-1 and check_from..T-1, then the method's rule on tokens 0..q-1. One launch, no extra pass
        over x. A stream appending chunk c to window w calls it with x = w ++ c, check_from = len(w)."""
        if not self.layout.per_token and q % p.group_size:
            raise ValueError(f"x: {self.NAME} encodes whole groups; {q} tokens is not a multiple of {p.group_size}")
        if self.layout.side_dtype == "input" and dtype is None:
            dtype = x.dtype
        try:
            fields, flags = self.encode_launch(x, p, q, check_from, dtype)
        except NotImplementedError:
            return record.encode_chunk(self.ops_module, x, p, q, check_from, dtype)
        if flags is not None:
            numerics.fault(flags[0], NONFINITE)
            numerics.fault(flags[1], RULES[self.NAME])
        return fields

    # -- per-token math (the ops module's interface) ----------------------------------------------------
    def encode_tokens(self, x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
        """Every token of x32 (float32 as accelerated.stream passes it, or any input dtype), with the method's
        rule (not the NaN/Inf check: callers of encode_tokens have checked x already, as with ops)."""
        if self.layout.side_dtype == "input" and dtype is None:
            raise ValueError(f"dtype: {self.NAME} stores scales in the input dtype; it must be given")
        if not self.layout.per_token and x32.shape[2] % p.group_size:
            raise ValueError(f"x: {self.NAME} encodes whole groups; {x32.shape[2]} tokens is not a multiple of "
                             f"{p.group_size}")
        try:
            fields, flags = self.encode_launch(x32, p, x32.shape[2], None, dtype)
        except NotImplementedError:
            return self.ops_module.encode_tokens(numerics.upcast(x32), p, dtype)
        if flags is not None:
            numerics.fault(flags[1], RULES[self.NAME])
        return fields

    def decode_tokens(self, fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
        names = FIELDS[self.NAME]
        codes = fields[names[0]]
        b, h, q, _ = codes.shape
        if q == 0:
            return mx.zeros((b, h, 0, d), dtype=mx.float32)
        try:
            if not backend.available()[0]:
                raise NotImplementedError(backend.available()[1])
            grid, group, _ = launch_shape(b * h * q, d)
        except NotImplementedError:
            return self.ops_module.decode_tokens(fields, p, d)
        bits1, bits2 = _code_bits(p)
        sig, tau = _signs(p, h, d)
        c1, _, c2, _ = _tables(p, d)
        s1 = fields[names[2]]
        ts = s1.dtype
        codes2 = fields[names[1]] if names[1] else _dummy(mx.uint32)
        s2 = fields[names[3]] if names[3] else _dummy(ts)
        keys = int(self.layout.groups_tokens(p.role))
        levels = self.layout.levels(p)
        k = backend.kernel("decode", self.NAME, numerics.dtype_name(ts))
        ins = [codes, codes2, s1, s2, sig, tau, c1, c2, _consts(d, levels),
               _meta(bits1, bits2, p.group_size or 1, keys)]
        (out,) = k(inputs=ins, template=_template(self.NAME, p, d, ts, b * h * q), grid=grid, threadgroup=group,
                   output_shapes=[(b, h, q, d)], output_dtypes=[mx.float32])
        return out

    # -- one-shot encode / decode: accelerated.ops's framing (record.py), the kernel for the encoded prefix
    def encode(self, x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
        return record.encode_with(self, x, params, dtype)

    def decode(self, rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
        return record.decode_with(self, rec, params, dtype)


@functools.lru_cache(maxsize=None)
def method(name: str) -> KernelMethod:
    return KernelMethod(name)
