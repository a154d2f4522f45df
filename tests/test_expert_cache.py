"""The expert cache (--expert-cache-mb, src/core/experts.h) on every family: routed experts read
with pread into a small LRU budget give output bit-identical to the mmapped checkpoint, and the
counters prove the budget evicted, the reader thread read ahead, and the usage counts saved
beside --kv-dir pinned experts on the next start. Bad budgets are refused by name."""
import json
import os
import re
import subprocess

import pytest

from engine_client import Engine

PROMPT = "3,17,5,29,11,2,23,7,19,13,31,37,41,43"
STATS = re.compile(r"expert-cache: (.*)")
LARGEST = re.compile(r"the largest \(layer \d+\) is (\d+) bytes")


def run(cairn, model, *args):
    return subprocess.run([cairn, "run", "-m", model, *args], capture_output=True, text=True)


def generate(cairn, model, *extra):
    """Greedy prompt + decode with every step's top logprobs, as JSON lines."""
    r = run(cairn, model, "--prompt-ids", PROMPT, "-n", "12", "--temperature", "0", "--format", "jsonl",
            "--top-logprobs", "4", "--prefill-chunks", "5,1", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def stats(stderr):
    m = STATS.search(stderr)
    assert m, "no expert-cache stats line:\n" + stderr[-2000:]
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def largest_expert(cairn, model):
    """The size of the model's largest routed expert, from the refusal of a budget too small."""
    r = run(cairn, model, "--prompt-ids", "1", "-n", "1", "--expert-cache-mb", "0.0001")
    m = LARGEST.search(r.stderr)
    assert r.returncode != 0 and m, r.stderr[-2000:]
    return int(m.group(1))


def mb(nbytes):
    return "%.9f" % ((nbytes + 1) / 1048576)


def test_tiny_budget_is_bit_identical_and_evicts(cairn, family_model):
    model = family_model.model
    mapped = generate(cairn, model)
    assert "expert-cache" not in mapped.stderr
    budget = 2 * largest_expert(cairn, model)          # the least the cache accepts: it must evict
    cached = generate(cairn, model, "--expert-cache-mb", mb(budget))
    assert cached.stdout == mapped.stdout
    s = stats(cached.stderr)
    assert budget <= s["budget_bytes"] <= budget + 1 and s["resident_bytes"] <= s["budget_bytes"]
    assert s["uses"] > 0 and s["hits"] + s["misses"] == s["uses"]
    assert s["evictions"] > 0 and s["read_errors"] == 0
    assert s["reads"] >= s["misses"] and s["bytes_read"] > 0
    # Each call's first missing expert is queued for the reader thread, which reads it while the
    # compute waits or works: the read-ahead did reads.
    assert s["reader_reads"] > 0


def test_roomy_budget_hits_and_predicts(cairn, family_model):
    """With room for many experts, decode finds most of them resident, and the next layer's
    experts are queued by prediction; still bit-identical."""
    model = family_model.model
    mapped = generate(cairn, model)
    cached = generate(cairn, model, "--expert-cache-mb", mb(64 * largest_expert(cairn, model)))
    assert cached.stdout == mapped.stdout
    s = stats(cached.stderr)
    assert s["hits"] > 0 and s["hit_rate"] > 0
    assert s["predicted"] >= s["predicted_reads"] and s["predicted_hits"] <= s["hits"]


def engine_run(cairn, model, kv, budget):
    e = Engine(cairn, model, "--ctx", "64", "--kv-dir", kv, "--expert-cache-mb", budget)
    try:
        ids = [int(x) for x in PROMPT.split(",")]
        out = e.generate(ids=ids, max_tokens=10).ids
    finally:
        assert e.close() == 0
    return out, stats(e.read_stderr())


def test_usage_counts_beside_kv_dir_pin_experts(cairn, family_model, tmp_path):
    model = family_model.model
    kv = str(tmp_path / "kv")
    budget = mb(16 * largest_expert(cairn, model))
    first, s1 = engine_run(cairn, model, kv, budget)
    assert s1["pinned"] == 0                                     # nothing counted yet
    assert os.path.getsize(os.path.join(kv, "expert_usage.bin")) > 20
    second, s2 = engine_run(cairn, model, kv, budget)
    assert second == first
    assert s2["pinned"] > 0 and s2["pinned_hits"] > 0
    # a file of another checkpoint is refused and changes nothing
    with open(os.path.join(kv, "expert_usage.bin"), "r+b") as f:
        f.seek(8)
        f.write(b"\xff" * 8)
    e = Engine(cairn, model, "--ctx", "64", "--kv-dir", kv, "--expert-cache-mb", budget)
    try:
        assert e.generate(ids=[int(x) for x in PROMPT.split(",")], max_tokens=10).ids == first
    finally:
        e.close()
    assert "is not of this checkpoint; ignored" in e.read_stderr()
    assert stats(e.read_stderr())["pinned"] == 0


@pytest.mark.parametrize("value,message", [
    ("0", "bad value for --expert-cache-mb: '0'"),
    ("-3", "bad value for --expert-cache-mb: '-3'"),
    ("lots", "bad value for --expert-cache-mb: 'lots'"),
    ("0.0001", "cannot hold two routed experts"),
])
def test_bad_budget_is_a_clear_error(cairn, tiny_dsv4, value, message):
    for sub in (["run", "--prompt-ids", "1", "-n", "1"], ["engine"]):
        r = subprocess.run([cairn, sub[0], "-m", tiny_dsv4, "--expert-cache-mb", value, *sub[1:]],
                           capture_output=True, text=True, input="")
        assert r.returncode != 0 and message in r.stderr, (sub, r.stderr[-2000:])


def test_bench_compares_mmap_and_cache(cairn, tiny_dsv4):
    """`cairn bench -m DIR --expert-cache-mb N --json` (the larger-than-RAM bench, here on a tiny
    model that fits): both passes report, the cache's counters are its own, the ids agree."""
    budget = mb(2 * largest_expert(cairn, tiny_dsv4))
    r = subprocess.run([cairn, "bench", "-m", tiny_dsv4, "--prompt", "4", "--decode", "6", "--expert-cache-mb", budget,
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["identical"] is True and out["decode"] == 6
    for k in ("mmap", "expert_cache"):
        assert out[k]["decode_tok_s"] > 0 and out[k]["bytes_read_per_token"] >= 0
    assert out["mmap"]["hit_rate"] == 0 and out["mmap"]["expert_bytes_read_per_token"] == 0
    assert out["expert_cache"]["expert_bytes_read_per_token"] > 0       # a two-expert budget must read
    assert out["disk_read_gbs"] > 0
