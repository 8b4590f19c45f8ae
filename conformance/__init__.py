"""VeloxQuant conformance suite: any implementation, through an adapter, against the spec and the reference.

`pytest conformance --impl NAME` or `veloxquant conformance --impl NAME`; see conformance/README.md.
"""

if __name__ == "conformance":   # imported by path from a checkout (pytest): be veloxquant.conformance itself
    import importlib as _importlib
    import sys as _sys

    _sys.modules[__name__] = _importlib.import_module("veloxquant.conformance")
