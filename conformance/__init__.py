"""VeloxQuant conformance suite: any implementation, through an adapter, against the spec and the reference.

`pytest conformance --impl NAME` or `veloxquant conformance --impl NAME`; see conformance/README.md.
"""
