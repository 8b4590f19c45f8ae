"""VeloxQuant tools: golden regeneration, codebook generation, conformance runner, benchmarks."""
