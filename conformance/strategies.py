"""Hypothesis strategies for parameters and shapes (spec/formats.toml ranges), and the parametrization
lists (method x bits x dtype) that tag tests for the report table."""
from __future__ import annotations

import functools

import numpy as np
from hypothesis import strategies as st

from .. import spec

from . import data

U32 = 2 ** 32 - 1
U64 = 2 ** 64 - 1
# head dims: every supported one; small powers of two and the common non-powers of two (d = m * 2^k,
# spec 1.1: 80, 96, 192 of real models; 20, 24, 28 where stage A of H is (almost) empty) more often
HEAD_DIMS = st.one_of(st.sampled_from([16, 32, 64, 128]), st.sampled_from([20, 24, 28, 80, 96, 192]),
                      st.sampled_from(list(spec.HEAD_DIMS)))


def method_bits(methods) -> list[tuple[str, int]]:
    return [(m, b) for m in methods for b in spec.method_info(m)["bits"]]


def method_bits_dtype(methods) -> list[tuple[str, int, str]]:
    return [(m, b, dt) for m, b in method_bits(methods) for dt in spec.DTYPES]


# Strategy objects are made once per argument set: hypothesis validates a strategy on its first draw, and
# params_and_shape drew ~10 freshly made strategies per example (a seventh of a thorough differential example's
# time on the CPU).
ROLES = st.sampled_from(["k", "v"])
SEEDS = st.one_of(st.integers(0, 3), st.integers(0, U64))
LAYERS = st.one_of(st.integers(0, 3), st.integers(0, U32))
HEAD_OFFSETS = st.one_of(st.integers(0, 8), st.integers(0, U32 - 8))
_GROUPS_PAST_WINDOW = st.integers(0, 2)
_EXTRA_TOKENS = st.integers(0, 3)
_SMALL_B = st.one_of(st.integers(1, 2), st.just(4))
_SMALL_H = st.one_of(st.integers(1, 3), st.sampled_from([8, 9]))
_B = st.integers(1, 2)
_H = st.integers(1, 3)


@functools.lru_cache(maxsize=None)
def _sampled(values: tuple):
    return st.sampled_from(list(values))


@functools.lru_cache(maxsize=None)
def _window(max_t: int):
    return st.one_of(st.just(0), st.integers(0, max_t + 2))


@functools.lru_cache(maxsize=None)
def _tokens(max_t: int):
    return st.integers(1, max_t)


@st.composite
def params_and_shape(draw, method: str, bits: int, max_t: int = 9):
    """(resolved Params, (B, H, T, d)) valid for `method` at `bits`; random seeds, layers, head offsets,
    windows, roles, group sizes."""
    info = spec.method_info(method)
    d = draw(HEAD_DIMS)
    role = draw(ROLES)
    kw = {}
    if method == "turboquant_rvq":
        kw["bits2"] = draw(_sampled(tuple(info["bits2"])))
    groups = 0
    if "group_sizes" in info:
        along_d = role in info.get("group_divides_head_dim", ())   # G must divide d (kivi values, mlx_affine)
        allowed = [g for g in info["group_sizes"] if not along_d or d % g == 0]
        if not allowed:
            d = draw(_sampled(tuple(dd for dd in spec.HEAD_DIMS if any(dd % g == 0 for g in info["group_sizes"]))))
            allowed = [g for g in info["group_sizes"] if d % g == 0]
        g = draw(_sampled(tuple(allowed)))
        kw["group_size"] = g
        if method == "kivi":
            groups = g
    window = draw(_window(max_t))
    if groups:
        # kivi: enough tokens for 0..2 whole groups past the window
        t = window + draw(_GROUPS_PAST_WINDOW) * groups + draw(_EXTRA_TOKENS)
        t = max(t, 1)
    else:
        t = draw(_tokens(max_t))
    small = d <= 128 and t <= 40      # wide shapes where they stay cheap
    b = draw(_SMALL_B) if small else draw(_B)
    h = draw(_SMALL_H) if small else draw(_H)
    p = spec.Params(method, bits=bits, window=window, role=role, seed=draw(SEEDS), layer=draw(LAYERS),
                    head_offset=draw(HEAD_OFFSETS), **kw).resolved()
    return p, (b, h, t, d)


def inputs(shape, dtype: str):
    """A strategy of x arrays: a regime and a numpy seed (cheap to shrink, exact to replay)."""
    return st.tuples(st.sampled_from(data.REGIMES), st.integers(0, U32)).map(
        lambda rs: data.make_x(np.random.default_rng(rs[1]), shape, dtype, rs[0]))


@st.composite
def chunking(draw, t: int):
    """Random chunk sizes summing to t (single tokens, big chunks, everything between)."""
    out = []
    left = t
    while left:
        c = draw(st.one_of(st.just(1), st.integers(1, left)))
        out.append(c)
        left -= c
    return out
