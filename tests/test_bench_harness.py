"""tools/bench/harness.py's device choice (`veloxquant memory`): --device gpu on
an MLX build without a GPU is one line naming the command (the command then exits 2), --device cpu makes the CPU
the default device."""
from __future__ import annotations

import mlx.core as mx

from veloxquant.tools.bench import harness


def test_gpu_without_a_gpu_is_one_line_naming_the_command(monkeypatch, capsys):
    monkeypatch.setattr(mx, "is_available", lambda device: False)
    before = mx.default_device()
    assert harness.use_device("gpu", "memory") is False
    err = capsys.readouterr().err
    assert err == "memory: --device gpu, but this MLX build has no GPU\n", err
    assert mx.default_device() == before


def test_cpu_and_default(monkeypatch, capsys):
    made = []
    monkeypatch.setattr(mx, "set_default_device", made.append)   # recorded, not applied: no other test is affected
    assert harness.use_device("cpu", "memory") is True and made == [mx.cpu]
    assert harness.use_device(None, "memory") is True and made == [mx.cpu]   # MLX's own choice kept
    assert capsys.readouterr().err == ""
