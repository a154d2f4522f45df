#!/usr/bin/python3
"""What making each turn durable before its DONE costs: the same conversation is run on two
engines in one run, one with --kv-dir (the slot's new positions are appended and fsync'ed, the
tail rewritten, before DONE goes out) and one without, and per turn the time from the turn's last
DATA frame to its DONE is compared. The difference is the latency a client sees added per turn.

usage: scripts/durability_latency.py [-m MODEL_DIR] [--kv-dir DIR] [--turns N] [--grow K]
Default model: the tiny DeepSeek V4 model the tests generate; default kv dir: a temporary
directory on the file system of build/ (put it on the disk you want to measure)."""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from engine_client import Engine  # noqa: E402
import conftest  # noqa: E402


def done_gap(e, ids, max_tokens):
    """(seconds from the last DATA to DONE, the reply) of one turn."""
    rid = "t%d" % (len(e.replies) + 1)
    rep = e.submit(rid, ids=ids, max_tokens=max_tokens)
    last = time.perf_counter()
    while not rep.finished:
        f, _ = e.pump()
        if f and f[0] == "DATA" and f[1] == rid:
            last = time.perf_counter()
    return time.perf_counter() - last, rep


def run(model, args, turns, grow, seed):
    r = random.Random(seed)
    e = Engine(os.path.join(ROOT, "build", "cairn"), model, "--ctx", str(turns * (grow + 8) + 16), *args)
    ids, gaps = [], []
    for _ in range(turns):
        ids = ids + [r.randrange(20, 200) for _ in range(grow)]
        gap, rep = done_gap(e, ids, 8)
        assert rep.done is not None, rep.error
        gaps.append(gap)
        ids = ids + rep.ids
    e.close()
    return gaps, len(ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", dest="model")
    ap.add_argument("--kv-dir")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--grow", type=int, default=64, help="new prompt tokens per turn")
    a = ap.parse_args()
    model = a.model or conftest.make_model("deepseek_v4")
    kv = a.kv_dir or tempfile.mkdtemp(prefix="kv-", dir=os.path.join(ROOT, "build"))
    with_kv, n = run(model, ["--kv-dir", kv], a.turns, a.grow, 1)
    without, _ = run(model, [], a.turns, a.grow, 1)
    med_kv, med_no = statistics.median(with_kv) * 1e3, statistics.median(without) * 1e3
    print(f"model {model}, {a.turns} turns of +{a.grow} tokens (final context {n}), kv-dir {kv}")
    print(f"last DATA -> DONE, median: {med_kv:.2f} ms with --kv-dir, {med_no:.2f} ms without: "
          f"+{med_kv - med_no:.2f} ms per turn (max {max(with_kv) * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
