#!/usr/bin/env bash
# docs/quality-retrieval.md from the H200 runs of 2026-12-04 on the committed model (run from the checkout root)
exec python -m veloxquant.tools.quality.retrieval_doc \
  --json docs/retrieval/quality-h200-a.json docs/retrieval/quality-h200-b.json docs/retrieval/quality-h200-c.json \
  --markdown docs/quality-retrieval.md --speed benchmarks/baselines/h200.json \
  --exclude "outliers=its runs here scaled the packed 8-bit weights of the committed model instead of their scales (perplexity 7.9 against 2.8, fp16 retrieval 0/6; at 32k the corrupted layers crashed CUDA with an illegal memory access); fixed in retrieval_model.inject_outliers (test_inject_outliers_keeps_the_function_and_makes_outlier_key_channels[8-bit export]), not yet re-measured"
