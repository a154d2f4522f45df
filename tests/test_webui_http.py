"""The chat page at / over plain HTTP (the browser tests are tests/node/webui.test.mjs): every
embedded file is served byte for byte with its type and the page's security headers, before the
API key but after the Host guard; CORS as for the API; --no-webui turns it off. And what the page
reads from the server: the engine's prefill time in /metrics and in the OpenAI `timings`."""
import json
import os

from conftest import ROOT
from test_http_robustness import assert_cors, assert_openai_error, chat_body, servers  # noqa: F401 (fixture)

FILES = {
    "/": ("webui/index.html", "text/html"),
    "/index.html": ("webui/index.html", "text/html"),
    "/app.js": ("webui/app.js", "text/javascript"),
    "/style.css": ("webui/style.css", "text/css"),
    "/vendor/marked.esm.js": ("webui/node_modules/marked/lib/marked.esm.js", "text/javascript"),
    "/vendor/purify.es.mjs": ("webui/node_modules/dompurify/dist/purify.es.mjs", "text/javascript"),
}


def read(rel):
    with open(os.path.join(ROOT, rel), "rb") as f:
        return f.read()


def test_every_file_is_served_with_its_type_and_security_headers(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--api-key", "sekrit"], fake=True)   # the page itself needs no key
    for path, (rel, ctype) in FILES.items():
        st, h, body = s.request("GET", path)
        assert st == 200, (path, st, body[:200])
        assert body == read(rel), f"{path} differs from {rel}"
        assert h["Content-Type"].startswith(ctype), (path, h)
        csp = h["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, csp
        assert h["X-Content-Type-Options"] == "nosniff" and h["X-Frame-Options"] == "DENY", h
    st, h, body = s.request("HEAD", "/")
    assert st == 200 and body == b"" and h["Content-Type"].startswith("text/html"), (st, h)
    # Only the page's own files, and only GET/HEAD: the rest is still the API, key and all.
    st, _, b = s.json("GET", "/app.js.map")
    assert_openai_error(b, 401, st)
    st, _, b = s.json("GET", "/app.js.map", headers={"Authorization": "Bearer sekrit"})
    assert_openai_error(b, 404, st)
    st, _, b = s.json("POST", "/", {"x": 1}, {"Authorization": "Bearer sekrit"})
    assert_openai_error(b, 404, st)
    assert s.request("GET", "/metrics")[0] == 401


def test_host_guard_and_cors_apply_to_the_page(servers, tiny_dsv4):
    s = servers(tiny_dsv4, fake=True)
    st, _, b = s.json("GET", "/", headers={"Host": "evil.example"})
    assert_openai_error(b, 403, st)
    st, h, body = s.request("GET", "/", headers={"Host": f"localhost:{s.port}"})
    assert st == 200 and body == read("webui/index.html")
    st, h, _ = s.request("GET", "/app.js", headers={"Origin": "http://localhost:5173"})
    assert st == 200
    assert_cors(h, "http://localhost:5173")
    st, h, _ = s.request("GET", "/app.js", headers={"Origin": "http://evil.example"})
    assert st == 200 and "Access-Control-Allow-Origin" not in h and "Origin" in h.get("Vary", ""), h


def test_the_page_may_call_the_api_from_its_own_origin(servers, tiny_dsv4):
    """Browsers send Origin on a same-origin POST: the page's own origin is not "another site"."""
    s = servers(tiny_dsv4, fake=True)
    own = {"Origin": f"http://127.0.0.1:{s.port}", "Host": f"127.0.0.1:{s.port}"}
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), own)
    assert st == 200, b
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {**own, "Host": f"localhost:{s.port}"})
    assert_openai_error(b, 403, st)
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), {**own, "Origin": "http://evil.example"})
    assert_openai_error(b, 403, st)
    # An open non-loopback bind has no Host guard: a rebound name would match its own Host.
    s = servers(tiny_dsv4, ["--host", "0.0.0.0", "--allow-insecure-bind"], fake=True)
    rebound = {"Origin": f"http://evil.example:{s.port}", "Host": f"evil.example:{s.port}"}
    st, _, b = s.json("POST", "/v1/chat/completions", chat_body("x"), rebound)
    assert_openai_error(b, 403, st)


def test_no_webui_turns_the_page_off(servers, tiny_dsv4):
    s = servers(tiny_dsv4, ["--no-webui"], fake=True)
    for path in FILES:
        st, _, b = s.json("GET", path)
        assert_openai_error(b, 404, st)
    assert s.request("GET", "/health")[0] == 200


def test_prefill_time_reaches_metrics_and_timings(servers, family_model):
    """The page's cold-prefill estimate is built from these: the engine's own prefill clock."""
    s = servers(family_model.model, ["--slots", "1"])
    convo = [{"role": "user", "content": "A question about cairns, stones piled on a hill " * 4}]
    st, _, a = s.json("POST", "/v1/chat/completions", {"messages": convo, "max_tokens": 4, "temperature": 0})
    assert st == 200, a
    t = a["timings"]
    assert t["cache_n"] == 0 and t["prompt_n"] == a["usage"]["prompt_tokens"], a
    assert t["prompt_ms"] > 0 and t["prompt_per_second"] > 0 and t["predicted_n"] == a["usage"]["completion_tokens"], a
    assert t["predicted_per_second"] > 0, a
    convo += [a["choices"][0]["message"], {"role": "user", "content": "and more"}]
    c = s.conn()
    c.request("POST", "/v1/chat/completions",
              json.dumps({"messages": convo, "max_tokens": 4, "temperature": 0, "stream": True,
                          "stream_options": {"include_usage": True}}).encode(), {"Content-Type": "application/json"})
    chunks = [json.loads(line[6:]) for line in c.getresponse().read().decode().splitlines()
              if line.startswith("data: {")]
    c.close()
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, last
    assert last["timings"]["cache_n"] == last["usage"]["prompt_tokens_details"]["cached_tokens"], last
    assert all("timings" not in ch for ch in chunks[:-1]), "timings come with the usage chunk only"
    st, _, text = s.request("GET", "/metrics")
    m = dict(line.rsplit(" ", 1) for line in text.decode().splitlines() if line and not line.startswith("#"))
    assert float(m["cairn_prefill_seconds_total"]) > 0, m
    prefilled = float(m["cairn_prompt_tokens_prefilled_total"])
    assert prefilled == a["usage"]["prompt_tokens"] + last["timings"]["prompt_n"], m
