#!/usr/bin/env bash
# The H200 checks that wait for a GPU, one stage per device call (each under the 600 s limit), logs and JSON under
# $OUT. Run on the device after MLX is installed (DEVELOPERS.md, "The H200"):
#   export PYTHONPATH=/tmp/site:$PWD VELOXQUANT_GIT=<this tree's short hash> && bash tools/dev/gpu_session.sh STAGE
# Stages, in the order that keeps a short budget useful:
#   twins   the GPU twins of the tensor-core loops (tuning's tc_prod3, tc_mixed, tc_ragged, and the last two
#           together), and the GPU tests of caches changed since their last GPU run                (~6 min)
#   ab      tc_prod3 and tc_mixed on and off in the same rounds, decode step + generate at 32k   (~2 min)
#   kpairs  tuning's tc_kpairs on and off: KIVI's partial kernel in place (tools/dev/gpu_timeline.py) at 128k, the
#           decode step at 32k and 128k, and a ragged 8k x 8 batch, in the same rounds             (~6 min)
#   window  the window split's share: KIVI's partial in place at 32k with windows 0, 32 and 128, and tuning's
#           tc_window_prefetch on and off for KIVI and the mixed pair (timeline, then decode step and generate in
#           the same rounds)                                                                          (~7 min)
#   ncu     every kernel of 2 decode steps at 32k, ours and MLX's (tools/dev/step_kernels.py under Nsight Compute):
#           what runs in the 8-10 µs before each layer of kivi, prod and the mixed pair          (~3 min)
#   ragged  batches of ragged prompts, 8k x 8 and 32k x 4: KIVI and the mixed pair per sequence against
#           tuning's ragged (one B-row cache) and its tensor-core loops                            (~6 min)
#   gate    decode step + generate at 32k and the batches against the GPU's baseline (h100.json on an H100,
#           else h200.json: tools/bench gate_baseline)                                            (~9 min)
#   split   per generated token, the host's time and the GPU's (tools/dev/generate_split.py) with each
#           tensor-core knob on and off: which side sets generate's pace at 32k                    (~3 min)
#   cold    a fresh process's first request, ours against fp16                                    (~3 min)
#   kernels the kernel suite (tools/dev/kernel_check: compile, GPU tests, conformance, benchmark) (~8 min)
#   sweep   issue 29's matrix at 4k and 128k: the decode step and generate for every arm (fp16 in the same rounds) (~6 min)
#   base32 / baserest   with sweep, the parts of a saved baseline of this GPU kind: 32k; batches, cold start and ops.
#           Here: python -m veloxquant.tools.bench.render sweep.json base32.json baserest.json --merge
#           benchmarks/baselines/h100.json, then render --write docs/benchmarks.md                    (~5 / ~8 min)
#   batch8 / batch32   batched generation of every arm, 8k x 8 / 32k x 4                      (~? min: time the first)
#   graphs  MLX's CUDA graph limits (MLX_MAX_OPS_PER_BUFFER 100, MLX_MAX_MB_PER_BUFFER 1000 on an H100/H200: a
#           graph is cut and launched when its kernels' inputs pass 1000 MB, every ~6 layers of ours at 128k, ~2 of
#           fp16's) raised 100x against the defaults, in two processes: generate at 128k and the 32k timeline
#           (the 6-9 µs row before each layer of kivi, prod and the mixed pair)                       (~5 min)
#   nsys    Nsight Systems around the 32k timeline of turboquant b4 and kivi b4: every GPU activity (kernels, copies,
#           memsets, graph launches) with its start, as CSV (nsys stats cuda_gpu_trace): what fills the 6-9 µs
#           before each of KIVI's layers that ncu, which lists kernels only, could not name              (~3 min)
#   pairs   the quality recommendations' key / value pairs (docs/quality-retrieval.md) at 32k and 128k, decode step
#           and generate: keys kivi 4 beside values turboquant 4 (the 5-bit pick) runs the scalar loop, the others
#           the tensor-core loops (decode-step analysis, twenty-first pass)                          (~4 min)
#   host    the host's share of a windowed step on the GPU's host (tools/dev/host_split.py, each launch and call
#           timed in place), turboquant b4 with window 0 and 32, KIVI and the mixed pair: where the window's
#           +28 µs of build and +14 µs of encode per layer go (twentieth pass)                     (~3 min)
#   coldprof  a fresh process's first request (benchmarks/cold_start_child.py, turboquant b4 and fp16) under cProfile,
#           after two unprofiled runs that fill the disk caches: where ours spends its extra time (decode-step analysis,
#           twenty-second pass)                                                                        (~1 min)
#   mixtl   the GPU timeline at 32k, the layer gates' stamps off and in the chain (--chain): the mixed pair with
#           window 0 and 32 (why window 0 steps slower), turboquant b4, kivi, prod: whether the row before KIVI's, prod's
#           and the mixed pair's layers is their partial's (decode-step analysis, twenty-second pass)     (~2 min)
#   mixkv   tuning.tc_mixkv's GPU twins (tests/test_tc_mixkv_emulated.py), then the 5-bit pick keys kivi 4 + values
#           turboquant 4 with window 0 and 32, the knob off and on in the same rounds, decode step and generate at
#           32k and 128k                                                                               (~4 min)
#   msplits tuning's tc_mixed_splits: its GPU twins, the GPU timeline at 32k of the recommended pair (keys turboquant 3,
#           values kivi 2 with their default windows 0 / 128, and both 32) with 1, 2, 4 and 8 scalar splits, then decode
#           step + generate at 32k and 128k, 1 and 4 in the same rounds                                   (~4 min)
#   mauto   tc_mixed_splits' count per launch (at most 4, balanced by tc_mixed_cost): its GPU twins, the timeline at 32k
#           of the recommended pair (default windows and 32) and the 5-bit pick against split S - 1 alone, then decode
#           step + generate of the pair at 32k and 128k, the same two in the same rounds                    (~4 min)
#   whole   tuning's whole_windows (the window buffers whole, csrc/window_bind.h): its GPU twins (the decode step
#           against the general path, the mixed pair, the sliding window, TC_MIX), then per generated token the host
#           and the GPU (generate_split) and decode step + generate at 32k, knob off and on in the same rounds (~8 min)
#   hostab  the host's share of a layer's step (tools/dev/host_split, 32k) in this tree and in an older one carried as
#           .device/old (`git archive COMMIT accelerated spec tools veloxquant benchmarks conformance reference`),
#           processes interleaved old / new / old / new: fp16, turboquant b4, kivi b4 and the mixed pair       (~6 min)
#   batchab the 8k x 8 batch (host-paced: it moves with the host's speed) in this tree and in one carried as
#           .device/old (as hostab), processes interleaved old / new / old / new: turboquant b4, prod and kivi b4;
#           each new run records the host probe of every round (benchmarks/harness.py)               (~4 min)
# A stage's failures do not stop it; its log ends with each command's exit status. The device's .git is stale:
# VELOXQUANT_GIT (the carried tree's commit, typed into the run's command) goes into versions.git and commit_info.
set -uo pipefail
stage=${1:?stage: twins, ab, kpairs, window, ncu, ragged, gate, split, cold, kernels, sweep, base32, baserest, batch8, batch32, graphs, nsys, pairs, host, coldprof, mixtl, mixkv, msplits, mauto, whole, hostab or batchab}
out=${OUT:?run it on the device: OUT is the folder that comes back}
log="$out/$stage.log"
[ -n "${VELOXQUANT_GIT:-}" ] || echo "VELOXQUANT_GIT unset: the JSON will name the device's stale .git" | tee -a "$log"
export PYTHONUNBUFFERED=1
step() {    # step NAME COMMAND...: run, log, keep going
  local name=$1; shift
  echo "=== $name: $*" >>"$log"
  local t0=$SECONDS
  "$@" >>"$log" 2>&1
  echo "=== $name: rc $? in $((SECONDS - t0)) s" | tee -a "$log"
}
bench=(python3 -m pytest -q -p no:cacheprovider --device gpu)
case $stage in
  twins)
    step twins python3 -m pytest -q -p no:cacheprovider -k on_the_gpu \
      tests/test_tc_two_stage_emulated.py tests/test_tc_mixed_emulated.py tests/test_tc_ragged_kivi_emulated.py \
      tests/test_tc_ragged_mixed_emulated.py tests/test_ragged_mixed_step_emulated.py \
      tests/test_ragged_kivi_keys_step_emulated.py tests/test_attention_kernels_emulated.py
    step caches python3 -m pytest -q -p no:cacheprovider tests/test_rotating_cache.py tests/test_batch_ragged_kivi.py
    ;;
  ab)
    step ab-32k "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 \
      --bench-arms 'turboquant_prod b4' 'turboquant_prod b4 [TC_PROD3=0]' \
      'keys turboquant b3 + values kivi b2' 'keys turboquant b3 + values kivi b2 [TC_MIXED=0]' \
      --bench-partial "$out/h200-ab-32k.json"
    ;;
  kpairs)
    step kpairs-timeline python3 -m veloxquant.tools.dev.gpu_timeline --context 131072 \
      --arms 'kivi b4 (window 128)' 'kivi b4 (window 128) [TC_KPAIRS=1]' 'kivi b2 (window 32)' 'kivi b2 (window 32) [TC_KPAIRS=1]' \
      --json "$out/kpairs-timeline-128k.json"
    step kpairs-ab "${bench[@]}" benchmarks/test_decode_step.py --bench-contexts 32768 131072 \
      --bench-arms 'kivi b4 (window 128)' 'kivi b4 (window 128) [TC_KPAIRS=1]' 'kivi b2 (window 32)' \
      'kivi b2 (window 32) [TC_KPAIRS=1]' --bench-partial "$out/kpairs-ab.json"
    step kpairs-batch "${bench[@]}" benchmarks/test_batch_generate.py --bench-batches 8192x8 \
      --bench-arms 'kivi b4 (window 128)' 'kivi b4 (window 128) [TC_KPAIRS=1]' --bench-partial "$out/kpairs-batch.json"
    ;;
  window)
    step window-timeline python3 -m veloxquant.tools.dev.gpu_timeline --context 32768 \
      --arms 'kivi b2 (window 0)' 'kivi b2 (window 32)' 'kivi b4 (window 128)' 'kivi b4 (window 128) [TC_WINDOW_PREFETCH=1]' \
      'turboquant b4 (window 32)' 'turboquant b4 (window 32) [TC_WINDOW_PREFETCH=1]' \
      'keys turboquant b3 + values kivi b2' 'keys turboquant b3 + values kivi b2 [TC_WINDOW_PREFETCH=1]' \
      --json "$out/window-timeline-32k.json"
    step window-ab "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 \
      --bench-arms 'kivi b4 (window 128)' 'kivi b4 (window 128) [TC_WINDOW_PREFETCH=1]' \
      'keys turboquant b3 + values kivi b2' 'keys turboquant b3 + values kivi b2 [TC_WINDOW_PREFETCH=1]' \
      --bench-partial "$out/window-ab.json"
    ;;
  ncu)
    arms=('turboquant b4' 'kivi b4 (window 128)' 'turboquant_prod b4' 'keys turboquant b3 + values kivi b2')
    csvs=()
    for i in "${!arms[@]}"; do
      step "ncu-$i" ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file "$out/ncu-$i.csv" \
        python3 -m veloxquant.tools.dev.step_kernels --arm "${arms[$i]}" --context 32768
      csvs+=("$out/ncu-$i.csv")
    done
    step ncu-summary python3 -m veloxquant.tools.dev.step_kernels --summarize "${csvs[@]}" --labels "${arms[@]}" \
      --json "$out/step-kernels-32k.json"
    ;;
  ragged)
    step ragged-kivi "${bench[@]}" benchmarks/test_batch_generate.py --bench-batches 8192x8 32768x4 \
      --bench-arms 'kivi b4 (window 128)' 'kivi b4 (window 128) [RAGGED=1]' 'kivi b4 (window 128) [RAGGED=1, TC_RAGGED=1]' \
      --bench-partial "$out/h200-ragged-kivi.json"
    step ragged-mixed "${bench[@]}" benchmarks/test_batch_generate.py --bench-batches 8192x8 \
      --bench-arms 'keys turboquant b3 + values kivi b2' 'keys turboquant b3 + values kivi b2 [RAGGED=1]' \
      'keys turboquant b3 + values kivi b2 [RAGGED=1, TC_MIXED=1, TC_RAGGED=1]' \
      'keys turboquant b3 + values kivi b2 (window 32)' 'keys turboquant b3 + values kivi b2 (window 32) [RAGGED=1]' \
      'keys turboquant b3 + values kivi b2 (window 32) [RAGGED=1, TC_MIXED=1, TC_RAGGED=1]' \
      --bench-partial "$out/h200-ragged-mixed.json"
    ;;
  gate)
    base=$(python3 -c 'from veloxquant.tools.bench import gate_baseline; print(gate_baseline("gpu"))')
    echo "gate baseline: $base" | tee -a "$log"
    step gate-32k "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 \
      --bench-gate "$base" --bench-partial "$out/gate-32k.json"
    step gate-batch "${bench[@]}" benchmarks/test_batch_generate.py --bench-batches 32768x4 8192x8 \
      --bench-gate "$base" --bench-partial "$out/gate-batch.json"
    ;;
  split)
    step split python3 -m veloxquant.tools.dev.generate_split --context 32768 --arms 'fp16 KVCache' 'turboquant b4' \
      'turboquant_rvq 2+2' 'turboquant_rvq 2+2 [TC_TWO_STAGE=0]' 'keys turboquant b3 + values turboquant b2' \
      'keys turboquant b3 + values turboquant b2 [TC_3BIT=0]' 'mlx_affine b4' 'mlx_affine b4 [TC_AFFINE=0]' \
      --json "$out/h200-generate-split.json"
    ;;
  cold)
    step cold "${bench[@]}" benchmarks/test_cold_start.py --bench-partial "$out/h200-cold-start.json"
    ;;
  sweep|base32|baserest)     # (paths first: a saved baseline's command starts "pytest benchmarks", test_bench_gate.py)
    case $stage in
      sweep) what=(benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 4096 131072) ;;
      base32) what=(benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768) ;;
      baserest) what=(benchmarks/test_batch_generate.py benchmarks/test_cold_start.py benchmarks/test_ops.py) ;;
    esac
    step "$stage" python3 -m pytest "${what[@]}" -q -p no:cacheprovider --device gpu --bench-partial "$out/$stage.json"
    ;;
  batch8|batch32)
    size=$([ "$stage" = batch8 ] && echo 8192x8 || echo 32768x4)
    step "$stage" "${bench[@]}" benchmarks/test_batch_generate.py --bench-batches "$size" \
      --bench-partial "$out/$stage.json"
    ;;
  graphs)
    arms=('turboquant b4' 'kivi b4 (window 128)' 'turboquant_prod b4' 'keys turboquant b3 + values kivi b2')
    for lim in default raised; do
      env=()
      [ "$lim" = raised ] && env=(MLX_MAX_OPS_PER_BUFFER=10000 MLX_MAX_MB_PER_BUFFER=100000)
      step "graphs-generate-$lim" env "${env[@]}" "${bench[@]}" benchmarks/test_generate.py --bench-contexts 131072 \
        --bench-arms "${arms[@]}" --bench-partial "$out/graphs-generate-128k-$lim.json"
      step "graphs-timeline-$lim" env "${env[@]}" python3 -m veloxquant.tools.dev.gpu_timeline --context 32768 \
        --arms "${arms[@]}" --json "$out/graphs-timeline-32k-$lim.json"
    done
    ;;
  nsys)
    # (not on PATH on the H100 image; the CUDA toolkit and Nsight installs keep it under their own folders)
    nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys \
      /usr/local/cuda*/nsight-systems*/bin/nsys /usr/lib/nsight-systems/bin/nsys 2>/dev/null | head -n 1)
    [ -n "$nsys" ] || { echo "no nsys on this machine; ncu: $(command -v ncu)" | tee -a "$log"; exit 0; }
    step nsys-profile "$nsys" profile -o "$out/timeline" --force-overwrite true --trace=cuda,nvtx --cuda-graph-trace=node \
      python3 -m veloxquant.tools.dev.gpu_timeline --context 32768 --steps 3 --arms 'turboquant b4' 'kivi b4 (window 128)'
    step nsys-stats "$nsys" stats --report cuda_gpu_trace --format csv --output "$out/gpu-trace" "$out/timeline.nsys-rep"
    (cd "$out" && tar czf nsys.tgz gpu-trace*.csv && rm -f gpu-trace*.csv timeline.sqlite)
    ;;
  pairs)
    step pairs "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 131072 \
      --bench-kv turboquant:2/turboquant:2 turboquant:3/turboquant:2 turboquant:4/turboquant:3 kivi:4/turboquant:4 \
      --bench-kv-only --bench-partial "$out/pairs.json"
    ;;
  host)
    step host python3 -m veloxquant.tools.dev.host_split --contexts 32768 --arms 'fp16 KVCache' 'turboquant b4' \
      'turboquant b4 (window 32)' 'kivi b4 (window 128)' 'keys turboquant b3 + values kivi b2' --json "$out/host-split-32k.json"
    ;;
  coldprof)
    shape=$(python3 -c "import json; from veloxquant.tools.bench import arms; print(json.dumps(arms.SHAPES['llama3-8b']))")
    arm='{"method": "turboquant", "bits": 4}'
    for i in 1 2; do step "cold-child-$i" python3 benchmarks/cold_start_child.py "$arm" gpu "$shape" 2 4096 8; done
    step cold-prof-ours python3 -m cProfile -o "$out/cold-ours.prof" benchmarks/cold_start_child.py "$arm" gpu "$shape" \
      2 4096 8
    step cold-prof-fp16 python3 -m cProfile -o "$out/cold-fp16.prof" benchmarks/cold_start_child.py null gpu "$shape" \
      2 4096 8
    ;;
  mixtl)
    arms=('turboquant b4' 'turboquant b4 (window 32)' 'kivi b4 (window 128)' 'turboquant_prod b4'
          'keys turboquant b3 + values kivi b2' 'keys turboquant b3 + values kivi b2 (window 32)')
    for mode in plain chain; do
      step "mixtl-$mode" python3 -m veloxquant.tools.dev.gpu_timeline --context 32768 --arms "${arms[@]}" \
        $([ $mode = chain ] && echo --chain) --json "$out/timeline-32k-$mode.json"
    done
    ;;
  mixkv)
    step mixkv-twins python3 -m pytest -q -p no:cacheprovider -k "on_the_gpu and not whole-windows" \
      tests/test_tc_mixkv_emulated.py
    pick='keys kivi b4 + values turboquant b4'
    step mixkv-ab "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 131072 \
      --bench-arms "$pick (window 0)" "$pick (window 0) [TC_MIXKV=1]" \
      --bench-partial "$out/mixkv-ab.json"
    ;;
  whole)
    step whole-twins python3 -m pytest -q -p no:cacheprovider -k "whole-windows and (gpu or on_the_gpu)" \
      tests/test_decode_step.py tests/test_tc_mixed_emulated.py tests/test_tc_mixkv_emulated.py \
      tests/test_rotating_step_emulated.py
    arms=('turboquant b4 (window 32)' 'kivi b4 (window 128)' 'keys turboquant b3 + values kivi b2')
    both=('fp16 KVCache' 'turboquant b4')
    for a in "${arms[@]}"; do both+=("$a" "$a [WHOLE_WINDOWS=1]"); done
    step whole-split python3 -m veloxquant.tools.dev.generate_split --context 32768 --arms "${both[@]}" \
      --json "$out/whole-generate-split.json"
    step whole-ab "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 \
      --bench-arms "${both[@]:1}" --bench-partial "$out/whole-ab-32k.json"
    ;;
  msplits)
    step msplits-twins python3 -m pytest -q -p no:cacheprovider -k on_the_gpu tests/test_tc_mixed_splits_emulated.py
    pair='keys turboquant b3 + values kivi b2'
    arms=("$pair" "$pair (window 32)")
    for a in "$pair" "$pair (window 32)"; do for n in 2 4 8; do arms+=("$a [TC_MIXED_SPLITS=$n]"); done; done
    step msplits-timeline python3 -m veloxquant.tools.dev.gpu_timeline --context 32768 --chain --arms "${arms[@]}" \
      --json "$out/msplits-timeline-32k.json"
    w32="$pair (window 32)"
    step msplits-ab "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 \
      131072 --bench-arms "$pair" "$pair [TC_MIXED_SPLITS=4]" "$w32" "$w32 [TC_MIXED_SPLITS=4]" \
      --bench-partial "$out/msplits-ab.json"
    ;;
  mauto)
    step mauto-twins python3 -m pytest -q -p no:cacheprovider -k on_the_gpu tests/test_tc_mixed_splits_emulated.py
    pair='keys turboquant b3 + values kivi b2'
    pick='keys kivi b4 + values turboquant b4 (window 0)'
    arms=()
    for a in "$pair" "$pair (window 32)" "$pick"; do arms+=("$a" "$a [TC_MIXED_SPLITS=1]"); done
    step mauto-timeline python3 -m veloxquant.tools.dev.gpu_timeline --context 32768 --chain --arms "${arms[@]}" \
      --json "$out/mauto-timeline-32k.json"
    step mauto-ab "${bench[@]}" benchmarks/test_decode_step.py benchmarks/test_generate.py --bench-contexts 32768 \
      131072 --bench-arms "$pair" "$pair [TC_MIXED_SPLITS=1]" --bench-partial "$out/mauto-ab.json"
    ;;
  hostab)
    arms=('fp16 KVCache' 'turboquant b4' 'kivi b4 (window 128)' 'keys turboquant b3 + values kivi b2')
    for r in 1 2; do
      for tree in old new; do
        dir=$([ $tree = old ] && echo .device/old || echo .)
        step "hostab-$tree-$r" env -C "$dir" PYTHONPATH="/tmp/site:$PWD/$dir" \
          python3 -m veloxquant.tools.dev.host_split --contexts 32768 --arms "${arms[@]}" \
          --json "$out/hostab-$tree-$r.json"
      done
    done
    ;;
  batchab)
    arms=('turboquant b4' 'turboquant_prod b4' 'kivi b4 (window 128)')
    for r in 1 2; do
      for tree in old new; do
        dir=$([ $tree = old ] && echo .device/old || echo .)
        step "batchab-$tree-$r" env -C "$dir" PYTHONPATH="/tmp/site:$PWD/$dir" "${bench[@]}" \
          benchmarks/test_batch_generate.py --bench-batches 8192x8 --bench-arms "${arms[@]}" \
          --bench-partial "$out/batchab-$tree-$r.json"
      done
    done
    ;;
  kernels)
    # (KIVI's 24 thorough cells took ~15 s each on the H100: at 1000 examples they outran 280 s; 800 and 330 s fit them
    # beside the 152 s of compiles on one host, not on a slower one: 700. A cut job fails the run)
    step kernels python3 -m veloxquant.tools.dev.kernel_check --out "$out/kernels" --skip bench --parallel-timeout 330 \
      --thorough-examples 700
    # (one file back: a device call returns a limited number of files)
    (cd "$out" && tar czf kernels.tgz kernels && rm -rf kernels)
    ;;
  *)
    echo "unknown stage $stage: twins, ab, kpairs, window, ncu, ragged, gate, split, cold, kernels, sweep, base32, baserest, batch8, batch32, graphs, nsys, pairs, host, coldprof, mixtl, mixkv, msplits, mauto, whole, hostab or batchab" >&2
    exit 2
    ;;
esac
tail -n 3 "$log"
