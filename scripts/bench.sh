#!/bin/sh
# make bench: every figure is a ratio measured in this one run (bandwidth fractions, fractions of
# the measured FMA peak, warm/cold TTFT, batched/single decode, 2-thread/1-thread speed), then a
# table of issue 12's targets with the measured figure beside each.
# Bench models (>= 2 GB each) are generated once into build/models/.
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
OUT=build/bench
mkdir -p $OUT
for fam in deepseek_v4 glm inkling; do
    dir=build/models/$fam-bench-1234
    [ -f "$dir/config.json" ] || { echo "bench: generating $dir (once)"; $PY tools/make_tiny.py $fam "$dir" --size bench; }
done
echo "== kernels: matvec weight bytes/s / measured read bandwidth, batched GFLOP/s / measured FMA peak"
build/cairn bench kernels
for fam in deepseek_v4 glm inkling; do
    m=build/models/$fam-bench-1234
    echo "== $fam: prefill / decode (decode_efficiency = weight bytes per token x tok/s / read bandwidth)"
    build/cairn bench -m $m --prompt 256 --json > $OUT/$fam-model.json
    build/cairn bench -m $m --prompt 256 --threads 1 --json > $OUT/$fam-model-1t.json
    cat $OUT/$fam-model.json
    echo "== $fam: batched decode of 1/2/4/8 conversations, one forward call per step"
    build/cairn bench concurrency -m $m --json > $OUT/$fam-concurrency.json
    cat $OUT/$fam-concurrency.json
    echo "== $fam: prefix reuse over a 10-turn conversation (warm/cold and warm/tail TTFT)"
    build/cairn bench reuse -m $m
    echo "== $fam: constrained decoding (grammar work per step / decode step, on this vocabulary)"
    build/cairn bench grammar -m $m
    echo "== $fam: MTP speculative decoding (verify k+1 / decode step, acceptance, projection at 0.8)"
    rm -f $OUT/$fam-mtp.json
    if build/cairn bench mtp -m $m --json > $OUT/$fam-mtp.json.tmp; then mv $OUT/$fam-mtp.json.tmp $OUT/$fam-mtp.json; cat $OUT/$fam-mtp.json
    else rm -f $OUT/$fam-mtp.json.tmp; fi
done
$PY - $OUT <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    with open(f"{out}/{name}.json") as f:
        return json.load(f)
print("\n== issue 12 targets (measured in this run)")
fams = ("deepseek_v4", "glm", "inkling")
print(f"{'target':58}" + "".join(f" {f:>14}" for f in fams))
rows = []
for fam in fams:
    m, m1, c = load(f"{fam}-model"), load(f"{fam}-model-1t"), load(f"{fam}-concurrency")
    mtp = load(f"{fam}-mtp") if os.path.exists(f"{out}/{fam}-mtp.json") else None
    rows.append({
        "prefill GFLOP/s >= 1.2 x llama.cpp Q8_0 (235 Xeon, 110 Zen 3)": f"{m['prefill_gflops']:.1f}",
        "  prefill as a fraction of the measured f32 FMA peak": f"{m['prefill_vs_fma_peak']:.3f}",
        "decode efficiency >= 0.85": f"{m['decode_efficiency']:.3f}",
        "4 conversations aggregate / one >= 2.5 (concurrency_ratio_4)": f"{c['concurrency_ratio_4']:.2f}",
        "prefill 2 threads / 1 thread >= 1.8": f"{m['prefill_tok_s'] / m1['prefill_tok_s']:.2f}",
        "decode 2 threads / 1 thread >= 1.8": f"{m['decode_tok_s'] / m1['decode_tok_s']:.2f}",
        "MTP: verify k+1 tokens / one decode step (mtp_verify_cost_ratio)":
            f"{mtp['mtp_verify_cost_ratio']:.2f}" if mtp else "no MTP draft",
        "MTP: acceptance seen (random weights: ~0)": f"{mtp['mtp_acceptance']:.3f}" if mtp else "-",
        "MTP: measured speedup / projected at acceptance 0.8":
            f"{mtp['spec_speedup']:.2f}/{mtp['projected_speedup_at_0_8']:.2f}" if mtp else "-",
    })
for k in rows[0]:
    print(f"{k:58}" + "".join(f" {r[k]:>14}" for r in rows))
EOF
