"""What llama.cpp-server and Ollama users look for (issue 13 §5): /tokenize and /detokenize give
the engine's ids, /props says model, context, slots and capabilities, --alias names are accepted
and listed, the start-up banner shows context, slots and numerics, and no added token's text
reaches a chat reply's content."""
import json

import pytest

from test_http_robustness import Server, wait_until


@pytest.fixture
def srv(family_model, tmp_path):
    s = Server(family_model.model, str(tmp_path), ["--slots", "2", "--alias", "my-model", "--alias", "other"])
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
    cfg = json.load(open(f"{family_model.model}/config.json"))
    assert props["n_ctx"] == cfg["max_position_embeddings"] and props["total_slots"] == 2, props
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
