"""One role's settings (keys "k" or values "v") as the cache's constructor takes them, to resolved spec.Params: a bad
setting fails when the cache is made, under the caller's own argument name (key_bits, value_method, ...)."""
from __future__ import annotations

from ... import spec


def role_params(role: str, method, bits, bits2, group_size, window, seed, layer, head_offset,
                exact_trim=0) -> spec.Params:
    """Params for one role, resolved now so a bad setting fails at construction, named per role."""
    prefix = "key_" if role == "k" else "value_"
    if method is None:
        raise ValueError(f"{prefix}method: a method is required (one of {', '.join(spec.METHODS)})")
    info = spec.method_info(method) if method in spec.METHODS else None
    if info is None:
        raise ValueError(f"{prefix}method: unknown method {method!r}; expected one of {', '.join(spec.METHODS)}")
    p = spec.Params(method, bits=bits,
                    bits2=bits2 if "bits2" in info else None,
                    group_size=group_size if "group_sizes" in info else None,
                    window=window, seed=seed, layer=layer, head_offset=head_offset, role=role,
                    exact_trim=exact_trim)
    try:
        return p.resolved()
    except ValueError as e:
        msg = str(e)
        if msg.startswith(("bits", "bits2", "group_size")):
            msg = prefix + msg  # key_bits / value_bits: the caller's own argument names
        raise ValueError(msg) from None
