"""Ctrl-C and systemd stops (issue 13 §6): SIGINT sent to the whole process group, as a terminal
does, must not kill the engine child with the gateway. The gateway drains the replies in flight
(they end with a finish reason and [DONE], not engine_restarted), then stops the engine, and
exits 0. Runs the real engine on the tiny model of every family."""
import json
import os
import signal
import subprocess
import urllib.request

from conftest import CAIRN
from test_http_robustness import free_port, open_stream, stream_lines, wait_until


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
