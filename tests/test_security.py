"""Security of `cairn serve` and the engine (issue 16 §5): API keys, the Host and Origin guards
against DNS rebinding and cross-site POSTs, idle connections, and what the engine writes.

Request-given file names (slot save/restore) are checked by src/core/safepath (tests/c/
test_safepath.c); body and header bounds by tests/test_http_robustness.py."""
import os
import socket
import stat

from engine_client import Engine
from test_http_robustness import assert_openai_error, chat_body, servers  # noqa: F401 (fixture)

KEY = "sk-cairn-0123456789abcdef"


def test_api_key_variants(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--api-key", KEY], fake=True)
    for bad in [KEY[:-1] + "X", KEY[:-1], KEY + "0", "", KEY.upper(), "x" * len(KEY)]:
        st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"Authorization": f"Bearer {bad}"})
        assert_openai_error(b, 401, st)
        st, _, b = s.json("POST", "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
                          {"x-api-key": bad})
        assert st == 401, (bad, b)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"Authorization": f"Bearer {KEY}"})
    assert st == 200, b
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"x-api-key": KEY})
    assert st == 200, b


def test_cross_site_post_is_refused_reads_are_not(servers, tiny_dsv4):
    s = servers(tiny_dsv4, fake=True)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"Origin": "http://evil.example"})
    assert_openai_error(b, 403, st)
    assert b["error"]["code"] == "origin_not_allowed"
    # text/plain is what a page can send without a preflight
    st, _, b = s.request("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 2}',
                         {"Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert st == 403, b
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {"Origin": "http://localhost:5173"})
    assert st == 200, b
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"))
    assert st == 200, b
    st, _, b = s.json("GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert st == 200, b


def test_dns_rebinding_is_refused(servers, tiny_dsv4):
    """evil.example re-resolved to 127.0.0.1: the browser sends its own name as Host."""
    s = servers(tiny_dsv4, fake=True)
    for path in ["/v1/models", "/v1/chat/completions", "/health"]:
        st, _, b = s.json("POST" if "chat" in path else "GET", path, chat_body("x") if "chat" in path else None,
                          {"Host": f"evil.example:{s.port}", "Origin": f"http://evil.example:{s.port}"})
        assert st == 403, (path, b)
    st, _, b = s.json("GET", "/v1/models", headers={"Host": f"localhost:{s.port}"})
    assert st == 200


def test_idle_connection_is_closed(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--read-timeout", "1"], fake=True)
    c = socket.create_connection(("127.0.0.1", s.port))
    c.settimeout(60)                      # a hang guard, not a timing assertion
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le")
    assert c.recv(100) == b"", "a stalled request was kept open"
    c.close()
    assert s.request("GET", "/health")[0] == 200


def test_engine_writes_only_owner_readable_state(cairn, tiny_dsv4, tmp_path):
    kv = str(tmp_path / "kv")
    e = Engine(cairn, tiny_dsv4, "--ctx", "128", "--kv-dir", kv)
    e.generate([20, 21, 22, 23], 2)
    assert e.close() == 0
    assert stat.S_IMODE(os.stat(kv).st_mode) == 0o700
    names = sorted(os.listdir(kv))
    assert names == ["slot-0.cairnkv", "slot-0.cairnkv.ckpt", "slot-0.cairnkv.tail"], names
    for n in names:
        assert stat.S_IMODE(os.stat(os.path.join(kv, n)).st_mode) == 0o600, n


def test_engine_cannot_gain_privileges(cairn, tiny_dsv4):
    e = Engine(cairn, tiny_dsv4, "--ctx", "64")
    try:
        status = open(f"/proc/{e.p.pid}/status").read()
        assert "NoNewPrivs:\t1" in status, status
    finally:
        assert e.close() == 0
