"""DeepSeek V4 exactness properties of the engine on the tiny model (window 8, CSA ratio 4 with
indexer top-2, HCA ratio 8), all through `cairn run`:

- chunking invariance: one prefill chunk, token by token, and splits at/around the window and
  compression boundaries (3|4, 7|8, 8|9) and misaligned ones give identical jsonl output
  (per-position echo logprobs + greedy generation) and byte-identical state dumps;
- snapshot -> serialize -> restore -> continue equals an uninterrupted run, at several cut points;
- a reset between two prompts on one sequence leaves nothing behind (equals fresh processes);
- the loader rejects a checkpoint with a missing, mis-shaped or out-of-range tensor, naming it.

Every comparison also checks that the compared things are not trivially equal (outputs are long
and varied, another prompt or another numerics mode gives different bytes).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import st  # noqa: E402
import tiny_deepseek_v4  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "ref"))
import deepseek_v4 as ref  # noqa: E402

# 26 ids: BOS + varied ids; the window (8) wraps three times, CSA emits 6 entries (indexer picks
# 2 of up to 6), HCA emits 3, and generation continues across further boundaries.
PROMPT = [0, 517, 33, 902, 64, 129, 257, 300, 811, 45, 999, 303, 12, 640, 77, 355, 208, 460, 731, 88, 19, 600,
          401, 275, 950, 123]
GEN = 6


def ids_arg(ids):
    return ",".join(map(str, ids))


def run(cairn, model, *args, ok=True):
    p = subprocess.run([cairn, "run", "-m", model, *map(str, args)], capture_output=True, text=True)
    if ok:
        assert p.returncode == 0, f"cairn run {' '.join(map(str, args))} failed: {p.stderr[-2000:]}"
    return p


def traced(cairn, model, ids, *extra):
    """stdout of a greedy run printing every prompt position's top-3 and each generated token."""
    return run(cairn, model, "--prompt-ids", ids_arg(ids), "-n", GEN, "--temperature", 0, "--format", "jsonl",
               "--top-logprobs", 3, "--echo-logprobs", 3, *extra).stdout


@pytest.fixture(scope="module")
def baseline(cairn, tiny_dsv4, tmp_path_factory):
    dump = tmp_path_factory.mktemp("dsv4") / "one_chunk.state"
    out = traced(cairn, tiny_dsv4, PROMPT, "--dump-state", dump)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["pos"] for r in rows[: len(PROMPT)]] == list(range(len(PROMPT)))
    assert len(rows) == len(PROMPT) + GEN
    assert len({r["top"][0]["id"] for r in rows}) > len(rows) // 2, "degenerate model output"
    return out, dump.read_bytes()


SPLITS = {
    "token_by_token": [1] * (len(PROMPT) - 1),
    "at_3_4": [3, 1],
    "at_7_8": [7, 1],
    "at_8_9": [8, 1],
    "ratio_multiples": [4, 4, 8],
    "misaligned": [5, 6, 2, 9],
    "odd_singles": [2, 1, 1, 3, 1, 7, 1],
    "last_token_alone": [len(PROMPT) - 1],
}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_prefill_split_is_bit_identical(cairn, tiny_dsv4, tmp_path, baseline, name):
    dump = tmp_path / "split.state"
    chunks = ids_arg(SPLITS[name])
    out = traced(cairn, tiny_dsv4, PROMPT, "--prefill-chunks", chunks, "--dump-state", dump)
    assert out == baseline[0]
    assert dump.read_bytes() == baseline[1], "state after prefill differs from the one-chunk prefill"


def test_long_prompt_across_internal_passes(cairn, tiny_dsv4, tmp_path):
    """300 tokens: the family cuts a forward call into passes of DSV4_CHUNK = 256 tokens and the
    run into chunks; one call, token by token and a split straddling 256 must still agree bit for
    bit."""
    ids = [0] + [(97 * i + 11) % 1021 + 2 for i in range(1, 300)]
    dumps = [tmp_path / f"{i}.state" for i in range(3)]
    outs = [traced(cairn, tiny_dsv4, ids, "--dump-state", dumps[0], "--prefill-chunks", "300"),
            traced(cairn, tiny_dsv4, ids, "--dump-state", dumps[1], "--prefill-chunks", ids_arg([1] * 299)),
            traced(cairn, tiny_dsv4, ids, "--dump-state", dumps[2], "--prefill-chunks", "255,3,20")]
    assert outs[1] == outs[0] and outs[2] == outs[0]
    assert dumps[1].read_bytes() == dumps[0].read_bytes() == dumps[2].read_bytes()


def test_state_dump_depends_on_the_prompt(cairn, tiny_dsv4, tmp_path, baseline):
    """The byte comparison above means something: a one-token-different prompt changes the state."""
    dump = tmp_path / "other.state"
    other = PROMPT[:-1] + [PROMPT[-1] + 1]
    traced(cairn, tiny_dsv4, other, "--dump-state", dump)
    assert dump.read_bytes() != baseline[1]


# Cut points: the first token, mid-window, right after the first HCA emission (t=7) and a CSA
# emission (t=11), one past it, mid-partial, and the whole prompt.
@pytest.mark.parametrize("k", [1, 5, 8, 12, 13, 18, len(PROMPT)])
def test_snapshot_restore_continue_is_bit_identical(cairn, tiny_dsv4, baseline, k):
    assert traced(cairn, tiny_dsv4, PROMPT, "--snapshot-at", k) == baseline[0]


def test_snapshot_with_chunked_prefill(cairn, tiny_dsv4, baseline):
    assert traced(cairn, tiny_dsv4, PROMPT, "--prefill-chunks", "3,6", "--snapshot-at", 11) == baseline[0]


def test_reset_between_prompts_leaves_no_stale_state(cairn, tiny_dsv4):
    """Two prompts on one sequence (reset in between) equal two fresh processes, in both numerics.
    The second prompt is shorter than the first, so stale compressor rows or list entries of the
    first would be visible to it if the reset missed them."""
    second = [0, 700, 701, 702, 703, 704, 705, 706, 707, 708, 709, 710, 711, 712]
    for numerics in ("qat", "exact"):
        fresh = [traced(cairn, tiny_dsv4, ids, "--numerics", numerics) for ids in (PROMPT, second)]
        assert fresh[0] != fresh[1]
        both = run(cairn, tiny_dsv4, "--prompt-ids", ids_arg(PROMPT) + ";" + ids_arg(second), "-n", GEN,
                   "--temperature", 0, "--format", "jsonl", "--top-logprobs", 3, "--echo-logprobs", 3,
                   "--numerics", numerics).stdout
        assert both == fresh[0] + fresh[1]


def test_thread_count_does_not_change_bits(cairn, tiny_dsv4, baseline):
    assert traced(cairn, tiny_dsv4, PROMPT, "--threads", 1) == baseline[0]


def test_portable_build_is_invariant_too(tiny_dsv4):
    """The scalar-only build (make BUILD=build/portable SIMD=portable) keeps its own fixed order."""
    portable = os.path.join(ROOT, "build", "portable", "cairn")
    assert os.path.exists(portable), f"{portable} not built (make test builds it)"
    one = traced(portable, tiny_dsv4, PROMPT)
    assert traced(portable, tiny_dsv4, PROMPT, "--prefill-chunks", ids_arg(SPLITS["token_by_token"])) == one
    assert traced(portable, tiny_dsv4, PROMPT, "--prefill-chunks", "7,1", "--snapshot-at", 12) == one


def test_numerics_modes_differ(cairn, tiny_dsv4, baseline):
    """--numerics exact really switches off the BF16 rounding and QDQ (else it would be a no-op)."""
    assert traced(cairn, tiny_dsv4, PROMPT, "--numerics", "exact") != baseline[0]


# ---- loader rejection ------------------------------------------------------------------------

def shard_of(model, name):
    with open(os.path.join(model, "model.safetensors.index.json")) as f:
        return json.load(f)["weight_map"][name]


def rewrite(model, dst, name, replace):
    """Copy model to dst, rewriting the shard holding `name`: replace(tensors) edits the dict;
    the index follows (a removed tensor leaves the weight_map too)."""
    shutil.copytree(model, dst)
    shard = os.path.join(dst, shard_of(model, name))
    tensors = st.read_file(shard)
    replace(tensors)
    st.write_file(shard, tensors)
    idx_path = os.path.join(dst, "model.safetensors.index.json")
    with open(idx_path) as f:
        idx = json.load(f)
    idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if k in tensors or v != shard_of(model, name)}
    with open(idx_path, "w") as f:
        json.dump(idx, f)
    return str(dst)


def rejected(cairn, model, name):
    p = run(cairn, model, "--validate-only", ok=False)
    assert p.returncode != 0, "a damaged checkpoint was accepted"
    assert name in p.stderr, f"error does not name {name}: {p.stderr}"
    p = run(cairn, model, "--prompt-ids", "0,1,2", "-n", 1, ok=False)
    assert p.returncode != 0 and name in p.stderr


def with_config(model, dst, edit):
    shutil.copytree(model, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    edit(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.mark.parametrize("edit,word", [
    (lambda c: c.pop("hc_mult"), "hc_mult"),
    (lambda c: c.pop("compress_rope_theta"), "compress_rope_theta"),
    (lambda c: c.update(compress_ratios=c["compress_ratios"][:4]), "compress_ratios"),
    (lambda c: c.update(num_attention_heads="two"), "num_attention_heads"),
    (lambda c: c.update(scoring_func="softmax"), "scoring_func"),
    (lambda c: c.update(hidden_size=256), "embed.weight"),
])
def test_bad_config_is_named(cairn, tiny_dsv4, tmp_path, edit, word):
    p = run(cairn, with_config(tiny_dsv4, tmp_path / "m", edit), "--validate-only", ok=False)
    assert p.returncode != 0 and word in p.stderr, p.stderr


def test_longer_compress_ratios_are_accepted(cairn, tiny_dsv4, tmp_path):
    """0731-style checkpoints list extra (draft-stage) ratios after layers + MTP."""
    model = with_config(tiny_dsv4, tmp_path / "m", lambda c: c.update(compress_ratios=c["compress_ratios"] + [0, 0, 0]))
    assert traced(cairn, model, PROMPT[:12]) == traced(cairn, tiny_dsv4, PROMPT[:12])


def test_validate_only_counts_every_tensor(cairn, tiny_dsv4):
    with open(os.path.join(tiny_dsv4, "model.safetensors.index.json")) as f:
        n = len(json.load(f)["weight_map"])
    assert run(cairn, tiny_dsv4, "--validate-only").stdout.strip() == f"cairn: validated {n} tensors"


@pytest.mark.parametrize("name", ["layers.2.attn.compressor.ape", "layers.1.attn.indexer.wq_b.scale",
                                  "layers.3.ffn.experts.2.w3.weight", "mtp.0.e_proj.scale", "mtp.0.hc_head_base"])
def test_missing_tensor_is_named(cairn, tiny_dsv4, tmp_path, name):
    rejected(cairn, rewrite(tiny_dsv4, tmp_path / "m", name, lambda t: t.pop(name)), name)


def test_misshaped_tensor_is_named(cairn, tiny_dsv4, tmp_path):
    name = "layers.3.attn.attn_sink"

    def grow(t):
        dt, shape, raw = t[name]
        t[name] = (dt, [shape[0] + 1], raw + raw[:4])
    rejected(cairn, rewrite(tiny_dsv4, tmp_path / "m", name, grow), name)


def test_wrong_dtype_is_named(cairn, tiny_dsv4, tmp_path):
    name = "layers.1.attn.wkv.weight"

    def retype(t):
        _, shape, raw = t[name]
        t[name] = ("U8", shape, raw)
    rejected(cairn, rewrite(tiny_dsv4, tmp_path / "m", name, retype), name)


def test_out_of_range_hash_expert_is_named(cairn, tiny_dsv4, tmp_path):
    name = "layers.0.ffn.gate.tid2eid"

    def corrupt(t):
        dt, shape, raw = t[name]
        t[name] = (dt, shape, (99).to_bytes(8, "little") + raw[8:])
    rejected(cairn, rewrite(tiny_dsv4, tmp_path / "m", name, corrupt), name)


def test_nan_weights_fail_instead_of_emitting(cairn, tiny_dsv4, tmp_path):
    """A NaN block scale (E8M0 0xff) poisons the logits: the run must fail, naming the position."""
    name = "layers.2.attn.wo_b.scale"

    def poison(t):
        dt, shape, raw = t[name]
        t[name] = (dt, shape, b"\xff" + raw[1:])
    model = rewrite(tiny_dsv4, tmp_path / "m", name, poison)
    p = run(cairn, model, "--prompt-ids", "0,5,9", "-n", 2, ok=False)
    assert p.returncode != 0 and "non-finite logit" in p.stderr, p.stderr


# ---- a variant the tiny model does not cover ----------------------------------------------------

# hc_mult 2 with 3 Sinkhorn iterations, one output group, HCA ratio 16, no hash layers, 3 experts
# per token, and a 0731-style compress_ratios list longer than layers + MTP.
VARIANT = {"hc_mult": 2, "hc_sinkhorn_iters": 3, "num_hidden_layers": 3, "compress_ratios": [4, 16, 0, 0, 0, 0],
           "num_hash_layers": 0, "o_groups": 1, "num_attention_heads": 4, "index_topk": 3, "index_n_heads": 3,
           "sliding_window": 5, "num_experts_per_tok": 3, "n_routed_experts": 6}


def assert_matches_reference(traced_out, model, ids):
    """Every prompt position's top-3 (exact numerics) against the float64 reference's."""
    echo = [json.loads(line) for line in traced_out.splitlines()][: len(ids)]
    want = ref.run(model, ids, "exact", top=1024)
    for got, w in zip(echo, want):
        dist = {e["id"]: e["logprob"] for e in w["top"]}
        assert got["top"][0]["id"] == w["top"][0]["id"], got["pos"]
        assert max(abs(e["logprob"] - dist[e["id"]]) for e in got["top"]) < 2e-3, got["pos"]


@pytest.fixture(scope="module")
def variant_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dsv4_variant"))
    base = tiny_deepseek_v4.config_for
    tiny_deepseek_v4.config_for = lambda size: dict(base(size), **VARIANT)
    try:
        tiny_deepseek_v4.make(out, "tiny", 77)
    finally:
        tiny_deepseek_v4.config_for = base
    return out


def test_variant_matches_reference_and_is_chunking_invariant(cairn, variant_model):
    ids = [0] + [(37 * i) % 1000 + 2 for i in range(1, 36)]
    one = traced(cairn, variant_model, ids, "--numerics", "exact")
    assert traced(cairn, variant_model, ids, "--numerics", "exact", "--prefill-chunks", "3,5,1,7") == one
    assert traced(cairn, variant_model, ids, "--numerics", "exact", "--snapshot-at", 17) == one
    assert_matches_reference(one, variant_model, ids)


# ---- FP8 linears with F32 block scales ---------------------------------------------------------

def f32_scales(tensors, rng):
    """Every FP8 linear's E8M0 block scales as F32 factors, each moved off its power of two."""
    for name in [n for n in tensors if n.endswith(".scale")]:
        weight = tensors.get(name[: -len(".scale")] + ".weight")
        if not weight or weight[0] != "F8_E4M3":
            continue
        _, shape, raw = tensors[name]
        e = np.frombuffer(raw, dtype=np.uint8).astype(np.float64)
        tensors[name] = ("F32", shape, (2.0 ** (e - 127) * rng.uniform(0.75, 1.25, e.shape)).astype(np.float32).tobytes())


@pytest.fixture(scope="module")
def f32_scale_model(tiny_dsv4, tmp_path_factory):
    dst = tmp_path_factory.mktemp("dsv4_f32_scales") / "m"
    shutil.copytree(tiny_dsv4, dst)
    with open(os.path.join(dst, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    rng = np.random.default_rng(5)
    for shard in shards:
        tensors = st.read_file(os.path.join(dst, shard))
        f32_scales(tensors, rng)
        st.write_file(os.path.join(dst, shard), tensors)
    return str(dst)


def test_fp8_with_f32_block_scales_matches_reference(cairn, tiny_dsv4, f32_scale_model):
    """The kernels run FP8 with F32 block scales; the loader takes them for DeepSeek V4 too."""
    one = traced(cairn, f32_scale_model, PROMPT, "--numerics", "exact")
    assert one != traced(cairn, tiny_dsv4, PROMPT, "--numerics", "exact"), "the scales changed nothing"
    assert traced(cairn, f32_scale_model, PROMPT, "--numerics", "exact", "--prefill-chunks", "3,5,1,7") == one
    assert_matches_reference(one, f32_scale_model, PROMPT)
