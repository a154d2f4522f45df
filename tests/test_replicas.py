"""Replicas behind nginx with conversation affinity (issue 17 §2), run with deploy/nginx.conf and
deploy/conversation.js as shipped (only the loopback ports are changed, and for the round-robin
comparison the `hash` line is removed).

30 conversations of 4 turns are interleaved in one shuffled order. Each names itself one of the
ways docs/scale.md describes: the X-Conversation-Id header, the OpenAI `user` field, the
Anthropic `metadata.user_id` field, or nothing (nginx hashes the opening messages), over both
APIs. The reuse hit rate is cached ÷ prompt tokens over every turn, from each reply's usage.

  single replica: one `cairn serve` with the slots of all three, the conversations sent to it;
  affinity:       three replicas behind nginx's consistent hash;
  round-robin:    the same three behind nginx without the hash line.

Affinity must reach 0.9 of the single replica's rate and round-robin must be clearly lower, so
the comparison can fail either way. Then one replica is stopped: the other conversations keep
their replica (X-Cairn-Replica, which nginx adds); it is restarted on its --kv-dir and its own
conversations come back to it and reuse what it saved."""
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import ROOT
from test_http_robustness import Server, free_port, wait_until

NGINX = "/usr/sbin/nginx"
DEPLOY = os.path.join(ROOT, "deploy")
N_CONV, N_TURNS, SLOTS = 30, 4, 20
# How each conversation names itself, by index modulo 5: (API, key).
MODES = [("openai", "header"), ("openai", "user"), ("anthropic", "metadata.user_id"), ("openai", "opening"),
         ("anthropic", "opening")]
WORDS = ("river stone lantern orbit maple copper violet harbor meadow signal quartz ember willow canyon "
         "falcon glacier ribbon tundra saffron beacon").split()


def nginx_conf(tmp, listen, replica_ports, hashed):
    """deploy/nginx.conf with the test's ports, written beside a copy of conversation.js."""
    text = open(os.path.join(DEPLOY, "nginx.conf")).read()
    subs = [("listen 127.0.0.1:8080;", f"listen 127.0.0.1:{listen};")]
    subs += [(f"server 127.0.0.1:{8081 + i};", f"server 127.0.0.1:{p};") for i, p in enumerate(replica_ports)]
    if not hashed:
        subs.append(("hash $conversation consistent;", ""))
    for old, new in subs:
        assert text.count(old) == 1, f"deploy/nginx.conf no longer has exactly one '{old}'"
        text = text.replace(old, new)
    os.makedirs(tmp, exist_ok=True)
    shutil.copy(os.path.join(DEPLOY, "conversation.js"), tmp)
    path = os.path.join(tmp, "nginx.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


class Nginx:
    """nginx in the foreground with its prefix (pid, logs, temp files) in a directory of the test."""

    def __init__(self, prefix, conf, port):
        self.prefix, self.port = prefix, port
        for d in ("logs", "tmp"):
            os.makedirs(os.path.join(prefix, d), exist_ok=True)
        self.err = os.path.join(prefix, "logs", "error.log")
        self.p = subprocess.Popen([NGINX, "-p", prefix, "-e", self.err, "-c", conf, "-g", "daemon off;"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        while True:
            assert self.p.poll() is None, "nginx exited at start-up:\n" + open(self.err).read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                return
            except OSError:
                time.sleep(0.05)

    def access_log(self, lines):
        """The access log once it has `lines` lines (nginx writes a line just after the reply)."""
        def log():
            with open(os.path.join(self.prefix, "logs", "access.log")) as f:
                return f.read().splitlines()
        wait_until(lambda: len(log()) >= lines, what=f"{lines} lines in nginx's access log")
        return log()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(30)


class Conversation:
    def __init__(self, i, tag):
        self.i, (self.api, self.mode) = i, MODES[i % len(MODES)]
        self.key = f"{tag}-conversation-{i}"
        rng = random.Random(f"{tag}{i}")
        self.lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(N_TURNS + 3)]
        self.history = []          # (role, text)
        self.turns = []            # (prompt tokens, cached tokens, X-Cairn-Replica)

    def request(self):
        n = len(self.history) // 2
        self.history.append(("user", f"Conversation {self.i}, message {n}: {self.lines[n]}."))
        msgs = [{"role": r, "content": t} for r, t in self.history]
        headers = {"Content-Type": "application/json"}
        if self.mode == "header":
            headers["X-Conversation-Id"] = self.key
        if self.api == "openai":
            body = {"messages": msgs, "max_tokens": 8, "temperature": 0}
            if self.mode == "user":
                body["user"] = self.key
            return "/v1/chat/completions", body, headers
        body = {"messages": msgs, "max_tokens": 8, "temperature": 0}
        if self.mode == "metadata.user_id":
            body["metadata"] = {"user_id": self.key}
        return "/v1/messages", body, headers

    def answer(self, body, replica):
        if self.api == "openai":
            text = body["choices"][0]["message"]["content"] or ""
            u = body["usage"]
            prompt, cached = u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]
        else:
            text = "".join(b.get("text", "") for b in body["content"])
            u = body["usage"]
            cached = u["cache_read_input_tokens"]
            prompt = u["input_tokens"] + cached
        self.history.append(("assistant", text))
        self.turns.append((prompt, cached, replica))


def turn(port, conv):
    path, body, headers = conv.request()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, json.dumps(body).encode(), headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200, (r.status, data[:300])
    conv.answer(json.loads(data), r.getheader("X-Cairn-Replica"))


def run_workload(port, tag, seed):
    """30 conversations × 4 turns, interleaved in a shuffled order; returns them."""
    convs = [Conversation(i, tag) for i in range(N_CONV)]
    order = [c for c in convs for _ in range(N_TURNS)]
    random.Random(seed).shuffle(order)
    for conv in order:
        turn(port, conv)
    return convs


def hit_rate(turns):
    prompt = sum(t[0] for t in turns)
    return sum(t[1] for t in turns) / prompt


def all_turns(convs):
    return [t for c in convs for t in c.turns]


@pytest.fixture
def cluster(tmp_path, tiny_glm):
    assert os.path.exists(NGINX), "nginx missing: scripts/deps.sh installs nginx and libnginx-mod-http-js"
    started = []

    def replica(port=None, slots=SLOTS, kv_dir=None):
        args = ["--slots", str(slots), "--ctx", "512", "--max-tokens", "8"]
        if kv_dir:
            args += ["--kv-dir", kv_dir]
        s = Server(tiny_glm, str(tmp_path), args, port=port)
        started.append(s)
        return s

    def nginx(name, ports, hashed):
        prefix = os.path.join(str(tmp_path), name)
        port = free_port()
        n = Nginx(prefix, nginx_conf(prefix, port, ports, hashed), port)
        started.append(n)
        return n

    yield replica, nginx
    for s in reversed(started):
        s.stop()


def test_affinity_keeps_reuse_round_robin_loses_it_restart_moves_nothing(cluster, tmp_path):
    replica, nginx = cluster
    # Single replica, the slots of all three.
    one = replica(slots=3 * SLOTS)
    single = hit_rate(all_turns(run_workload(one.port, "w", 7)))
    one.stop()

    # Round-robin over three fresh replicas.
    rr_replicas = [replica() for _ in range(3)]
    rr_nginx = nginx("rr", [r.port for r in rr_replicas], hashed=False)
    rr = hit_rate(all_turns(run_workload(rr_nginx.port, "w", 7)))
    rr_nginx.stop()
    for r in rr_replicas:
        r.stop()

    # Affinity over three fresh replicas, each warm-restartable from its --kv-dir.
    kv = [os.path.join(str(tmp_path), f"kv{i}") for i in range(3)]
    reps = [replica(kv_dir=d) for d in kv]
    ng = nginx("affinity", [r.port for r in reps], hashed=True)
    convs = run_workload(ng.port, "w", 7)
    affinity = hit_rate(all_turns(convs))
    print(f"reuse hit rate: single replica {single:.3f}, affinity {affinity:.3f} ({affinity / single:.3f} of "
          f"single), round-robin {rr:.3f} ({rr / single:.3f} of single)")
    assert affinity >= 0.9 * single, (affinity, single)
    assert rr <= 0.75 * affinity, (rr, affinity)

    # Every conversation stayed on one replica, and the conversations use all three.
    addr = {f"127.0.0.1:{r.port}": k for k, r in enumerate(reps)}
    home = {}
    for c in convs:
        seen = {t[2] for t in c.turns}
        assert len(seen) == 1 and seen <= set(addr), (c.i, c.mode, seen)
        home[c.i] = addr[seen.pop()]
    assert set(home.values()) == {0, 1, 2}, home
    # conversation.js found each key where the conversation put it.
    sources = [line.rsplit("key_from=", 1)[1] for line in ng.access_log(N_CONV * N_TURNS)]
    want = {m: N_TURNS * sum(MODES[i % len(MODES)][1] == m for i in range(N_CONV)) for _, m in MODES}
    assert {m: sources.count(m) for m in want} == want, sources

    # One replica stops: nobody else's conversation moves.
    victim = max(range(3), key=lambda k: sum(h == k for h in home.values()))
    reps[victim].stop()
    others = [c for c in convs if home[c.i] != victim]
    for c in others:
        turn(ng.port, c)
        assert addr[c.turns[-1][2]] == home[c.i], (c.i, c.turns[-1][2])
    assert hit_rate([c.turns[-1] for c in others]) >= 0.9 * hit_rate([c.turns[-2] for c in others])

    # It comes back on its --kv-dir: its conversations return to it and reuse what it saved.
    mine = [c for c in convs if home[c.i] == victim]
    before = hit_rate([c.turns[-1] for c in mine])
    reps[victim] = replica(port=reps[victim].port, kv_dir=kv[victim])
    for c in mine:
        turn(ng.port, c)
        assert addr[c.turns[-1][2]] == victim, (c.i, c.turns[-1][2])
    after = hit_rate([c.turns[-1] for c in mine])
    print(f"restarted replica: its {len(mine)} conversations reuse {after:.3f} of their prompts "
          f"(last turn before the restart {before:.3f})")
    assert after >= 0.9 * before, (after, before)

    # Stopped again, its conversations are still answered: nginx tries it first, then the next
    # replica on the ring (X-Cairn-Replica lists every address tried).
    reps[victim].stop()
    turn(ng.port, mine[0])
    tried = [a.strip() for a in mine[0].turns[-1][2].split(",")]
    assert len(tried) == 2 and addr[tried[0]] == victim and addr[tried[1]] != victim, tried

    # No key at all (a raw completions prompt) is the empty key, and a key of the wrong type
    # counts as absent: the chat is keyed by its opening (the replica then refuses the field).
    # Lines are counted from the requests sent (nginx may write a reply's line after the client
    # read it, so the log's current length can still miss the previous request).
    sent = [N_CONV * N_TURNS + len(others) + len(mine) + 1]

    def post(path, body):
        c = http.client.HTTPConnection("127.0.0.1", ng.port, timeout=120)
        c.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        status = c.getresponse().status
        c.close()
        sent[0] += 1
        return status, ng.access_log(sent[0])[sent[0] - 1].rsplit("key_from=", 1)[1]
    assert post("/v1/completions", {"prompt": "hello", "max_tokens": 2}) == (200, "none")
    assert post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "user": 5,
                                         "max_tokens": 2}) == (400, "opening")
