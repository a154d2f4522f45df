"""What llama.cpp-server and Ollama users look for (issue 13 §5): /tokenize and /detokenize give
the engine's ids, /props says model, context, slots and capabilities, --alias names are accepted
and listed, the start-up banner shows the load progress, context, slots and numerics, and no added token's text
reaches a chat reply's content."""
import json
import re

import pytest

from test_http_robustness import Server, wait_until


@pytest.fixture
def srv(family_model, tmp_path):
    s = Server(family_model.model, str(tmp_path), ["--slots", "2", "--alias", "my-model", "--alias", "other"],
               env={"CAIRN_PROGRESS": "1"})   # the load progress bar, as on a terminal
    yield s
    s.stop()


def test_tokenize_detokenize_props_aliases_banner(srv, family_model):
    marker = family_model.desc["turns"]["user"]
    text = f"Hello{marker} world"
    st, _, r = srv.json("POST", "/tokenize", {"content": text})
    assert st == 200, r
    assert family_model.user in r["tokens"], "parse_special (the default) matches added tokens, as a raw prompt"
    st, _, plain = srv.json("POST", "/tokenize", {"content": text, "parse_special": False})
    assert family_model.user not in plain["tokens"] and len(plain["tokens"]) > len(r["tokens"])
    st, _, d = srv.json("POST", "/detokenize", {"tokens": r["tokens"]})
    assert st == 200 and d["content"] == text
    st, _, p = srv.json("POST", "/tokenize", {"content": "ab", "with_pieces": True})
    assert "".join(x["piece"] for x in p["tokens"]) == "ab" and all(isinstance(x["id"], int) for x in p["tokens"])
    for bad in [{"content": "x", "add_special": True}, {"content": "x", "frobnicate": 1}, {"tokens": [-1]},
                {"tokens": "1 2"}]:
        path = "/detokenize" if "tokens" in bad else "/tokenize"
        st, _, e = srv.json("POST", path, bad)
        assert st == 400 and e["error"]["message"], (bad, e)

    st, _, props = srv.json("GET", "/props")
    assert st == 200
    assert props["n_ctx"] > 0 and props["total_slots"] == 2, props
    assert props["model_alias"] == ["my-model", "other"] and props["capabilities"]["chat"] is True
    assert props["numerics"] in ("qat", "exact")

    st, _, models = srv.json("GET", "/v1/models")
    assert [m["id"] for m in models["data"]] == [props["model"], "my-model", "other"]
    st, _, one = srv.json("GET", "/v1/models/other")
    assert st == 200 and one["id"] == "other"
    st, _, r = srv.json("POST", "/v1/chat/completions", {"model": "my-model", "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "hi"}]})
    assert st == 200, r
    st, _, r = srv.json("POST", "/v1/chat/completions", {"model": "nope", "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "hi"}]})
    assert st == 404

    wait_until(lambda: "context   " in srv.logtext(), what="the banner")
    log = srv.logtext()
    assert f"context   {props['n_ctx']} tokens per slot, 2 slots" in log and "numerics  " in log, log
    bar = re.search(r"loading (\d+)/(\d+) shards \[=+\]\n", log)
    assert bar and bar.group(1) == bar.group(2) and bar.start() < log.index("ready at"), log


def test_no_added_token_text_in_chat_content(srv, family_model):
    """Random tiny models emit added tokens all the time; over many replies none may show."""
    added = [a["content"] for a in json.load(open(f"{family_model.model}/tokenizer.json"))["added_tokens"]]
    raw_seen = 0
    for seed in range(12):
        body = {"messages": [{"role": "user", "content": f"Say {seed}"}], "max_tokens": 24, "temperature": 1,
                "seed": seed}
        st, _, r = srv.json("POST", "/v1/chat/completions", body)
        assert st == 200
        content = r["choices"][0]["message"]["content"] or ""
        assert not [a for a in added if a in content], content
        st, _, c = srv.json("POST", "/v1/completions", {"prompt": f"Say {seed}", "max_tokens": 24, "temperature": 1,
                                                         "seed": seed})
        raw_seen += any(a in c["choices"][0]["text"] for a in added)
    assert raw_seen, "no raw completion held an added token either: the test shows nothing"


def test_run_never_writes_control_bytes_to_a_terminal(cairn, family_model):
    """`cairn run -p` on a terminal shows control characters as pictures; piped, it stays exact."""
    import os
    import pty
    import subprocess

    def piped(seed):
        return subprocess.run([cairn, "run", "-m", family_model.model, "-p", "Hello", "-n", "64", "--seed", str(seed)],
                              capture_output=True).stdout

    def controls(b):
        return [c for c in b if (c < 0x20 and c not in (9, 10, 13)) or c == 0x7f]
    seed = next((s for s in range(40) if controls(piped(s))), None)
    assert seed is not None, "no seed made the random model write a control byte: nothing to show"
    master, slave = pty.openpty()
    p = subprocess.Popen([cairn, "run", "-m", family_model.model, "-p", "Hello", "-n", "64", "--seed", str(seed)],
                         stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait()
    os.close(master)
    assert out and not controls(out), out


def test_slots_save_restore_erase(family_model, tmp_path):
    """llama.cpp's slot files: a conversation saved from slot 0 and restored into slot 1 goes on
    there reusing all of it; erase empties a slot; bad names and actions are 400s."""
    kv = tmp_path / "kv"
    kv.mkdir()
    srv = Server(family_model.model, str(tmp_path), ["--slots", "2", "--kv-dir", str(kv)])
    try:
        msgs = [{"role": "user", "content": "hello"}]
        st, _, r = srv.json("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                                             "cache_slot": 0})
        record = r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - (r["usage"]["completion_tokens"] == 4)
        msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "again"}]
        st, _, listing = srv.json("GET", "/slots")
        assert st == 200 and [s["id"] for s in listing] == [0, 1] and listing[0]["record_bytes"] > 0
        st, _, saved = srv.json("POST", "/slots/0?action=save", {"filename": "conv-1"})
        assert st == 200 and saved["n_saved"] == record, saved
        st, _, erased = srv.json("POST", "/slots/0?action=erase")
        assert st == 200 and erased["n_erased"] == record
        st, _, restored = srv.json("POST", "/slots/1?action=restore", {"filename": "conv-1"})
        assert st == 200 and restored["n_restored"] == record
        st, _, r2 = srv.json("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                                              "cache_slot": 1})
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == record, r2["usage"]
        for path, body, param in [("/slots/1?action=save", {"filename": "../x"}, "filename"),
                                  ("/slots/1?action=restore", {"filename": "nope"}, "filename"),
                                  ("/slots/1?action=fly", {"filename": "a"}, "action"),
                                  ("/slots/1?action=save", {}, "filename")]:
            st, _, e = srv.json("POST", path, body)
            assert st == 400 and e["error"]["param"] == param, (path, e)
        st, _, e = srv.json("POST", "/slots/7?action=erase")
        assert st == 404
    finally:
        srv.stop()
