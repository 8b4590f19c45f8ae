"""Arms of explicit key/value configurations at window 0 (the benchmarks' `--bench-kv`, the quality
recommendation's configurations), and the one comparison of what two arms store: no MLX needed here.

A `--bench-kv` argument is KEYMETHOD:BITS/VALUEMETHOD:BITS, BITS being `b` or `b+b2` for turboquant_rvq (the caches
take one bits2, so two turboquant_rvq roles must agree on it): `turboquant:3/turboquant:2`,
`turboquant_rvq:2+1/kivi:4`. Its arm is named like the mixed arm of tools/bench/arms.py OURS ("keys turboquant b3 +
values kivi b2"), with " (window 0)" where a role's method defaults to another window (kivi: 128), as OURS names a
window other than the method's default ("kivi b2 (window 0)").
"""
from __future__ import annotations

from ... import spec
from ..quality.configs import label

ROLES = ("key", "value")


def parse_role(text: str) -> tuple[str, int, int | None]:
    """(method, bits, bits2) of METHOD:BITS or METHOD:BITS+BITS2; ValueError says what is wrong."""
    method, sep, bits = text.partition(":")
    if not sep or method not in spec.METHODS:
        raise ValueError(f"{text!r}: expected METHOD:BITS with METHOD one of {', '.join(spec.METHODS)}")
    b, plus, b2 = bits.partition("+")
    try:
        out = (method, int(b), int(b2) if plus else None)
    except ValueError:
        raise ValueError(f"{text!r}: BITS is an integer, or b+b2 for turboquant_rvq") from None
    if (out[2] is not None) != ("bits2" in spec.method_info(method)):
        raise ValueError(f"{text!r}: turboquant_rvq takes BITS+BITS2, the other methods BITS alone")
    return out


def kv_spec(k: tuple, v: tuple) -> str:
    """The --bench-kv argument of keys k and values v, each (method, bits, bits2)."""
    return "/".join(f"{m}:{b}" + (f"+{b2}" if b2 else "") for m, b, b2 in (k, v))


def kv_settings(k: tuple, v: tuple) -> dict:
    """make_prompt_cache's settings of keys k and values v (each (method, bits, bits2)), window 0."""
    if k[2] and v[2] and k[2] != v[2]:
        raise ValueError(f"{kv_spec(k, v)}: the caches take one bits2, got {k[2]} and {v[2]}")
    s = dict(method=None, key_method=k[0], key_bits=k[1], value_method=v[0], value_bits=v[1], window=0)
    if k[2] or v[2]:
        s["bits2"] = k[2] or v[2]
    return s


def kv_arm(text: str) -> tuple[str, dict]:
    """(arm name, make_prompt_cache settings) of a --bench-kv argument KEYS/VALUES; ValueError if malformed."""
    keys, sep, values = text.partition("/")
    if not sep:
        raise ValueError(f"{text!r}: expected KEYMETHOD:BITS/VALUEMETHOD:BITS (e.g. turboquant:3/turboquant:2)")
    k, v = parse_role(keys), parse_role(values)
    s = kv_settings(k, v)
    for role in ROLES:                   # a width the method does not allow fails here, not on the device
        try:
            _params(s, role).resolved()
        except ValueError as e:
            raise ValueError(f"{text!r}: {role}_{e}") from None
    name = f"keys {label(*k)} + values {label(*v)}"
    if any(spec.Params(m).resolved().window != 0 for m in (k[0], v[0])):
        name += " (window 0)"
    return name, s


def kv_arm_settings(name: str) -> dict | None:
    """The settings of an arm named by kv_arm (None for any other name): its name read back as KEYS/VALUES and
    accepted only where kv_arm gives that very name."""
    body = name.removesuffix(" (window 0)")
    if not body.startswith("keys ") or " + values " not in body:
        return None
    k, _, v = body[len("keys "):].partition(" + values ")
    try:
        text = "/".join(_spec_of_label(x) for x in (k, v))
        got, s = kv_arm(text)
    except ValueError:
        return None
    return s if got == name else None


def _spec_of_label(lab: str) -> str:
    """METHOD:BITS of a configs.label ("turboquant b3", "turboquant_rvq 2+1")."""
    method, _, bits = lab.partition(" ")
    return f"{method}:{bits.removeprefix('b')}"


def _params(s: dict, role: str) -> spec.Params:
    method = s.get(f"{role}_method") or s["method"]
    bits = s.get(f"{role}_bits", s.get("bits"))
    info = spec.method_info(method)
    return spec.Params(method, bits=bits, bits2=s.get("bits2") if "bits2" in info else None,
                       group_size=s.get("group_size") if "group_sizes" in info else None, window=s.get("window"),
                       role=role[0])


def stored_config(s: dict) -> tuple:
    """What caches of settings `s` store, per role (method, bits, bits2, group size, window) with the spec's
    defaults filled in: two arms (or an arm and a recommendation) are the same configuration where these agree."""
    out = []
    for role in ROLES:
        p = _params(s, role).resolved()
        out.append((p.method, p.bits, p.bits2, p.group_size, p.window))
    return tuple(out)
