#!/bin/sh
# make bench: every figure is a ratio measured in this one run (bandwidth fractions, warm/cold TTFT).
# Bench models (>= 2 GB each) are generated once into build/models/.
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
for fam in deepseek_v4 glm inkling; do
    dir=build/models/$fam-bench-1234
    [ -f "$dir/config.json" ] || { echo "bench: generating $dir (once)"; $PY tools/make_tiny.py $fam "$dir" --size bench; }
done
echo "== kernels: matvec weight bytes/s / measured read bandwidth"
build/cairn bench kernels
for fam in deepseek_v4 glm inkling; do
    echo "== $fam: prefill / decode (decode_efficiency = weight bytes per token x tok/s / read bandwidth)"
    build/cairn bench -m build/models/$fam-bench-1234
    echo "== $fam: prefix reuse over a 10-turn conversation (warm/cold and warm/tail TTFT)"
    build/cairn bench reuse -m build/models/$fam-bench-1234
done
