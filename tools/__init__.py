"""VeloxQuant tools, one room each (a room's `__init__` is its command where it has one):

- cli/: the `veloxquant` command (`main`) and its small subcommands (generate, serve, kernels, codebooks,
  conformance), the shared --kv-* flags, the extras check, the tiny demo model;
- golden/: `veloxquant golden`: golden vectors from the numpy reference, one module per case family;
- bench/: `veloxquant bench` (the front end of the one harness, benchmarks/: pytest-benchmark), `memory`, the arm table and `render` (docs/benchmarks.md);
- quality/: `veloxquant quality`, `distortion`, the trained byte-level models and their training;
- dev/: development tools run from a checkout (GPU probes, kernel checks); not shipped in the wheel.

_env.py (run_record: command, date, device, versions) is shared by all of them.
"""
