"""VeloxQuant accelerated layer: the spec (spec/) in pure MLX ops.

`accelerated.ops` holds one module per op and per method (encode/decode on mx arrays, bit-exact with the
spec on every MLX device); `accelerated.stream.Stream` is the streaming state of spec/streaming.md.
This package never imports `reference` (an independent implementation is the point of conformance).
"""
from . import ops
from .ops import decode, encode

__all__ = ["ops", "encode", "decode"]
