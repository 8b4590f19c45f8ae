"""tools/dev/step_kernels.py on the CPU: its steps run inside the marked range (the marks themselves need a CUDA
driver), and its reading of ncu's --csv log: the gpu__time_duration.sum rows only, units scaled to µs, thousands
separators read, kernels grouped and ranked by their time per layer step."""
from __future__ import annotations

import pytest

from veloxquant.tools.dev import step_kernels as sk

LOG = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "vq_attention_partial_4410t2a": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","vq_gate_2_1024_1024","1","7","(256, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1.50"
"1","4242","python3.12","127.0.0.1","vq_attention_partial_4410t2a","1","7","(128, 1, 1)","(33, 8, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1,064.00"
"1","4242","python3.12","127.0.0.1","vq_attention_partial_4410t2a","1","7","(128, 1, 1)","(33, 8, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","50"
"2","4242","python3.12","127.0.0.1","mlx::copy_gg_nd<__half>","1","7","(256, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","2500"
"3","4242","python3.12","127.0.0.1","vq_attention_partial_4410t2a","1","7","(128, 1, 1)","(33, 8, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","60.00"
'''


def test_rows_reads_the_duration_rows_in_microseconds():
    assert sk.rows(LOG) == [("vq_gate_2_1024_1024", 1.5), ("vq_attention_partial_4410t2a", 1064.0),
                            ("mlx::copy_gg_nd<__half>", 2.5), ("vq_attention_partial_4410t2a", 60.0)]
    assert sk.rows("==PROF== no kernels were profiled\n") == []
    with pytest.raises(ValueError, match="unknown unit"):
        sk.rows(LOG.replace('"nsecond"', '"furlong"'))


def test_rows_reads_newer_ncus_short_units():
    """ncu 2024+ writes "ns" / "us" (the H100 image's ncu wrote "ns","89,824" for a 89.8 µs partial)."""
    short = LOG.replace('"usecond"', '"us"').replace('"nsecond"', '"ns"')
    assert short != LOG and sk.rows(short) == sk.rows(LOG)


def test_summarize_groups_per_layer_step_largest_first():
    got = sk.summarize(sk.rows(LOG), steps=1, layers=2)
    assert [r["kernel"] for r in got] == ["vq_attention_partial_4410t2a", "mlx::copy_gg_nd<__half>",
                                          "vq_gate_2_1024_1024"]
    part = got[0]
    assert part["per_layer"] == 1.0 and part["median_us"] == 562.0 and part["us_per_layer"] == 562.0, part


def test_the_steps_run_inside_the_range(monkeypatch):
    marks = []
    monkeypatch.setattr(sk, "profiler", lambda: (lambda: marks.append("start"), lambda: marks.append("stop"), None))
    from veloxquant.tools.bench import arms as bd
    real = bd.step

    def step(*a):
        marks.append("step")
        return real(*a)
    monkeypatch.setattr(bd, "step", step)
    assert sk.run("turboquant b4", context=64, layers=2, steps=2, warm=1, log=lambda *a: None) == 2
    assert marks == ["step", "start", "step", "step", "stop"], marks
