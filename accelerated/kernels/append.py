"""One launch per decode step for a layer's append: the keys' and the values' new tokens encoded by the encode
body of source.py (bit for bit the same fields) and stored in place in the streams' buffers, with the
chunk's deferred checks (spec/streaming.md 'Deferred rejection') in the same launch.

It replaces, where it applies, two encode launches plus accelerated.kernels.commit's store (three launches,
two temporary field arrays and a dozen array views per layer and step): the encode body runs twice in one
kernel, each time in its own scope with its stream's inputs behind the body's names, `VQ_OROW` mapping its
output rows to rows of the buffers (row base + i of head bh) and its fault slots to its own half of the
token. Applies when both roles store every token of the chunk at once (window R = 0, per-token records:
not kivi) and the buffers have room for the chunk; the caller uses the general path otherwise.

The token, (2 roles, threadgroups, 2) bool: [role][group][0] NaN/Inf in the chunk, [role][group][1] the
method's rule (source.py's fault slots). As with commit.py, readers of the rows take it as an input (the
attention kernels) or wait for it (accelerated.stream.Stream.sync); the launch takes the previous token, so
stores to one buffer run in order.
"""
from __future__ import annotations

import functools

import mlx.core as mx

import spec
from accelerated.kernels import backend, source
from accelerated.kernels import methods as km

ROLE_INPUTS = ["x", "sig", "tau", "f_c1", "f_b1", "f_c2", "f_b2", "f_k", "meta", "codes1", "codes2", "f_s1",
               "f_s2"]
INPUTS = ["base", "after"] + [f"k{n}" for n in ROLE_INPUTS] + [f"v{n}" for n in ROLE_INPUTS]
OUTPUTS = ["flags"]
_MAX_ROWS = 2 ** 31 - 1

_ALIAS = {   # how a scope gives a kernel input the encode body's name (a reference / a pointer copy)
    "cuda": "#define VQ_ALIAS(n, s) const auto& n = s;\n#define VQ_MUT(type, p) const_cast<type*>(p)\n",
    "metal": "#define VQ_ALIAS(n, s) auto n = s;\n#define VQ_MUT(type, p) const_cast<device type*>(p)\n",
}


def _scope(role: str, index: int) -> str:
    """The encode body for one role: its inputs under the body's names, its rows in the buffers."""
    r = role
    return f"""
  {{
    constexpr int M = {r.upper()}M;
    using TS = {r.upper()}TS;
    VQ_ALIAS(x, {r}x) VQ_ALIAS(x_shape, {r}x_shape) VQ_ALIAS(x_strides, {r}x_strides)
    VQ_ALIAS(sig, {r}sig) VQ_ALIAS(tau, {r}tau) VQ_ALIAS(f_c1, {r}f_c1) VQ_ALIAS(f_b1, {r}f_b1)
    VQ_ALIAS(f_c2, {r}f_c2) VQ_ALIAS(f_b2, {r}f_b2) VQ_ALIAS(f_k, {r}f_k) VQ_ALIAS(meta, {r}meta)
    auto codes1 = VQ_MUT(uint32_t, {r}codes1);
    auto codes2 = VQ_MUT(uint32_t, {r}codes2);
    auto f_s1 = VQ_MUT(TS, {r}f_s1);
    auto f_s2 = VQ_MUT(TS, {r}f_s2);
    auto fault = flags + {index} * 2 * (int)NGROUPS;
    const int vq_cap = (int){r}codes1_shape[2];     // rows of the buffers
    const int vq_base = base[0];                    // first row of this chunk
#undef VQ_OROW
#define VQ_OROW(bh, ne, i) ((bh) * vq_cap + vq_base + (i))
{source.ENCODE_BODY}
  }}
"""


def body() -> str:
    """The kernel text after a prelude (both roles; `after` only orders this launch after the last store)."""
    return "  (void)after;\n" + _scope("k", 0) + "  BARRIER();\n" + _scope("v", 1)


def assemble(be: str) -> tuple[str, str]:
    header, prelude = source.PRELUDES[be]
    return header, prelude + _ALIAS[be] + body()


@functools.lru_cache(maxsize=None)
def _kernel():
    be = backend.backend()
    if be is None:
        raise RuntimeError(backend.available()[1])
    header, text = assemble(be)
    if be == "cuda":
        return mx.fast.cuda_kernel(name="vq_append", input_names=INPUTS, output_names=OUTPUTS, source=text,
                                   header=header, ensure_row_contiguous=False)
    return mx.fast.metal_kernel(name="vq_append", input_names=INPUTS, output_names=OUTPUTS, source=text,
                                header=header, ensure_row_contiguous=False, compile_options={"math_mode": "safe"})


def applies(p: spec.Params) -> bool:
    """Whether a role's stream can take this launch: every token of a chunk stored at once, per-token rows."""
    return p.window == 0 and p.method != "kivi"


@functools.lru_cache(maxsize=4096)
def _static(p: spec.Params, h: int, t: int, d: int) -> tuple:
    """The inputs of one role that depend only on its parameters and the chunk's shape (cached)."""
    bits1, bits2 = km._code_bits(p)
    sig, tau = km._signs(p, h, d)
    c1, bd1, c2, bd2 = km._tables(p, d)
    levels = (1 << p.bits) - 1 if p.method == "mlx_affine" else 0
    meta = km._meta(bits1, bits2, p.group_size or 1, 0, t, t)
    return sig, tau, c1, bd1, c2, bd2, km._consts(d, levels), meta


@functools.lru_cache(maxsize=1024)
def _launch(b: int, h: int, t: int, d: int) -> tuple:
    grid, group, groups = km.launch_shape(b * h * t, d)
    return grid, group, groups


def _role(p: spec.Params, x: mx.array, bufs: dict) -> list:
    """[x, sig, tau, f_c1, f_b1, f_c2, f_b2, f_k, meta, codes1, codes2, f_s1, f_s2] of one role; `bufs` are the
    stream's whole buffers by record field name."""
    b, h, t, d = x.shape
    names = km.FIELDS[p.method]
    ts = km._side_dtype(p, x.dtype)
    outs = [bufs[n] if n else _unused(mx.uint32 if i < 2 else ts) for i, n in enumerate(names)]
    return [x, *_static(p, h, t, d), *outs]


def append(kp: spec.Params, keys: mx.array, kbufs: dict, vp: spec.Params, values: mx.array, vbufs: dict,
           base: int, after: mx.array | None) -> mx.array:
    """Encode keys and values (B, H, t, d) into rows base..base+t-1 of their streams' buffers (in place);
    returns the token. The caller has checked shapes, dtypes and room in the buffers."""
    b, h, t, d = keys.shape
    grid, group, groups = _launch(b, h, t, d)
    kts = km._side_dtype(kp, keys.dtype)
    vts = km._side_dtype(vp, values.dtype)
    ins = ([_base(base), after if after is not None else km._dummy(mx.bool_)] + _role(kp, keys, kbufs)
           + _role(vp, values, vbufs))
    (flags,) = _kernel()(inputs=ins, template=[("KM", source.METHOD_IDS[kp.method]), ("VM", source.METHOD_IDS[vp.method]),
                                               ("D", d), ("KTS", kts), ("VTS", vts)],
                         grid=grid, threadgroup=group, output_shapes=[(2, groups, 2)], output_dtypes=[mx.bool_])
    return flags


@functools.lru_cache(maxsize=None)
def _unused(dtype) -> mx.array:
    """Stand-in for a field the method does not have (never written). 8 elements: MLX's Metal kernels pass
    arrays of fewer in `constant` memory, which the body's mutable alias of an output cannot point to."""
    a = mx.zeros((8,), dtype=dtype)
    mx.eval(a)
    return a


@functools.lru_cache(maxsize=1 << 16)
def _base(n: int) -> mx.array:
    # one small constant per row count, made once (a decode step's appends reuse them across layers)
    a = mx.array([n], dtype=mx.int32)
    mx.eval(a)
    return a


def fits(b: int, h: int, cap: int) -> bool:
    """Rows of a buffer are addressed in int32 by the body."""
    return b * h * cap <= _MAX_ROWS


def messages(token: mx.array) -> list:
    """The per-check hit lists of a token in the order of the checks' messages (keys NaN/Inf, keys' rule,
    values NaN/Inf, values' rule), read on the host (the caller knows it is evaluated)."""
    f = token.tolist()
    return [[g[kind] for g in f[role]] for role in range(2) for kind in range(2)]
