#!/usr/bin/env bash
# Re-pack MLX's CUDA build staged by ../shared/device/prepare-mlx-cuda.sh (.device/q1 ... qN) into two folders,
# .device/c1 and .device/c2, each as large as one device call can carry beside this working tree (64 MiB per call,
# tree included). The shared script splits the build into equal parts, which takes two calls only while the tree
# is under ~26.4 MiB; filling the first call up to the limit takes two calls up to a tree of ~27.2 MiB.
#   bash tools/dev/stage_two_calls.sh
#   call 1, carry [".device/c1"]: mkdir -p /root/vq-stage && cp .device/c1/* /root/vq-stage/
#   call 2, carry [".device/c2"]: mkdir -p /root/vq-stage && cp .device/c2/* /root/vq-stage/ && bash /root/vq-stage/install.sh && <work>
# The room left over is shared equally by the two calls (at least MARGIN_KIB each, default 1024: the device counted
# a tree of 27,671 KiB beside 37,515 KiB as over 64 MiB); anything else a call carries (a corpus, scripts) must fit
# in it, or travel in a call of its own.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
parts=(.device/q*/cuda.part*)
[[ -e "${parts[0]}" ]] || { echo "no .device/q*/cuda.part*: run ../shared/device/prepare-mlx-cuda.sh first"; exit 2; }
last=$(ls -d .device/q* | sort -V | tail -1)
limit=$((64 * 1048576))
margin=$((${MARGIN_KIB:-1024} * 1024))
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
extras=$(cat "$last"/install.sh "$last"/*.whl | wc -c)
total=$(cat $(printf '%s\n' "${parts[@]}" | sort -V) | wc -c)
slack=$((2 * (limit - tree) - total - extras))        # what the two calls leave free together
first=$((limit - tree - slack / 2))
second=$((total - first + extras))
if (( slack < 2 * margin )); then
  echo "the tree ($((tree / 1048576)) MiB) and MLX ($(((total + extras) / 1048576)) MiB) do not fit in two calls of 64 MiB: use the q folders, one call each (../shared/device/prepare-mlx-cuda.sh)"
  exit 2
fi
rm -rf .device/c1 .device/c2
mkdir -p .device/c1 .device/c2
cat $(printf '%s\n' "${parts[@]}" | sort -V) > .device/cuda.tar.xz
head -c "$first" .device/cuda.tar.xz > .device/c1/cuda.part00
tail -c +"$((first + 1))" .device/cuda.tar.xz > .device/c2/cuda.part01
rm .device/cuda.tar.xz
cp "$last"/install.sh "$last"/*.whl .device/c2/
echo "staged in 2 calls beside a tree of $((tree / 1024)) KiB: .device/c1 $(($(du -cb .device/c1 | tail -1 | cut -f1) / 1024)) KiB, .device/c2 $(($(du -cb .device/c2 | tail -1 | cut -f1) / 1024)) KiB (limit $((limit / 1024)) KiB per call with the tree; $((slack / 2048)) KiB free in each)"
