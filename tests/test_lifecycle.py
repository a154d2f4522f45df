"""Ctrl-C and systemd stops (issue 13 §6): SIGINT sent to the whole process group, as a terminal
does, must not kill the engine child with the gateway. The gateway drains the replies in flight
(they end with a finish reason and [DONE], not engine_restarted), then stops the engine, and
exits 0. Runs the real engine on the tiny model of every family.

Also the gateway's start-up re-execution (src/serve/malloc_tune.h): the gateway runs with glibc's
per-thread malloc cache off, its engine child with the environment the user gave."""
import json
import os
import signal
import subprocess
import urllib.request

import pytest

from conftest import CAIRN
from test_http_robustness import free_port, open_stream, servers, stream_lines, wait_until  # noqa: F401


def test_sigint_to_the_group_drains_in_flight_replies(family_model, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    p = subprocess.Popen([CAIRN, "serve", "-m", family_model.model, "--port", str(port), "--slots", "1",
                          "--ctx", "1024", "--max-tokens", "1000"], stdout=log, stderr=log, start_new_session=True)
    try:
        def healthy():
            assert p.poll() is None, open(tmp_path / "serve.log").read()
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health").status == 200
            except OSError:
                return False
        wait_until(healthy, timeout=60, what="server start")
        group = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True).stdout.split()
        assert len(group) >= 2, "the engine runs in the gateway's process group (as under a terminal)"
        body = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 1000, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        sock, r = open_stream(port, "/v1/chat/completions", body)
        lines = stream_lines(r)
        next(lines)
        os.killpg(p.pid, signal.SIGINT)            # what Ctrl-C in the terminal does
        rest = list(lines)
        sock.close()
        events = [json.loads(x[6:]) for x in rest if x.startswith("data: {")]
        assert rest[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in rest, rest[-5:]
        assert not [e for e in events if "error" in e], [e for e in events if "error" in e]
        finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert finish and finish[-1] in ("length", "stop", "tool_calls"), finish
        usage = events[-1]["usage"]
        assert usage["completion_tokens"] > 0
        assert p.wait(60) == 0
        text = open(tmp_path / "serve.log").read()
        assert "SIGINT: finishing requests in flight" in text and "died from signal" not in text, text[-3000:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()


def environ_of(pid):
    """The block of environment strings a process was exec'd with, as /proc shows it. glibc cuts
    GLIBC_TUNABLES there into one string per tunable while it reads them, so the gateway's are
    looked for as strings, not as one variable's value."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        return [kv.decode() for kv in f.read().split(b"\0") if kv]


def variables(env):
    return dict(kv.split("=", 1) for kv in env if "=" in kv)


@pytest.mark.parametrize("user", [None, "glibc.malloc.perturb=0"])
def test_gateway_runs_without_the_thread_cache_and_the_engine_as_started(servers, tiny_dsv4, user, monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    s = servers(tiny_dsv4, env={"GLIBC_TUNABLES": user} if user else None)
    gateway, engine = environ_of(s.p.pid), variables(environ_of(s.engine_pid()))
    tunables = [kv.removeprefix("GLIBC_TUNABLES=") for kv in gateway if kv.startswith(("GLIBC_TUNABLES=", "glibc."))]
    assert tunables == ([user] if user else []) + ["glibc.malloc.tcache_count=0"], gateway
    assert engine.get("GLIBC_TUNABLES") == user, engine
    assert not [k for k in engine if k.startswith("CAIRN_SERVE_")], engine
    assert s.json("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 4, "temperature": 0})[0] == 200


def test_a_thread_cache_the_user_set_is_left_alone(servers, tiny_dsv4):
    s = servers(tiny_dsv4, env={"GLIBC_TUNABLES": "glibc.malloc.tcache_count=3"})
    gateway, engine = variables(environ_of(s.p.pid)), variables(environ_of(s.engine_pid()))
    assert gateway["GLIBC_TUNABLES"] == engine["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=3"
    assert not [k for k in gateway if k.startswith("CAIRN_SERVE_")], gateway
