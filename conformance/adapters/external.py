"""Third-party implementations: `--impl package.module:factory`.

`factory()` returns a `conformance.adapters.base.Implementation`. `adapters.load` resolves the string; this
module documents the contract and offers `wrap` for implementations that only have encode/decode.
"""
from __future__ import annotations

from typing import Callable

from .base import Implementation


def wrap(name: str, encode: Callable, decode: Callable, methods=None) -> Implementation:
    """An Implementation from two numpy-interchange callables `encode(x, params, dtype)`,
    `decode(record, params, dtype)`; streams, codebooks and attention are reported as unsupported."""

    class _Wrapped(Implementation):
        pass

    impl = _Wrapped()
    impl.name = name
    if methods is not None:
        impl.methods = tuple(methods)
    impl.encode = encode
    impl.decode = decode
    return impl
