#!/usr/bin/python3
"""`make soak` (not in CI): `cairn serve` under a long mixed load, then checks that nothing leaked.

1. Slow loris: a probe request's latency on an idle server, then with 200 connections trickling
   their headers one byte a second; the ratio of the medians is reported (the probe must not wait
   for them).
2. Load: 500 concurrent connections (autocannon, tests/node/soak_load.mjs) cycling OpenAI and
   Anthropic requests, streaming and not, for --seconds. Only 200 and 429 (each 429 with
   Retry-After) may come back, with no socket errors or timeouts. RSS and open fds of the server
   and the engine are sampled after the warm-up (the first --warmup seconds) and at the end,
   both times with every loris connection open (Loris.all_open).
3. Afterwards: every slot free, nothing queued, the engine never restarted, RSS end / after
   warm-up <= 1.05 for both processes, fds back to what they were, and reuse still exact (a
   two-turn conversation reuses and matches a freshly started server).

usage: scripts/soak.py [-m MODEL_DIR] [--seconds 600] [--warmup 60] [--connections 500] [--loris 200]
                       [--rss-every S]
--rss-every S also prints both processes' RSS every S seconds of the load (the growth curve).
Exits 1 if any check fails; prints every figure either way."""
import argparse
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import conftest  # noqa: E402
from test_http_robustness import Server  # noqa: E402

NODE_DIR = os.path.join(ROOT, "tests", "node")


def proc_status(pid):
    """(RSS bytes, open fds) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def probe(s, text="probe"):
    t0 = time.perf_counter()
    st, _, b = s.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": text}],
                                                       "max_tokens": 8, "temperature": 0})
    assert st == 200, b
    return time.perf_counter() - t0


class Loris:
    """n connections that send a request's headers one byte a second, reconnecting when closed."""

    HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Pad: " + \
        b"a" * 4000

    def __init__(self, port, n):
        self.port, self.stop, self.open, self.lock = port, threading.Event(), 0, threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                c = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                time.sleep(1)
                continue
            self.count(1)
            try:
                for b in self.HEAD:
                    if self.stop.wait(1):
                        break
                    c.sendall(bytes([b]))
            except OSError:
                pass
            self.count(-1)
            c.close()

    def count(self, d):
        with self.lock:
            self.open += d

    def all_open(self, timeout=10):
        """Wait (up to timeout s) until every connection is open again. The server's header deadline
        cuts them all every 30 s and they reconnect within a second or two; RSS sampled in that gap
        counts up to 200 fewer connections (each a thread stack and a mapped memory pool, ~3.5 MiB
        for all of them), which is not growth or its absence."""
        end = time.monotonic() + timeout
        while self.open < len(self.threads) and time.monotonic() < end:
            time.sleep(0.05)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def drop_logs(tmp):
    for f in glob.glob(os.path.join(tmp, "serve-*.log")) + glob.glob(os.path.join(tmp, "fake-*.jsonl")):
        os.remove(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", dest="model")
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--loris", type=int, default=200)
    ap.add_argument("--rss-every", type=float, default=0)
    a = ap.parse_args()
    model = a.model or conftest.make_model("deepseek_v4")
    tmp = os.path.join(ROOT, "build", "soak")
    os.makedirs(tmp, exist_ok=True)
    # The servers log every request (~1 GB over a full run): a run keeps its logs only if it
    # fails, and the next run starts by removing them.
    drop_logs(tmp)
    limit = str(2 * (a.connections + a.loris) + 64)
    args = ["--slots", "4", "--max-queue", "256", "--max-tokens", "8", "--queue-timeout", "20",
            "--max-connections", limit, "--max-connections-per-ip", limit, "--read-timeout", "600"]
    s = Server(model, tmp, args)
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    try:
        engine_pid = s.health()["engine"]["pid"]
        # 1. slow loris
        probe(s)
        idle = [probe(s, f"probe {i}") for i in range(10)]
        loris = Loris(s.port, a.loris)
        while loris.open < a.loris:
            time.sleep(0.2)
        busy = [probe(s, f"probe {i}") for i in range(10)]
        ratio = statistics.median(busy) / statistics.median(idle)
        check(ratio <= 1.5, f"slow loris: probe median {statistics.median(idle) * 1e3:.1f} ms idle, "
              f"{statistics.median(busy) * 1e3:.1f} ms with {loris.open} loris connections open (x{ratio:.2f})")
        # 2. load, loris still trickling
        url = f"http://127.0.0.1:{s.port}"
        load = subprocess.Popen(["node", os.path.join(NODE_DIR, "soak_load.mjs"), url, str(a.connections),
                                 str(a.seconds)], cwd=NODE_DIR, stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()

        def pause(seconds):
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(left, a.rss_every) if a.rss_every else left)
                if a.rss_every:
                    print(f"rss at {time.monotonic() - t0:4.0f} s: server {proc_status(s.p.pid)[0] / 2**20:.1f} MiB, "
                          f"engine {proc_status(engine_pid)[0] / 2**20:.1f} MiB", flush=True)
        pause(a.warmup)
        loris.all_open()
        warm = {"server": proc_status(s.p.pid), "engine": proc_status(engine_pid)}
        pause(max(1, a.seconds - a.warmup - 5))
        loris.all_open()
        end = {"server": proc_status(s.p.pid), "engine": proc_status(engine_pid)}
        out, _ = load.communicate()
        loris.close()
        res = json.loads(out.strip().splitlines()[-1])
        codes = res["seen"]["status"]
        print(f"load: {res['requests']} requests over {a.seconds} s on {a.connections} connections: {codes}", flush=True)
        check(res["errors"] == 0 and res["timeouts"] == 0, f"no socket errors ({res['errors']}) or timeouts "
              f"({res['timeouts']})")
        check(set(codes) <= {"200", "429"} and int(codes.get("200", 0)) > 0, "only 200 and 429")
        check(res["seen"]["missingRetryAfter"] == 0, f"every 429 has Retry-After "
              f"({res['seen']['missingRetryAfter']} without)")
        for who in ("server", "engine"):
            r = end[who][0] / warm[who][0]
            check(r <= 1.05, f"{who} RSS {warm[who][0] >> 20} MiB after warm-up, {end[who][0] >> 20} MiB at the end "
                  f"(x{r:.3f})")
        # 3. afterwards
        time.sleep(2)
        h = s.health()
        check(h["slots"]["busy"] == 0 and h["slots"]["waiting"] == 0, f"slots free, queue empty: {h['slots']}")
        check(h["engine"]["pid"] == engine_pid and h["engine"]["restarts"] == 0, "the engine never restarted")
        after = {"server": proc_status(s.p.pid), "engine": proc_status(engine_pid)}
        base_fds = {"server": warm["server"][1], "engine": warm["engine"][1]}
        print(f"fds: after warm-up (under load) {base_fds}, idle afterwards "
              f"{ {k: v[1] for k, v in after.items()} }", flush=True)
        check(after["engine"][1] <= base_fds["engine"], "engine fds not leaked")
        check(after["server"][1] <= base_fds["server"], "server fds back to at most the loaded count")
        # The history's assistant message is one this server did not generate: its own reply would
        # go back to the engine as the ids it generated (--reply-ids), which a fresh server does not
        # have, so the two would be fed different ids whenever the reply does not re-tokenize to
        # them (random tiny models emit invalid UTF-8, which comes back as U+FFFD). The warm turn
        # still reuses the first turn's prompt from the slot.
        convo = [{"role": "user", "content": "after the soak, tell me something"}]
        st, _, first = s.json("POST", "/v1/chat/completions", {"messages": convo, "max_tokens": 6, "temperature": 0})
        check(st == 200, f"a first turn after the soak: {st}")
        convo += [{"role": "assistant", "content": "Here is something."}, {"role": "user", "content": "and more"}]
        st, _, warm_reply = s.json("POST", "/v1/chat/completions", {"messages": convo, "max_tokens": 6,
                                                                    "temperature": 0})
        cold = Server(model, tmp, ["--slots", "1"])
        try:
            st, _, cold_reply = cold.json("POST", "/v1/chat/completions", {"messages": convo, "max_tokens": 6,
                                                                            "temperature": 0})
        finally:
            cold.stop()
        cached = warm_reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        check(cached > 0 and warm_reply["choices"][0]["message"] == cold_reply["choices"][0]["message"],
              f"reuse exact afterwards ({cached} cached tokens, reply equals a fresh server's)")
    finally:
        s.stop()
    if failures:
        print(f"soak: the servers' logs are kept in {tmp}")
    else:
        drop_logs(tmp)
    print("soak: " + ("PASS" if not failures else f"FAIL ({len(failures)})"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
