"""Robustness of `cairn serve` (issue 5 point 6): bounds, queue + 429, disconnects, engine
crashes, bad input, API key, Host guard, SSE keep-alive, graceful SIGTERM, a bounded load run.

Behaviour that needs a slow or misbehaving engine uses tests/fake_engine.py (a scripted engine
speaking the same line protocol) on the tiny DeepSeek V4 model's template and tokenizer: those tests
are about the gateway, which treats every family alike. The tests that run the real engine run on
the tiny model of every family (fixture family_model)."""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import CAIRN, ROOT

FAKE = os.path.join(ROOT, "tests", "fake_engine.py")
NODE_MODULES = os.path.join(ROOT, "tests", "node", "node_modules")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `cairn serve` process on a loopback port (a free one unless given); its stderr goes to a
    file of its own."""

    def __init__(self, model, tmp, args=(), env=None, fake=False, port=None):
        self.port = port or free_port()
        self.log_path = os.path.join(tmp, f"serve-{self.port}-{time.monotonic_ns()}.log")
        self.fake_log = os.path.join(tmp, f"fake-{self.port}.jsonl")
        e = dict(os.environ, FAKE_LOG=self.fake_log, **(env or {}))
        cmd = [CAIRN, "serve", "-m", model, "--port", str(self.port), *args]
        if fake:
            cmd += ["--engine", FAKE]
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen(cmd, stderr=self.log, stdout=self.log, env=e)
        deadline = time.time() + 60
        while True:
            assert self.p.poll() is None, "server exited at start-up:\n" + self.logtext()
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            assert time.time() < deadline, "server never became healthy:\n" + self.logtext()
            time.sleep(0.05)

    def logtext(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def fake_frames(self):
        if not os.path.exists(self.fake_log):
            return []
        with open(self.fake_log) as f:
            return [json.loads(line) for line in f]

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = self.conn(timeout)
        h = {"Content-Type": "application/json", **(headers or {})}
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        out = r.status, dict(r.getheaders()), r.read()
        c.close()
        return out

    def json(self, method, path, body=None, headers=None):
        st, h, data = self.request(method, path, body, headers)
        return st, h, json.loads(data) if data else None

    def health(self):
        return self.json("GET", "/health")[2]

    def engine_pid(self):
        """The running engine's pid, never 0: while the engine restarts /health reports pid 0, and
        os.kill(0, SIGKILL) would kill the test's own process group (pytest and make with it)."""
        seen = {}

        def live():
            seen.update(self.health()["engine"])      # one read: "up" and "pid" of the same moment
            return seen["up"] and seen["pid"] > 0
        wait_until(live, what="engine up")
        return seen["pid"]

    def wait_restarts(self, n):
        """Wait until the gateway has restarted the engine n times in all and the new one is up; one
        /health read per check, so "up" and "restarts" describe the same moment."""
        def done():
            e = self.health()["engine"]
            return e["up"] and e["pid"] > 0 and e["restarts"] >= n
        wait_until(done, what=f"engine restart {n}")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


@pytest.fixture
def servers(tmp_path):
    started = []

    def start(model, args=(), env=None, fake=False):
        s = Server(model, str(tmp_path), args, env, fake)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def chat_body(text, **kw):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0, **kw}


def assert_openai_error(body, status, st):
    assert st == status, body
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    assert body["error"]["message"]


def wait_until(cond, timeout=20, what="condition"):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def open_stream(port, path, body):
    """Send a POST on a raw socket (so the test can drop it mid-reply); returns (socket, line reader)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock, sock.makefile("rb")


def stream_lines(resp):
    """Yield SSE lines of an http.client response as they arrive."""
    while True:
        line = resp.readline()
        if not line:
            return
        yield line.decode().rstrip("\n")


def test_bad_input_gets_400_with_error_shapes(servers, tiny_dsv4):
    s = servers(tiny_dsv4, fake=True)
    st, _, b = s.json("POST", "/v1/chat/completions", b"{not json")
    assert_openai_error(b, 400, st)
    assert b["error"]["code"] == "invalid_json"
    st, _, b = s.json("POST", "/v1/chat/completions", b"")
    assert_openai_error(b, 400, st)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x", temperature="hot"))
    assert_openai_error(b, 400, st)
    assert b["error"]["param"] == "temperature"
    st, _, b = s.json("POST", "/v1/chat/completions", {"messages": "hello"})
    assert_openai_error(b, 400, st)
    assert b["error"]["param"] == "messages"
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x", n=9))
    assert_openai_error(b, 400, st)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x", max_tokens=-1))
    assert_openai_error(b, 400, st)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x", stop=[1, 2]))
    assert_openai_error(b, 400, st)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x", model="gpt-4o"))
    assert_openai_error(b, 404, st)
    assert b["error"]["code"] == "model_not_found"
    st, _, b = s.json("POST", "/v1/completions", {"prompt": [1, -5], "max_tokens": 2})
    assert_openai_error(b, 400, st)
    assert b["error"]["param"] == "prompt"
    st, _, b = s.json("POST", "/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1})
    assert_openai_error(b, 400, st)
    st, _, b = s.json("GET", "/v1/nothing-here")
    assert_openai_error(b, 404, st)
    # The Anthropic endpoint answers in its own envelope.
    st, _, b = s.json("POST", "/v1/messages", {"messages": [{"role": "user", "content": "x"}]})
    assert st == 400 and b["type"] == "error" and b["error"]["type"] == "invalid_request_error", b
    assert "max_tokens" in b["error"]["message"]
    st, _, b = s.json("POST", "/v1/messages", {"model": "claude-x", "max_tokens": 5, "messages": []})
    assert st == 404 and b["error"]["type"] == "not_found_error", b
    # None of this reached the engine, and the server still works.
    assert not [f for f in s.fake_frames() if f["cmd"] == "SUBMIT"]
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("fine"))
    assert st == 200 and b["choices"][0]["message"]["content"].startswith("w0 w1"), b


def heap_bytes(pid):
    """Size of the process's malloc heap (the [heap] mapping), resident or not."""
    with open(f"/proc/{pid}/maps") as f:
        spans = [line.split()[0].split("-") for line in f if line.rstrip().endswith("[heap]")]
    return sum(int(b, 16) - int(a, 16) for a, b in spans)


@pytest.mark.parametrize("max_header", [None, "32768"])
def test_connection_memory_pools_live_outside_the_heap(servers, tiny_dsv4, max_header):
    """libmicrohttpd maps a connection's memory pool (--max-header) on its own only above 32 KiB;
    the default is above it, so connections that come and go leave no holes in the heap
    (gateway.c DEFAULT_MAX_HEADER, docs/reliability.md §4). 32768 is the contrast: there every
    open connection's pool is in the heap, and the measure sees it."""
    n = 60
    s = servers(tiny_dsv4, ["--max-connections", "100", "--max-connections-per-ip", "100"] +
                (["--max-header", max_header] if max_header else []), fake=True)
    s.health()
    before = heap_bytes(s.p.pid)
    held = [s.conn() for _ in range(n)]
    for c in held:                 # keep-alive: each connection keeps its pool after its reply
        c.request("GET", "/health")
        r = c.getresponse()
        assert r.status == 200
        r.read()
    grown = heap_bytes(s.p.pid) - before
    for c in held:
        c.close()
    if max_header:
        assert grown >= n * 32768 // 2, grown
    else:
        assert grown < n * 32768 // 4, grown


def test_body_header_and_connection_bounds(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--max-body", "4096", "--max-connections-per-ip", "4"], fake=True)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x" * 10000))
    assert_openai_error(b, 413, st)
    # Chunked: no Content-Length to refuse up front, the bound applies as the body arrives.
    c = s.conn()
    c.request("POST", "/v1/chat/completions", body=iter([b'{"messages": "', b"y" * 9000, b'"}']),
              headers={"Content-Type": "application/json"}, encode_chunked=True)
    r = c.getresponse()
    assert_openai_error(json.loads(r.read()), 413, r.status)
    c.close()
    # A header block larger than the per-connection memory bound is refused by the HTTP layer.
    st, _, _ = s.request("GET", "/health", headers={"X-Big": "y" * 100000})
    assert st in (413, 431), st
    # Connections beyond the per-IP bound are closed at once; the server keeps serving.
    held = []

    def hold_one():             # the refused connections above may take a moment to be released
        c = s.conn()
        try:
            c.request("GET", "/health")
            if c.getresponse().read():
                held.append(c)
                return True
        except OSError:
            pass
        c.close()
        return False
    for _ in range(4):          # four kept-alive connections, each known to be accepted
        wait_until(hold_one, what="a kept-alive connection to be accepted")
    extra = socket.create_connection(("127.0.0.1", s.port))
    extra.settimeout(5)
    extra.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    try:
        assert extra.recv(100) == b"", "connection over the per-IP limit was served"
    except ConnectionResetError:
        pass
    extra.close()
    for c in held:
        c.close()

    def serves_again():     # the server notices the closed connections a moment later
        try:
            return s.request("GET", "/health")[0] == 200
        except OSError:
            return False
    wait_until(serves_again, what="server to serve again")


def trickle_until_closed(sock, nbytes, pause):
    """Send one header byte every `pause` seconds (each resets the idle timeout); return the
    seconds until the server closed the connection, or None if all nbytes went through."""
    t0 = time.monotonic()
    for _ in range(nbytes):
        try:
            sock.sendall(b"a")
            sock.settimeout(pause)
            if sock.recv(100) == b"":
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def test_header_deadline_cuts_a_trickling_client(servers, tiny_dsv4):
    """--header-timeout is a total bound on a request's headers (issue 16 §4): a client that
    trickles header bytes faster than the idle timeout is cut after it; a request whose headers
    arrived is never cut by it, however long its stream runs; an idle kept-alive connection is
    held to the same bound for its next request."""
    s = servers(tiny_dsv4, ["--header-timeout", "2", "--read-timeout", "120"], {"FAKE_TOKEN_DELAY": "0.3"},
                fake=True)
    stream = s.conn()
    stream.request("POST", "/v1/chat/completions", json.dumps(chat_body("long", max_tokens=12, stream=True)),
                   {"Content-Type": "application/json"})
    reply = stream.getresponse()
    loris = socket.create_connection(("127.0.0.1", s.port))
    loris.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nX-Pad: ")
    cut_after = trickle_until_closed(loris, 250, 0.2)      # 250 bytes = 50 s of trickling
    loris.close()
    assert cut_after is not None, "a client trickling its headers for 50 s was never cut"
    assert 1.9 <= cut_after < 50, cut_after
    lines = [x for x in stream_lines(reply) if x]    # began before the loris, ran past the 2 s bound
    stream.close()
    assert lines[-1] == "data: [DONE]", lines
    text = "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or "" for x in lines[:-1])
    assert text.split() == [f"w{i}" for i in range(12)], text
    kept = socket.create_connection(("127.0.0.1", s.port))
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    kept.settimeout(60)
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        reply += kept.recv(4096)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert kept.recv(100) == b"", "an idle kept-alive connection outlived the header deadline"
    kept.close()
    st, _, text = s.request("GET", "/metrics")
    cuts = [int(x.split()[1]) for x in text.decode().splitlines() if x.startswith("cairn_header_timeouts_total")]
    assert cuts and cuts[0] >= 2, cuts
    assert "request headers took longer than 2 s" in s.logtext()


def test_queue_bound_gives_429_with_retry_after(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--slots", "1", "--max-queue", "1"], {"FAKE_TOKEN_DELAY": "0.1"}, fake=True)
    conns = []
    for i in range(3):
        c = s.conn()
        c.request("POST", "/v1/chat/completions", json.dumps(chat_body(f"q{i}", max_tokens=10)).encode(),
                  {"Content-Type": "application/json"})
        conns.append(c)
        time.sleep(0.2)        # in order: the first runs, the second queues, the third finds the queue full
    results = []
    for c in conns:
        r = c.getresponse()
        results.append((r.status, r.getheader("Retry-After"), json.loads(r.read())))
        c.close()
    statuses = sorted(st for st, _, _ in results)
    assert statuses == [200, 200, 429], results
    st, retry, body = [x for x in results if x[0] == 429][0]
    assert retry == "1" and body["error"]["code"] == "queue_full", results
    h = s.health()
    assert h["slots"]["busy"] == 0 and h["slots"]["waiting"] == 0 and h["slots"]["rejected"] == 1, h


def test_disconnect_mid_stream_cancels_and_holds_slot_until_ack(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--slots", "1"], {"FAKE_TOKEN_DELAY": "0.05", "FAKE_CANCEL_DELAY": "1.0"}, fake=True)
    sock, f = open_stream(s.port, "/v1/chat/completions", chat_body("long", max_tokens=1000, stream=True))
    assert f.readline().startswith(b"HTTP/1.1 200")
    lines = stream_lines(f)
    got = [next(lines) for _ in range(20)]
    assert any('"content"' in x for x in got), got
    f.close()
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    wait_until(lambda: any(f["cmd"] == "CANCEL" for f in s.fake_frames()), what="CANCEL frame")
    cancel_time = time.time()
    # The engine has not acknowledged yet (1 s delay): the slot must still be held.
    assert s.health()["slots"]["busy"] == 1
    wait_until(lambda: s.health()["slots"]["busy"] == 0, what="slot release after the ack")
    assert time.time() - cancel_time >= 0.7, "slot released before the engine acknowledged the CANCEL"
    cancels = [f for f in s.fake_frames() if f["cmd"] == "CANCEL"]
    assert len(cancels) == 1, cancels
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("next"))
    assert st == 200 and b["choices"][0]["message"]["content"], b


def test_engine_crash_gives_clean_errors_and_restarts(servers, tiny_dsv4):
    s = servers(tiny_dsv4, env={"FAKE_CRASH_ON": "boom", "FAKE_TOKEN_DELAY": "0.05"}, fake=True)
    pid0 = s.health()["engine"]["pid"]
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("boom now"))
    assert_openai_error(b, 503, st)
    assert b["error"]["code"] == "engine_restarted"
    # Streaming: headers were already sent, so the error arrives as an SSE error event.
    c = s.conn()
    wait_until(lambda: s.health()["engine"]["up"], what="engine restart")
    c.request("POST", "/v1/chat/completions", json.dumps(chat_body("boom again", stream=True)).encode(),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    events = [json.loads(x[6:]) for x in stream_lines(r) if x.startswith("data: {")]
    assert "error" in events[-1] and events[-1]["error"]["code"] == "engine_restarted", events
    c.close()
    wait_until(lambda: s.health()["engine"]["up"], what="engine restart")
    h = s.health()
    assert h["engine"]["restarts"] == 2 and h["engine"]["pid"] != pid0, h
    assert h["slots"]["busy"] == 0, h
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("calm"))
    assert st == 200 and b["choices"][0]["message"]["content"], b


def test_real_engine_killed_mid_request_recovers(servers, family_model):
    s = servers(family_model.model, ["--ctx", "1024"])
    first = s.json("POST", "/v1/chat/completions", chat_body("warm up", max_tokens=4))
    assert first[0] == 200, first
    # The kill goes out once the first chunk arrives; a tiny model can reach EOS (or its budget)
    # before the signal lands. Such a stream ended cleanly and proves nothing, so try again on a
    # fresh prompt (the engine was killed all the same and restarts); the test fails if no kill
    # ever lands mid-stream.
    for attempt in range(8):
        pid = s.engine_pid()
        c = s.conn()
        body = chat_body(f"a long answer, take {attempt}", max_tokens=900, stream=True)
        c.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        lines = stream_lines(r)
        assert r.status == 200
        next(lines)
        os.kill(pid, signal.SIGKILL)
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        c.close()
        s.wait_restarts(attempt + 1)
        if "error" in events[-1]:
            break
        assert events[-1]["choices"][0]["finish_reason"], events[-1]   # it ended before the kill
    last = events[-1]
    assert "error" in last and last["error"]["code"] == "engine_restarted", f"no kill landed mid-stream in 8 attempts: {last}"
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("after the crash", max_tokens=4))
    assert st == 200 and b["usage"]["completion_tokens"] == 4, b
    assert s.health()["engine"]["restarts"] == attempt + 1


def test_api_key_and_host_guard(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--api-key", "sekrit"], fake=True)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"))
    assert_openai_error(b, 401, st)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"Authorization": "Bearer wrong"})
    assert_openai_error(b, 401, st)
    st, _, b = s.json("POST", "/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})
    assert st == 401 and b["error"]["type"] == "authentication_error", b
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"Authorization": "Bearer sekrit"})
    assert st == 200, b
    st, _, b = s.json("POST", "/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]},
                      {"x-api-key": "sekrit"})
    assert st == 200 and b["type"] == "message", b
    assert s.request("GET", "/health")[0] == 200           # public
    assert s.request("GET", "/metrics")[0] == 401
    # DNS-rebinding guard on a loopback bind.
    st, _, b = s.json("GET", "/v1/models", headers={"Host": "evil.example:80", "Authorization": "Bearer sekrit"})
    assert_openai_error(b, 403, st)
    st, _, b = s.json("GET", "/v1/models", headers={"Host": f"localhost:{s.port}", "Authorization": "Bearer sekrit"})
    assert st == 200 and b["data"][0]["id"] == os.path.basename(tiny_dsv4), b


def test_non_loopback_bind_needs_a_key(tiny_dsv4):
    r = subprocess.run([CAIRN, "serve", "-m", tiny_dsv4, "--host", "0.0.0.0", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--api-key" in r.stderr, r.stderr


def test_sse_keepalive_during_long_prefill(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--keepalive", "0.2"], {"FAKE_ACCEPT_DELAY": "1.2"}, fake=True)
    for path, body, ping in [
        ("/v1/chat/completions", chat_body("slow", max_tokens=2, stream=True), ": keep-alive"),
        ("/v1/messages", {"max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "slow"}]},
         "event: ping"),
    ]:
        c = s.conn()
        c.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        lines = list(stream_lines(r))
        c.close()
        first_text = next(i for i, x in enumerate(lines) if "w0" in x)
        pings = [i for i, x in enumerate(lines[:first_text]) if x.startswith(ping)]
        assert len(pings) >= 3, lines[:first_text]


def test_graceful_sigterm_finishes_in_flight(servers, tiny_dsv4):
    s = servers(tiny_dsv4, env={"FAKE_TOKEN_DELAY": "0.05"}, fake=True)
    c = s.conn()
    c.request("POST", "/v1/chat/completions", json.dumps(chat_body("finish me", max_tokens=20, stream=True)).encode(),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    lines = stream_lines(r)
    next(lines)
    s.p.send_signal(signal.SIGTERM)
    rest = list(lines)
    assert rest[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in rest, rest[-5:]
    content = "".join(json.loads(x[6:])["choices"][0]["delta"].get("content", "")
                      for x in rest if x.startswith("data: {") and json.loads(x[6:])["choices"])
    assert content.count("w") >= 19, content
    assert s.p.wait(30) == 0
    frames = [f["cmd"] for f in s.fake_frames()]
    assert frames[-1] == "EOF", frames          # the engine got EOF only after the request finished
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", s.port), timeout=2)


def test_autocannon_load_no_errors_no_leaks_reuse_exact(servers, family_model, tmp_path):
    warm_kv, cold_kv = tmp_path / "warm-kv", tmp_path / "cold-kv"
    warm_kv.mkdir()
    cold_kv.mkdir()
    s = servers(family_model.model, ["--slots", "2", "--max-queue", "4", "--max-tokens", "4", "--kv-dir", str(warm_kv)])
    body = json.dumps(chat_body("load test", max_tokens=4))
    r = subprocess.run(["node", os.path.join(NODE_MODULES, "autocannon", "autocannon.js"), "-a", "200", "-c", "8",
                        "-m", "POST", "-H", "content-type=application/json", "-b", body, "-t", "60", "-j",
                        f"http://127.0.0.1:{s.port}/v1/chat/completions"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    codes = {k: v["count"] for k, v in res.get("statusCodeStats", {}).items()}
    assert res["errors"] == 0 and res["timeouts"] == 0, res
    assert sum(codes.values()) == 200 and set(codes) <= {"200", "429"} and codes.get("200", 0) > 0, codes
    h = s.health()
    assert h["slots"]["busy"] == 0 and h["slots"]["waiting"] == 0, h
    # Reuse is still exact afterwards: a two-turn conversation reuses and matches a cold engine fed
    # the same ids (a fresh server given only the warm one's reply ids).
    convo = [{"role": "user", "content": "after the load, tell me something"}]
    st, _, a = s.json("POST", "/v1/chat/completions", {"messages": convo, "max_tokens": 6, "temperature": 0})
    assert st == 200
    convo += [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
              {"role": "user", "content": "and more"}]
    st, _, warm = s.json("POST", "/v1/chat/completions", {"messages": convo, "max_tokens": 6, "temperature": 0})
    assert st == 200 and warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, warm
    shutil.copy(warm_kv / "reply_ids", cold_kv / "reply_ids")
    cold_server = servers(family_model.model, ["--slots", "1", "--max-tokens", "4", "--kv-dir", str(cold_kv)])
    st, _, cold = cold_server.json("POST", "/v1/chat/completions", {"messages": convo, "max_tokens": 6, "temperature": 0})
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, cold
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]


def test_metrics_count_requests_tokens_and_reuse(servers, tiny_dsv4):
    s = servers(tiny_dsv4, fake=True)
    msgs = [{"role": "user", "content": "one"}]
    st, _, a = s.json("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 3})
    msgs += [{"role": "assistant", "content": a["choices"][0]["message"]["content"]}, {"role": "user", "content": "two"}]
    st, _, b = s.json("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 3})
    reused = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert reused > 0, b
    st, h, text = s.request("GET", "/metrics")
    assert st == 200 and h["Content-Type"].startswith("text/plain")
    m = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    prompt = a["usage"]["prompt_tokens"] + b["usage"]["prompt_tokens"]
    assert m['cairn_requests_total{endpoint="/v1/chat/completions",status="200"}'] == 2
    assert m["cairn_prompt_tokens_total"] == prompt
    assert m["cairn_prompt_tokens_reused_total"] == reused
    assert m["cairn_prompt_tokens_prefilled_total"] == prompt - reused
    assert m["cairn_completion_tokens_total"] == 6
    assert m['cairn_ttft_seconds_bucket{le="+Inf"}'] == 2 and m["cairn_ttft_seconds_count"] == 2
    # One log line per request, with its status and token counts.
    posts = [x for x in s.logtext().splitlines() if x.startswith("cairn serve: POST /v1/chat/completions")]
    assert len(posts) == 2, posts
    assert " 200 " in posts[1] and f"cached={reused} " in posts[1], posts[1]


def test_engine_frames_read_as_the_spec_says(servers, tiny_dsv4):
    """Telemetry and unknown frame kinds are ignored, a DONE with only 7 fields means the
    missing trailing fields are 0 (prompt tokens then come from ACCEPT)."""
    s = servers(tiny_dsv4, env={"FAKE_ODD": "1"}, fake=True)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("odd frames", max_tokens=3))
    assert st == 200, b
    prompt = [f for f in s.fake_frames() if f["cmd"] == "SUBMIT"][-1]["prompt"]
    assert b["choices"][0]["message"]["content"] == "w0 w1 w2 "
    assert b["usage"]["prompt_tokens"] == len(prompt.encode())
    assert b["usage"]["completion_tokens"] == 3
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert b["choices"][0]["finish_reason"] == "stop"
    assert s.health()["engine"]["restarts"] == 0


def test_busy_port_fails_before_the_engine_starts(tiny_dsv4, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        log = tmp_path / "fake.jsonl"
        r = subprocess.run([CAIRN, "serve", "-m", tiny_dsv4, "--port", str(port), "--engine", FAKE],
                           capture_output=True, text=True, timeout=30, env=dict(os.environ, FAKE_LOG=str(log)))
    assert r.returncode == 1 and "cannot listen" in r.stderr, r.stderr
    assert not log.exists(), "the engine was started although the port was busy"


def test_cache_slot_and_user_pin_the_engine_slot(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--slots", "3"], fake=True)
    for slot in (2, 0, 1, 2):
        st, _, b = s.json("POST", "/v1/chat/completions", chat_body(f"pinned {slot}", cache_slot=slot))
        assert st == 200, b
        assert [f for f in s.fake_frames() if f["cmd"] == "SUBMIT"][-1]["slot"] == slot
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x", cache_slot=3))
    assert_openai_error(b, 400, st)
    assert b["error"]["param"] == "cache_slot"
    # The same user always lands on the same slot, whatever the conversation.
    used = set()
    for text in ("first talk", "something else entirely", "a third one"):
        s.json("POST", "/v1/chat/completions", chat_body(text, user="alice"))
        used.add([f for f in s.fake_frames() if f["cmd"] == "SUBMIT"][-1]["slot"])
    assert len(used) == 1, used


def test_engine_that_cannot_start_stops_the_server(tiny_dsv4):
    r = subprocess.run([CAIRN, "serve", "-m", tiny_dsv4, "--port", str(free_port()), "--engine", "/bin/false"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "engine failed to start" in r.stderr, r.stderr


def lower_keys(h):
    return {k.lower(): v for k, v in h.items()}


def assert_cors(h, origin):
    h = lower_keys(h)
    assert h.get("access-control-allow-origin") == origin, h
    assert "Origin" in h.get("vary", ""), h
    exposed = {x.strip().lower() for x in h.get("access-control-expose-headers", "").split(",")}
    assert {"x-request-id", "retry-after"} <= exposed, h


def assert_no_cors(h):
    assert not [k for k in lower_keys(h) if k.startswith("access-control-")], h


def test_cors_default_origins_on_every_reply_and_preflight(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--api-key", "sekrit"], fake=True)
    ui, key = "http://localhost:5173", {"Authorization": "Bearer sekrit"}
    st, h, b = s.json("GET", "/v1/models", headers={"Origin": ui, **key})
    assert st == 200, b
    assert_cors(h, ui)
    st, h, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"Origin": ui})   # no key: still refused
    assert_openai_error(b, 401, st)
    assert_cors(h, ui)
    st, h, b = s.json("POST", "/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]},
                      {"Origin": "tauri://localhost", "x-api-key": "sekrit"})
    assert st == 200 and b["type"] == "message", b
    assert_cors(h, "tauri://localhost")
    c = s.conn()
    c.request("POST", "/v1/chat/completions", json.dumps(chat_body("s", max_tokens=3, stream=True)).encode(),
              {"Content-Type": "application/json", "Origin": ui, **key})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    assert_cors(dict(r.getheaders()), ui)
    assert list(stream_lines(r))[-2] == "data: [DONE]"
    c.close()
    # Another site's page is served as before, but without the headers its browser needs to read it.
    st, h, b = s.json("GET", "/v1/models", headers={"Origin": "http://evil.example", **key})
    assert st == 200 and b["data"], b
    assert_no_cors(h)
    st, h, _ = s.request("GET", "/v1/models", headers=key)
    assert st == 200 and "vary" not in lower_keys(h)
    assert_no_cors(h)

    # Preflights carry no key; the requested headers come back, or a list covering the SDKs'.
    st, h, b = s.request("OPTIONS", "/v1/chat/completions",
                         headers={"Origin": ui, "Access-Control-Request-Method": "POST",
                                  "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
    assert st == 204 and b == b"", (st, b)
    assert_cors(h, ui)
    h = lower_keys(h)
    assert {m.strip() for m in h["access-control-allow-methods"].split(",")} == {"GET", "POST", "DELETE", "OPTIONS"}, h  # DELETE: /v1/responses/{id}
    assert h["access-control-allow-headers"] == "authorization,content-type,x-stainless-os", h
    assert int(h["access-control-max-age"]) > 0, h
    st, h, _ = s.request("OPTIONS", "/v1/messages", headers={"Origin": "http://127.0.0.1:8000"})
    assert st == 204
    allowed = {x.strip().lower() for x in lower_keys(h)["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-api-key", "anthropic-version", "anthropic-beta",
            "openai-organization", "openai-project"} <= allowed, h
    st, h, _ = s.request("OPTIONS", "/v1/messages", headers={"Origin": ui, "Access-Control-Request-Headers": "a\tb"})
    assert st == 204 and "anthropic-version" in lower_keys(h)["access-control-allow-headers"], h
    st, h, _ = s.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://evil.example"})
    assert st == 204
    assert_no_cors(h)
    # The Host guard still holds for a preflight.
    st, h, b = s.json("OPTIONS", "/v1/chat/completions", headers={"Origin": ui, "Host": "evil.example"})
    assert_openai_error(b, 403, st)


def test_cors_origin_flag_replaces_defaults_and_star_allows_any(servers, tiny_dsv4, tmp_path):
    s = servers(tiny_dsv4, ["--cors-origin", "https://chat.example", "--cors-origin", "http://[::1]:3000"], fake=True)
    st, h, _ = s.json("GET", "/v1/models", headers={"Origin": "https://chat.example"})
    assert st == 200
    assert_cors(h, "https://chat.example")
    st, h, _ = s.json("GET", "/v1/models", headers={"Origin": "http://[::1]:3000"})
    assert_cors(h, "http://[::1]:3000")
    st, h, _ = s.json("GET", "/v1/models", headers={"Origin": "http://localhost:5173"})
    assert st == 200
    assert_no_cors(h)

    s = servers(tiny_dsv4, ["--cors-origin", "*"], fake=True)
    st, h, b = s.json("POST", "/v1/chat/completions", chat_body("x", model="nope"), {"Origin": "https://any.example"})
    assert_openai_error(b, 404, st)
    assert_cors(h, "*")
    st, h, _ = s.request("OPTIONS", "/v1/models", headers={"Origin": "null"})
    assert st == 204
    assert_cors(h, "*")

    for bad in ["https://chat.example/", "chat.example", "https://"]:
        r = subprocess.run([CAIRN, "serve", "-m", tiny_dsv4, "--port", str(free_port()), "--cors-origin", bad],
                           capture_output=True, text=True)
        assert r.returncode != 0 and "--cors-origin" in r.stderr and bad in r.stderr, (bad, r.stderr)
