#!/bin/sh
# make bench: every figure is a ratio measured in this one run (bandwidth fractions, fractions of
# the measured FMA peak, warm/cold TTFT, batched/single decode, 2-thread/1-thread speed), then a
# table of issue 12's targets with the measured figure beside each.
# Bench models (~2 GB each) are generated into build/models/ once per version of their generator.
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
OUT=build/bench
mkdir -p $OUT
for fam in deepseek_v4 glm inkling kimi_k3; do
    dir=build/models/$fam-bench-1234
    # once, and again when its generator changed since (a stale shape would bench the old model)
    [ "$dir/config.json" -nt tools/tiny_$fam.py ] || {
        echo "bench: generating $dir"; rm -rf "$dir"; $PY tools/make_tiny.py $fam "$dir" --size bench; }
done
echo "== kernels: matvec weight bytes/s / measured read bandwidth, batched GFLOP/s / measured FMA peak"
build/cairn bench kernels
for fam in deepseek_v4 glm inkling kimi_k3; do
    m=build/models/$fam-bench-1234
    echo "== $fam: prefill / decode (decode_efficiency = weight bytes per token x tok/s / read bandwidth;"
    echo "   thread_scaling_* = tok/s on every core / on one, both timed in this run)"
    build/cairn bench -m $m --prompt 256 --json > $OUT/$fam-model.json
    cat $OUT/$fam-model.json
    echo "== $fam: batched decode of 1/2/4/8 conversations, one forward call per step"
    build/cairn bench concurrency -m $m --json > $OUT/$fam-concurrency.json
    cat $OUT/$fam-concurrency.json
    # 15 back-to-back pairs per turn: on a 2-core VM one pair's ratio scatters by +-8 % (even at
    # load 1.5); the median of 15 is what tells the engine's work apart from the machine's noise.
    echo "== $fam: prefix reuse over a 10-turn conversation (warm/cold and warm/tail TTFT)"
    build/cairn bench reuse -m $m --repeat 15
    echo "== $fam: constrained decoding (grammar work per step / decode step, on this vocabulary)"
    build/cairn bench grammar -m $m
    echo "== $fam: MTP speculative decoding (verify k+1 / decode step, acceptance, projection at 0.8)"
    rm -f $OUT/$fam-mtp.json
    if build/cairn bench mtp -m $m --json > $OUT/$fam-mtp.json.tmp; then mv $OUT/$fam-mtp.json.tmp $OUT/$fam-mtp.json; cat $OUT/$fam-mtp.json
    else rm -f $OUT/$fam-mtp.json.tmp; fi
done
# A checkpoint larger than RAM: the DeepSeek V4 bench model in a memory cgroup of half its size
# (the page cache counts against the limit), decoded from disk through the mapping and through
# the expert cache with a quarter of the limit as its budget (docs/scale.md).
memcg_run() {   # memcg_run LIMIT_BYTES CMD...: CMD inside a new memory cgroup (v1, else v2)
    if [ -w /sys/fs/cgroup/memory ]; then cg=/sys/fs/cgroup/memory/cairn-bench-$$; knob=memory.limit_in_bytes
    elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null && [ -w /sys/fs/cgroup ]; then
        cg=/sys/fs/cgroup/cairn-bench-$$; knob=memory.max
    else
        echo "bench: no writable memory cgroup (run as root): larger-than-RAM figures not measured" >&2
        return 1
    fi
    mkdir "$cg" && echo "$1" > "$cg/$knob" || return 1
    shift
    rc=0
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" || rc=$?
    rmdir "$cg"
    return $rc
}
m=build/models/deepseek_v4-bench-1234
size=$(cat $m/*.safetensors | wc -c)
limit=$((size / 2))
echo "== larger than RAM: $m ($((size >> 20)) MiB) in a memory cgroup of $((limit >> 20)) MiB, decode from disk"
if memcg_run $limit build/cairn bench -m $m --prompt 16 --decode 16 --expert-cache-mb $((limit / 4 >> 20)) --json \
        > $OUT/deepseek_v4-disk.json; then
    cat $OUT/deepseek_v4-disk.json
else
    rm -f $OUT/deepseek_v4-disk.json
fi

# Real shape: every family's full-size checkpoint as sparse files (holes read as zeros), one
# prompt token and one decode step with a 2 GiB expert cache in a memory cgroup of 8 GiB. Slow
# (every dense page of a 12-100+ GB model is faulted per step): it proves a step is feasible.
for fam in deepseek_v4 glm kimi_k3 inkling; do
    d=build/models/sparse-$fam
    [ -f "$d/config.json" ] || $PY tools/make_sparse.py $fam "$d" > /dev/null
    echo "== real shape $fam: one decode step, expert cache 2048 MiB, memory cgroup 8 GiB"
    if memcg_run $((8 << 30)) build/cairn run -m $d --prompt-ids 0 -n 2 --ctx 64 --temperature 0 --ignore-eos \
            --expert-cache-mb 2048 > /dev/null 2> $OUT/$fam-real-shape.txt; then
        $PY tools/real_shape_line.py $OUT/$fam-real-shape.txt
    else
        tail -3 $OUT/$fam-real-shape.txt
    fi
done

$PY - $OUT <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    with open(f"{out}/{name}.json") as f:
        return json.load(f)
print("\n== issue 12 targets (measured in this run)")
fams = ("deepseek_v4", "glm", "inkling", "kimi_k3")
print(f"{'target':58}" + "".join(f" {f:>14}" for f in fams))
rows = []
for fam in fams:
    m, c = load(f"{fam}-model"), load(f"{fam}-concurrency")
    mtp = load(f"{fam}-mtp") if os.path.exists(f"{out}/{fam}-mtp.json") else None
    rows.append({
        "prefill GFLOP/s >= 1.2 x llama.cpp Q8_0 (235 Xeon, 110 Zen 3, ~200 Zen 5 *)": f"{m['prefill_gflops']:.1f}",
        "  prefill as a fraction of the measured f32 FMA peak": f"{m['prefill_vs_fma_peak']:.3f}",
        "decode efficiency >= 0.85": f"{m['decode_efficiency']:.3f}",
        "4 conversations aggregate / one >= 2.5 (concurrency_ratio_4)": f"{c['concurrency_ratio_4']:.2f}",
        "  decode, 1 conversation: dense / experts GB/s, other time":
            f"{c['dense_gbs_1']:.1f}/{c['experts_gbs_1']:.1f}/{100 * c['other_share_1']:.0f}%",
        "  decode, 4 conversations: dense / experts GB/s, other time":
            f"{c['dense_gbs_4']:.1f}/{c['experts_gbs_4']:.1f}/{100 * c['other_share_4']:.0f}%",
        "decode tok/s beside a 512-token prefill, joined/apart (mix)":
            f"{c['mix_decode_tok_s_joined']:.2f}/{c['mix_decode_tok_s_apart']:.2f}",
        "prefill 2 threads / 1 thread >= 1.8 (thread_scaling_prefill)": f"{m['thread_scaling_prefill']:.2f}",
        "decode 2 threads / 1 thread >= 1.8 (thread_scaling_decode)": f"{m['thread_scaling_decode']:.2f}",
        "MTP: verify k+1 tokens / one decode step (mtp_verify_cost_ratio)":
            f"{mtp['mtp_verify_cost_ratio']:.2f}" if mtp else "no MTP draft",
        "MTP: acceptance seen (random weights: ~0)": f"{mtp['mtp_acceptance']:.3f}" if mtp else "-",
        "MTP: measured speedup / projected at acceptance 0.8":
            f"{mtp['spec_speedup']:.2f}/{mtp['projected_speedup_at_0_8']:.2f}" if mtp else "-",
    })
for k in rows[0]:
    print(f"{k:58}" + "".join(f" {r[k]:>14}" for r in rows))
print("* Zen 5 (EPYC, 2 cores): llama.cpp itself was not measured there; ggml's Q8_0 matmul, the kernel its\n"
      "  prefill runs (test-backend-ops perf, m=4096 n=512 k=14336, 2 threads, llamafile sgemm on as in\n"
      "  llama.cpp builds), gave 159-168 GFLOP/s: an upper bound of its model figure, so 1.2 x that is a\n"
      "  target at least as strict as the issue's.")
try:
    d = load("deepseek_v4-disk")
    mm, ec = d["mmap"], d["expert_cache"]
    print(f"\n== larger than RAM (deepseek_v4 bench model, cgroup of half its size; disk {d['disk_read_gbs']:.2f} GB/s)")
    print(f"{'':34} {'mmap':>12} {'expert cache':>14}")
    print(f"{'decode tok/s':34} {mm['decode_tok_s']:12.3f} {ec['decode_tok_s']:14.3f}")
    print(f"{'MB read from disk per token':34} {mm['bytes_read_per_token'] / 1e6:12.1f} {ec['bytes_read_per_token'] / 1e6:14.1f}")
    print(f"{'  as a fraction of disk bandwidth':34} {mm['disk_read_fraction']:12.3f} {ec['disk_read_fraction']:14.3f}")
    print(f"{'expert-cache hit rate':34} {'':>12} {ec['hit_rate']:14.3f}")
    print(f"expert cache / mmap decode: {d['cache_over_mmap_decode']:.2f}; greedy ids identical: {d['identical']}")
except FileNotFoundError:
    print("\n== larger than RAM: not measured (no writable memory cgroup)")
EOF
