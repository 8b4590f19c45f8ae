#!/usr/bin/env bash
# docs/quality-retrieval.md from the H200 runs of 2026-12-04 on the committed model (run 6, docs/retrieval-model.md;
# run from the checkout root). The outliers run comes first: its cells (mlx-lm's QuantizedKVCache through the
# dequantizing path) stand in for run 6-a's outliers cells, where mx.quantized_matmul crashed at 16k.
exec python -m veloxquant.tools.quality.retrieval_doc \
  --json docs/retrieval/quality-h200-run6-outliers.json docs/retrieval/quality-h200-run6-a.json \
         docs/retrieval/quality-h200-run6-b.json \
  --markdown docs/quality-retrieval.md --speed benchmarks/baselines/h200.json docs/bench/h200-recommended-32k.json
