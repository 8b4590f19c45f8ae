"""make_prompt_cache's argument checks: errors name the argument the caller passed; settings no role takes
(group_size with turboquant, bits2 without turboquant_rvq) and fp16_layers covering every layer are errors,
not silently ignored or silently uncompressed."""
from __future__ import annotations

import pytest

pytest.importorskip("mlx_lm")
import veloxquant.accelerated.cache as vc  # noqa: E402


class _FakeModel:
    def __init__(self, n):
        self.layers = [object()] * n


@pytest.mark.parametrize("kw, named", [
    (dict(method="nosuch"), "method"),
    (dict(key_method="nosuch"), "key_method"),
    (dict(value_method="nosuch"), "value_method"),
    (dict(bits=5), "bits"),
    (dict(method="kivi", key_bits=4, value_bits=9), "value_bits"),
    (dict(key_bits=5), "key_bits"),
    (dict(group_size=64), "group_size"),
    (dict(method="rabitq", bits2=2), "bits2"),
    (dict(fp16_layers=(5, 5)), "fp16_layers"),
    (dict(fp16_layers=(4, 0)), "fp16_layers"),
    (dict(fp16_layers=(2, 2)), "fp16_layers"),
])
def test_error_names_the_callers_argument(kw, named):
    with pytest.raises(ValueError) as e:
        vc.make_prompt_cache(_FakeModel(4), **kw)
    assert str(e.value).split(":", 1)[0] == named, str(e.value)


def test_settings_go_to_the_roles_that_take_them():
    caches = vc.make_prompt_cache(_FakeModel(4), key_method="kivi", value_method="turboquant", group_size=32,
                                  fp16_layers=(1, 2))
    assert [type(c).__name__ for c in caches] == ["KVCache", "VeloxKVCache", "KVCache", "KVCache"]
    assert caches[1].key_params.group_size == 32 and caches[1].value_params.group_size is None
    rvq = vc.make_prompt_cache(_FakeModel(2), key_method="turboquant_rvq", value_method="kivi", bits=2, bits2=3)
    assert rvq[0].key_params.bits2 == 3
