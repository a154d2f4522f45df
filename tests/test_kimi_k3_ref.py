"""Kimi K3 forward pass (src/models/kimi_k3*.c) against the independent float64 reference
tools/ref/kimi_k3.py on the tiny checkpoint (release layout: kimi_k3 root config with a kimi_linear
text_config, `language_model.` names, MXFP4 routed experts): exact numerics agree on every prompt
position, on prompts past a pass (K3_CHUNK, 128 tokens) too; the reference's two KDA paths (token by token and HF's
chunked UT form) agree with each other; the KDA recurrence, the short convs, the attention-residual
blocks and the gate lower bound all shape the output (the reference with each one changed differs,
and cairn follows the real one); default numerics round to BF16; any split of a prompt into forward
calls gives the same bits; names without the prefix and a sharded index load the same model; a
broken tensor or config is refused by name."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, assert_agrees, echo

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import kimi_k3 as ref  # noqa: E402
import st  # noqa: E402

BASE = 960  # tiny vocab: K3 specials from BASE ([BOS], [EOS], <|end_of_msg|> = +2, <|open|> = +3, ...)
PROMPTS = {
    "short": [BASE, 72, 105, 3, 500],
    "chat": [BASE + 3, 300, 301, BASE + 5, 40, 41, 42, BASE + 4, 300, BASE + 5, BASE + 2, BASE + 3, 17],
    "long": [BASE] + [(37 * i + 11) % 950 for i in range(150)],
}


@pytest.fixture(scope="module")
def reference(tiny_kimi_k3):
    return ref.load(tiny_kimi_k3)


def ref_logprobs(cfg, w, ids, path="recurrent"):
    return ref.log_softmax(ref.forward(cfg, w, ids, path))


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_exact_matches_reference(cairn, tiny_kimi_k3, reference, name):
    got, _ = echo(cairn, tiny_kimi_k3, PROMPTS[name])
    assert_agrees(got, ref_logprobs(*reference, PROMPTS[name]))


def test_reference_kda_paths_agree(reference):
    """The token-by-token recurrence and the chunked form (chunks of 16 and 64, so both a partial
    last chunk and several full chunks) give the same logits."""
    cfg, w = reference
    ids = PROMPTS["long"]
    a = ref.forward(cfg, w, ids, "recurrent")
    for chunk in (16, 64):
        assert np.abs(a - ref.forward(cfg, w, ids, "chunked", chunk)).max() < 1e-9


def test_outputs_are_peaked(reference):
    """Agreement tests mean something only if the model is far from uniform."""
    lp = ref_logprobs(*reference, PROMPTS["long"])
    assert np.exp(lp.max(-1)).mean() > 0.2


def zero_conv_history(cfg, w, monkeypatch):
    for k in list(w):
        if k.endswith("_conv1d.weight"):
            w[k] = w[k].copy()
            w[k][..., :-1] = 0


def no_lower_bound(cfg, w, monkeypatch):
    cfg["linear_attn_config"]["gate_lower_bound"] = None


def one_block(cfg, w, monkeypatch):
    cfg["attn_res_block_size"] = 100


def kda_without_memory(cfg, w, monkeypatch):
    """Each token's KDA read sees only its own write."""
    orig = ref.kda_recurrent

    def amnesic(q, k, v, g, beta):
        return np.concatenate([orig(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1]) for t in range(len(q))])
    monkeypatch.setattr(ref, "kda_recurrent", amnesic)


@pytest.mark.parametrize("change", [zero_conv_history, no_lower_bound, one_block, kda_without_memory])
def test_each_mechanism_shapes_the_output(cairn, tiny_kimi_k3, reference, change, monkeypatch):
    """The reference with the mechanism changed differs by more than the agreement tolerance, and
    cairn follows the real one."""
    cfg, w = reference
    ids = PROMPTS["long"]
    vcfg, vw = json.loads(json.dumps(cfg)), dict(w)
    change(vcfg, vw, monkeypatch)
    changed = ref_logprobs(vcfg, vw, ids)
    monkeypatch.undo()
    real = ref_logprobs(cfg, w, ids)
    assert np.abs(changed - real)[8:].max() > 0.05, "the mechanism does not matter on this model"
    got, _ = echo(cairn, tiny_kimi_k3, ids)
    assert_agrees(got, real)


def test_default_numerics_round_to_bf16(cairn, tiny_kimi_k3, reference):
    """Default numerics hold activations in BF16: close to the f32 reference, but not equal. Judged
    on the top token of a short prompt: the random tiny model is sensitive (a KDA head whose q.k
    is near zero flips the sign of its o_norm output), so its reference moves by ~0.1 nats at the
    first positions, and far more later, when the embedding is perturbed by 2^-9; low-probability
    tokens move more."""
    ids = PROMPTS["short"]
    exact, _ = echo(cairn, tiny_kimi_k3, ids, "exact")
    qat, _ = echo(cairn, tiny_kimi_k3, ids, "qat")
    lp = ref_logprobs(*reference, ids)
    top = [abs(row[0][1] - lp[p][row[0][0]]) for p, row in enumerate(qat)]
    assert max(top) > 1e-4, "qat numerics identical to f32: BF16 rounding did not happen"
    assert max(top) < 0.3 and np.median(top) < 0.05, f"BF16 activations drifted too far: {top}"
    assert exact != qat
    for p, row in enumerate(qat):          # no flip where the reference is not near a tie
        first, second = np.sort(lp[p])[-1], np.sort(lp[p])[-2]
        if first - second > 0.5:
            assert row[0][0] == ref.top_indices(lp[p], 1)[0], f"pos {p}"


@pytest.mark.parametrize("numerics", ["exact", "qat"])
def test_prompt_split_is_bit_exact(cairn, tiny_kimi_k3, numerics):
    """Any split of the prompt into forward calls (the KDA recurrence and convs carried across
    calls in the state) gives the same bits as one call."""
    ids = PROMPTS["long"]
    _, whole = echo(cairn, tiny_kimi_k3, ids, numerics)
    for chunks in ("1", "7,1,30", "64", "128"):
        _, split = echo(cairn, tiny_kimi_k3, ids, numerics, ["--prefill-chunks", chunks])
        assert split == whole, f"--prefill-chunks {chunks} changed the output"


def test_unprefixed_and_sharded_checkpoints_load_the_same_model(cairn, tiny_kimi_k3, tmp_path):
    """Tensor names without `language_model.` (a flat text checkpoint) and the same tensors split
    over shards with an index give the same logits."""
    tensors = st.read_file(os.path.join(tiny_kimi_k3, "model.safetensors"))
    plain = {k[len("language_model."):]: v for k, v in tensors.items()}
    flat, sharded = tmp_path / "flat", tmp_path / "sharded"
    for d in (flat, sharded):
        d.mkdir()
        for f in ("config.json", "tokenizer.json"):
            shutil.copy(os.path.join(tiny_kimi_k3, f), d / f)
    st.write_file(str(flat / "model.safetensors"), plain)
    st.write_sharded(str(sharded), tensors, shard_bytes=200_000)
    assert len([f for f in os.listdir(sharded) if f.endswith(".safetensors")]) > 2
    _, want = echo(cairn, tiny_kimi_k3, PROMPTS["chat"])
    for d in (flat, sharded):
        _, got = echo(cairn, str(d), PROMPTS["chat"])
        assert got == want


def copy_with(src, dst, tensors=None, text_change=None):
    """A copy of the checkpoint with other tensors and/or text_config keys (dotted; None deletes)."""
    os.makedirs(dst, exist_ok=True)
    if tensors is None:
        shutil.copy(os.path.join(src, "model.safetensors"), os.path.join(dst, "model.safetensors"))
    else:
        st.write_file(os.path.join(dst, "model.safetensors"), tensors)
    cfg = json.load(open(os.path.join(src, "config.json")))
    for dotted, v in (text_change or {}).items():
        *path, key = dotted.split(".")
        node = cfg["text_config"]
        for part in path:
            node = node[part]
        if v is None:
            node.pop(key, None)
        else:
            node[key] = v
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    shutil.copy(os.path.join(src, "tokenizer.json"), os.path.join(dst, "tokenizer.json"))


@pytest.mark.parametrize("name", ["language_model.model.layers.1.self_attn.f_b_proj.weight",
                                  "language_model.model.layers.3.self_attn.kv_b_proj.weight",
                                  "language_model.model.layers.2.block_sparse_moe.experts.5.w2.weight_scale",
                                  "language_model.model.layers.0.self_attn.q_conv1d.weight"])
def test_broken_tensor_is_refused_by_name(cairn, tiny_kimi_k3, tmp_path, name):
    tensors = st.read_file(os.path.join(tiny_kimi_k3, "model.safetensors"))
    dt, shape, raw = tensors[name]
    tensors[name] = (dt, [shape[0] // 2] + shape[1:], raw[: len(raw) // 2])
    copy_with(tiny_kimi_k3, str(tmp_path), tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr, r.stderr


def test_missing_tensor_is_refused_by_name(cairn, tiny_kimi_k3, tmp_path):
    tensors = st.read_file(os.path.join(tiny_kimi_k3, "model.safetensors"))
    name = "language_model.model.layers.4.mlp_res_proj.weight"
    del tensors[name]
    copy_with(tiny_kimi_k3, str(tmp_path), tensors)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and f"missing tensor {name}" in r.stderr, r.stderr


@pytest.mark.parametrize("change, key", [({"num_expert_group": 8}, "num_expert_group"),
                                         ({"kv_lora_rank": None}, "kv_lora_rank"),
                                         ({"hidden_act": "silu"}, "hidden_act"),
                                         ({"mla_use_nope": False}, "mla_use_nope"),
                                         ({"routed_expert_hidden_size": 40}, "routed_expert_hidden_size"),
                                         ({"linear_attn_config.kda_layers": [1, 9]}, "kda_layers"),
                                         ({"num_hidden_layers": 10_000_000}, "num_hidden_layers")])
def test_bad_config_is_refused_by_key(cairn, tiny_kimi_k3, tmp_path, change, key):
    copy_with(tiny_kimi_k3, str(tmp_path), text_change=change)
    r = subprocess.run([cairn, "run", "-m", str(tmp_path), "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and key in r.stderr, r.stderr
