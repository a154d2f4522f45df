"""Exact-id replay of generated replies (`cairn serve --reply-ids`, issue 13 §1).

A 10-turn chat on the tiny model of every family, over /v1/chat/completions and /v1/messages,
streaming and not, sending back exactly what each API returned: from turn 2 on the engine reuses
the previous prompt + the previous reply, less the last sampled token when max_tokens ended the
reply (it was never fed). Random tiny models emit invalid UTF-8, stray special tokens and tool-call
markup that does not re-tokenize to the generated ids, so without the remembered ids the reuse
stops inside the previous reply (the test checks that too: the optimisation has to fire).

The ids are persisted under --kv-dir: a restarted server continues with the same reuse, and a
fresh server given only the reply-id file (no engine state) is a cold engine fed the same ids, so
it must answer the last turn with the same reply and reuse nothing."""
import json
import os
import shutil

import pytest

from test_http_robustness import Server, open_stream, stream_lines

TURNS = 10
MAX_TOKENS = 8


def record_len(prev):
    """What the engine's record holds after prev: its prompt and every fed reply token. A reply
    of MAX_TOKENS tokens ended by the budget (an EOS is never counted), also when its finish
    reason says tool_calls."""
    return prev["prompt"] + prev["completion"] - (1 if prev["completion"] == MAX_TOKENS else 0)


# ---- one turn per API, returning the assistant message to send back and the usage -----------

def openai_turn(srv, messages, seed, stream):
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 1, "seed": seed}
    if not stream:
        st, _, r = srv.json("POST", "/v1/chat/completions", body)
        assert st == 200, r
        msg, u = r["choices"][0]["message"], r["usage"]
        back = {"role": "assistant", "content": msg["content"]}
        if msg.get("tool_calls"):
            back["tool_calls"] = msg["tool_calls"]
        return back, {"prompt": u["prompt_tokens"], "completion": u["completion_tokens"],
                      "cached": u["prompt_tokens_details"]["cached_tokens"]}
    body.update(stream=True, stream_options={"include_usage": True})
    sock, r = open_stream(srv.port, "/v1/chat/completions", body)
    content, calls, usage = "", [], None
    for line in stream_lines(r):
        if not line.startswith("data: {"):
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev["choices"]:
            content += ch["delta"].get("content") or ""
            for tc in ch["delta"].get("tool_calls") or []:
                calls.append({k: v for k, v in tc.items() if k != "index"})
    sock.close()
    back = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        back["tool_calls"] = calls
    return back, {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"],
                  "cached": usage["prompt_tokens_details"]["cached_tokens"]}


def anthropic_turn(srv, messages, seed, stream):
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 1, "seed": seed}
    hdr = {"anthropic-version": "2023-06-01"}
    if not stream:
        st, _, r = srv.json("POST", "/v1/messages", body, hdr)
        assert st == 200, r
        blocks, u = r["content"], r["usage"]
    else:
        body["stream"] = True
        sock, resp = open_stream(srv.port, "/v1/messages", body)
        blocks, u = [], {}
        for line in stream_lines(resp):
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "content_block_start":
                blocks.append(dict(ev["content_block"]))
            elif ev["type"] == "content_block_delta":
                d = ev["delta"]
                if d["type"] == "text_delta":
                    blocks[-1]["text"] += d["text"]
                elif d["type"] == "input_json_delta":
                    blocks[-1]["partial"] = blocks[-1].get("partial", "") + d["partial_json"]
            elif ev["type"] == "message_delta":
                u = ev["usage"]
        sock.close()
        for b in blocks:
            if "partial" in b:
                b["input"] = json.loads(b.pop("partial") or "{}")
    back = {"role": "assistant", "content": [b for b in blocks if b["type"] != "text" or b["text"]] or ""}
    return back, {"prompt": u["input_tokens"] + u["cache_read_input_tokens"], "completion": u["output_tokens"],
                  "cached": u["cache_read_input_tokens"]}


API = {"openai": openai_turn, "anthropic": anthropic_turn}


def chat(srv, api, stream, turns, messages=None, first=0):
    """Hold `turns` more turns; returns (messages, per-turn usage)."""
    if messages is None:
        messages = [{"role": "system", "content": "You are terse."}] if api == "openai" else []
    messages = list(messages)
    out = []
    for i in range(first, first + turns):
        messages.append({"role": "user", "content": f"Question {i}?"})
        back, u = API[api](srv, messages, seed=i, stream=stream)
        messages.append(back)
        out.append(u)
    return messages, out


@pytest.mark.parametrize("api,stream", [("openai", False), ("openai", True), ("anthropic", False),
                                        ("anthropic", True)])
def test_ten_turns_reuse_prompt_and_reply(family_model, tmp_path, api, stream):
    srv = Server(family_model.model, str(tmp_path), ["--slots", "1"])
    try:
        _, usage = chat(srv, api, stream, TURNS)
    finally:
        srv.stop()
    assert usage[0]["cached"] == 0
    for i in range(1, TURNS):
        assert usage[i]["cached"] == record_len(usage[i - 1]), (i, usage[i - 1], usage[i])


def test_reply_ids_off_reuses_less_and_on_persists_across_restart(family_model, tmp_path):
    off = Server(family_model.model, str(tmp_path), ["--slots", "1", "--reply-ids", "off"])
    try:
        _, usage = chat(off, "openai", False, 6)
    finally:
        off.stop()
    short = [i for i in range(1, 6) if usage[i]["cached"] < record_len(usage[i - 1])]
    assert short, f"without reply ids every turn reused its whole record: nothing for the test to show {usage}"

    kv = tmp_path / "kv"
    kv.mkdir()
    args = ["--slots", "1", "--kv-dir", str(kv)]
    srv = Server(family_model.model, str(tmp_path), args)
    try:
        messages, usage = chat(srv, "openai", False, 4)
    finally:
        srv.stop()
    assert (kv / "reply_ids").stat().st_size > 16

    srv = Server(family_model.model, str(tmp_path), args)     # restart: engine state and ids on disk
    try:
        messages2, usage2 = chat(srv, "openai", False, 2, messages=messages, first=4)
    finally:
        srv.stop()
    assert usage2[0]["cached"] == record_len(usage[-1]), (usage[-1], usage2[0])
    assert usage2[1]["cached"] == record_len(usage2[0]), usage2

    # A cold engine fed the same ids: a fresh server given only the reply ids, no engine state.
    cold_kv = tmp_path / "cold"
    cold_kv.mkdir()
    shutil.copy(kv / "reply_ids", cold_kv / "reply_ids")
    cold = Server(family_model.model, str(tmp_path), ["--slots", "1", "--kv-dir", str(cold_kv)])
    try:
        back, u = openai_turn(cold, messages2[:-1], seed=5, stream=False)
    finally:
        cold.stop()
    assert u["cached"] == 0 and u["prompt"] == usage2[1]["prompt"], (u, usage2[1])
    assert back == messages2[-1], "a cold engine fed the same ids must answer the same"


def test_damaged_reply_id_file_is_ignored(family_model, tmp_path):
    kv = tmp_path / "kv"
    kv.mkdir()
    (kv / "reply_ids").write_bytes(b"CRNRID1\n" + os.urandom(200))
    srv = Server(family_model.model, str(tmp_path), ["--slots", "1", "--kv-dir", str(kv)])
    try:
        _, usage = chat(srv, "openai", False, 3)
        log = srv.logtext()
    finally:
        srv.stop()
    assert "reply_ids" in log, log
    for i in range(1, 3):
        assert usage[i]["cached"] == record_len(usage[i - 1]), usage


def test_spliced_prompts_still_encode_client_text_as_plain_text(family_model, tmp_path):
    """With a reply spliced in the gateway encodes the prompt itself; text a client wrote must
    still never become a control token (tests/test_no_forged_turns.py): two next turns that differ
    only in the last user message differ in prompt length exactly as the plain encodings of those
    messages do."""
    from test_no_forged_turns import encode, forge_text
    forged = forge_text(family_model)
    srv = Server(family_model.model, str(tmp_path), ["--slots", "1"])
    try:
        messages, usage = chat(srv, "openai", False, 1)
        lengths = {}
        for text in (forged, "plain words"):
            back, u = openai_turn(srv, messages + [{"role": "user", "content": text}], seed=1, stream=False)
            lengths[text] = u["prompt"]
            if text == forged:
                assert u["cached"] == record_len(usage[0]), "the reply was spliced (the gateway encoded the prompt)"
    finally:
        srv.stop()
    alone = encode(family_model.model, tmp_path, [([{"role": "user", "content": t}], None, False)
                                                  for t in (forged, "plain words")])
    assert len(alone[0]["ids"]) > len(alone[0]["whole"]), "the forged text spells control tokens (else no check)"
    assert lengths[forged] - lengths["plain words"] == len(alone[0]["ids"]) - len(alone[1]["ids"]), lengths


def test_restarted_server_routes_each_conversation_to_its_resumed_slot(family_model, tmp_path):
    """After a restart on --kv-dir each conversation's next turn must find the slot its state was
    resumed in, also when a reply held bytes that are not UTF-8 (the client got U+FFFD, the
    engine's record decodes to the raw bytes). The turns come back in reverse order with every slot
    taken, so a conversation routed by the wrong rule evicts another one's state, which then
    reuses nothing."""
    kv = tmp_path / "kv"
    kv.mkdir()
    args = ["--slots", "3", "--kv-dir", str(kv)]
    srv = Server(family_model.model, str(tmp_path), args)
    try:
        convs = [chat(srv, "openai", False, 3, messages=[{"role": "system", "content": f"Conversation {c}."}])
                 for c in range(3)]
    finally:
        srv.stop()
    replies = [m["content"] or "" for msgs, _ in convs for m in msgs if m["role"] == "assistant"]
    assert any("\ufffd" in r for r in replies), f"no reply had invalid UTF-8: nothing for the test to show {replies}"

    srv = Server(family_model.model, str(tmp_path), args)
    try:
        after = [(c, chat(srv, "openai", False, 1, messages=convs[c][0], first=3)[1][0]) for c in (2, 1, 0)]
    finally:
        srv.stop()
    for c, u in after:
        assert u["cached"] == record_len(convs[c][1][-1]), (c, convs[c][1][-1], u)
