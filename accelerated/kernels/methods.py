"""The rotation-family methods through the fused kernels: turboquant, turboquant_rvq, rabitq, turboquant_prod
(spec/methods/*.md). Each `KernelMethod` looks like an accelerated.ops method module to its callers
(`NAME`, `encode_tokens`, `decode_tokens`, `encode`, `decode`), so accelerated.stream.Stream can use it.

Only the per-token math runs in the kernels. Record layout, input and record validation, the window and the
norm-overflow rejection are accelerated.ops's (accelerated.ops.record / numerics), so both paths frame the
same bytes. Tables and sign vectors are accelerated.ops's too (codebooks, prng: host-side, cached).
Whatever a kernel does not cover (no GPU now, zero encoded tokens, launch limits) runs accelerated.ops.
"""
from __future__ import annotations

import functools

import mlx.core as mx

import spec
from accelerated import ops
from accelerated.kernels import backend, source
from accelerated.ops import codebooks, numerics, prng, record

# record field names of the kernel outputs codes1, codes2, f_norm, f_aux (None: output unused)
FIELDS = {
    "turboquant": ("codes", None, "norm", None),
    "turboquant_rvq": ("codes1", "codes2", "norm", None),
    "rabitq": ("codes", None, "norm", "ip"),
    "turboquant_prod": ("codes", "qjl", "norm", "rnorm"),
}
_MAX_GRID_X = 2**31 - 1     # grid x counts threads (d * Q)
_MAX_GRID_YZ = 65535        # H threadgroups along y, B along z (CUDA's limit)


@functools.lru_cache(maxsize=None)
def _dummy(dtype) -> mx.array:
    """A one-element stand-in for an input or output a method does not use."""
    return mx.zeros((1,), dtype=dtype)


@functools.lru_cache(maxsize=None)
def _consts(d: int) -> mx.array:
    """f_k = [s_d, A_d] (rotation.md, methods/turboquant_prod.md)."""
    k = mx.concatenate([numerics.scale(d).reshape(1), numerics.qjl_scale(d).reshape(1)])
    mx.eval(k)
    return k


def _code_bits(p: spec.Params) -> tuple[int, int]:
    """(bits of codes1, bits of codes2) as the kernels see them."""
    if p.method == "turboquant_prod":
        return p.bits - 1, 1
    if p.method == "rabitq":
        return 1, 1
    if p.method == "turboquant_rvq":
        return p.bits, p.bits2
    return p.bits, 1


def _tables(p: spec.Params, d: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(C1_d, B1_d, C2_d, B2_d); unused ones are dummies."""
    z = _dummy(mx.float32)
    if p.method == "rabitq":
        return z, z, z, z
    b1, _ = _code_bits(p)
    c1, bd1 = codebooks.gaussian(b1, d)
    if p.method == "turboquant_rvq":
        c2, bd2 = codebooks.residual(p.bits, p.bits2, d)
        return c1, bd1, c2, bd2
    return c1, bd1, z, z


@functools.lru_cache(maxsize=1024)   # per stream and head count: no reshape per decode step
def _signs(p: spec.Params, heads: int, d: int) -> tuple[mx.array, mx.array]:
    sig = prng.head_signs(p, heads, d).reshape(heads * d)
    if p.method != "turboquant_prod":
        return sig, sig
    return sig, prng.head_signs(p, heads, d, prng.PURPOSE_QJL).reshape(heads * d)


@functools.lru_cache(maxsize=None)
def _meta(d: int, bits1: int, bits2: int) -> mx.array:
    """meta = [d, bits of codes1, bits of codes2] (int32; cached: no per-call host array)."""
    m = mx.array([d, bits1, bits2], dtype=mx.int32)
    mx.eval(m)
    return m


def _launch_shape(b: int, h: int, q: int, d: int) -> tuple[tuple, tuple]:
    """grid (threads) and threadgroup: one threadgroup of d threads per (token, head, batch)."""
    if q == 0 or d * q > _MAX_GRID_X or h > _MAX_GRID_YZ or b > _MAX_GRID_YZ:
        raise NotImplementedError(f"no kernel launch for B={b}, H={h}, Q={q}, d={d}")
    if d & (d - 1):   # the bodies implement the power-of-two butterfly and fold only (spec 1.1 d = m*2^k: ops)
        raise NotImplementedError(f"no kernel for head dim {d} (not a power of two): accelerated.ops runs it")
    return (d * q, h, b), (d, 1, 1)


class KernelMethod:
    """One rotation-family method through the kernels, with accelerated.ops's module as the fallback."""

    def __init__(self, name: str):
        self.NAME = name
        self.ops_module = ops.method_module(name)
        self.method_id = source.METHOD_IDS[name]

    def __repr__(self):
        return f"<accelerated.kernels method {self.NAME}>"

    # -- per-token math (the ops module's interface) ----------------------------------------------------
    def _encode_prefix(self, x: mx.array, p: spec.Params, q: int) -> dict[str, mx.array]:
        """Fields of tokens 0..q-1 of x (any input dtype, any strides) via the encode kernel, checked."""
        fields = self.encode_launch(x, p, q)
        numerics.check_norm_finite(fields["norm"])   # number-model.md: reject (x) a norm of +Inf
        return fields

    def encode_launch(self, x: mx.array, p: spec.Params, q: int) -> dict[str, mx.array]:
        """The encode kernel alone (lazy, unchecked): fields of tokens 0..q-1 of x."""
        if not backend.available()[0]:
            raise NotImplementedError(backend.available()[1])
        b, h, _, d = x.shape
        grid, group = _launch_shape(b, h, q, d)
        bits1, bits2 = _code_bits(p)
        sig, tau = _signs(p, h, d)
        c1, bd1, c2, bd2 = _tables(p, d)
        names = FIELDS[self.NAME]
        shapes = [(b, h, q, spec.words_per_row(d, bits1)),
                  (b, h, q, spec.words_per_row(d, bits2)) if names[1] else (1,),
                  (b, h, q),
                  (b, h, q) if names[3] else (1,)]
        k = backend.kernel("encode", self.NAME, numerics.dtype_name(x.dtype))
        outs = k(inputs=[x, sig, tau, c1, bd1, c2, bd2, _consts(d), _meta(d, bits1, bits2)],
                 template=[("M", self.method_id)],
                 grid=grid, threadgroup=group, output_shapes=shapes,
                 output_dtypes=[mx.uint32, mx.uint32, mx.float32, mx.float32])
        return {n: o for n, o in zip(names, outs) if n}

    def encode_tokens(self, x32: mx.array, p: spec.Params, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
        """Every token of x32 (float32 here, as accelerated.stream passes it; any input dtype works)."""
        try:
            return self._encode_prefix(x32, p, x32.shape[2])
        except NotImplementedError:
            return self.ops_module.encode_tokens(numerics.upcast(x32), p, dtype)

    def decode_tokens(self, fields: dict[str, mx.array], p: spec.Params, d: int) -> mx.array:
        names = FIELDS[self.NAME]
        try:
            if not backend.available()[0]:
                raise NotImplementedError(backend.available()[1])
            b, h, q = fields["norm"].shape
            grid, group = _launch_shape(b, h, q, d)
        except NotImplementedError:
            return self.ops_module.decode_tokens(fields, p, d)
        bits1, bits2 = _code_bits(p)
        sig, tau = _signs(p, h, d)
        c1, _, c2, _ = _tables(p, d)
        codes2 = fields[names[1]] if names[1] else _dummy(mx.uint32)
        aux = fields[names[3]] if names[3] else _dummy(mx.float32)
        k = backend.kernel("decode", self.NAME, "any")
        ins = [fields[names[0]], codes2, fields["norm"], aux, sig, tau, c1, c2, _consts(d), _meta(d, bits1, bits2)]
        (out,) = k(inputs=ins, template=[("M", self.method_id)], grid=grid, threadgroup=group,
                   output_shapes=[(b, h, q, d)], output_dtypes=[mx.float32])
        return out

    # -- one-shot encode / decode: accelerated.ops's framing, the kernel for the encoded prefix --------
    def encode(self, x: mx.array, params: spec.Params, dtype=None) -> dict[str, mx.array]:
        p = record.resolve(params)
        if p.method != self.NAME:
            raise ValueError(f"params: method {p.method!r} given to {self.NAME}.encode")
        numerics.check_x(x, p, dtype)
        q = p.encoded_tokens(x.shape[2])
        try:   # x itself, not an upcast copy: the kernel upcasts on load
            fields = self._encode_prefix(x, p, q)
        except NotImplementedError:
            fields = self.ops_module.encode_tokens(numerics.upcast(x[:, :, :q]), p, x.dtype)
        fields["window"] = x[:, :, q:]
        return {name: fields[name] for name in record.field_names(p)}

    def decode(self, rec: dict[str, mx.array], params: spec.Params, dtype=None) -> mx.array:
        p = record.resolve(params)
        if p.method != self.NAME:
            raise ValueError(f"params: method {p.method!r} given to {self.NAME}.decode")
        record.check_record(rec, p)
        if dtype is not None and numerics.dtype_name(rec["window"].dtype) != numerics.dtype_name(dtype):
            raise ValueError(f"record: window dtype {rec['window'].dtype} differs from the declared {dtype}")
        win = numerics.upcast(rec["window"])
        prefix = self.decode_tokens({k: v for k, v in rec.items() if k != "window"}, p, win.shape[-1])
        if win.shape[2] == 0:   # no window: the kernel's output is the whole result (no concatenate copy)
            return prefix
        return mx.concatenate([prefix, win], axis=2)


@functools.lru_cache(maxsize=None)
def method(name: str) -> KernelMethod:
    return KernelMethod(name)
