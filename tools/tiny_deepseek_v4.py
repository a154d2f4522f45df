"""DeepSeek V4 test and benchmark checkpoints in the official layout (deepseek_v4.md §1, §8, §11).

make(outdir, size, seed) writes config.json, sharded safetensors + model.safetensors.index.json
and a byte-level BPE tokenizer.json carrying the DeepSeek V4 special tokens.

size "tiny": the §11 config (4 layers SWA/CSA/HCA/CSA + one MTP block, every mechanism live) with
vocab 1024 (the byte-level BPE needs 256 byte pieces + specials + merges). Weights are seeded
normals quantised exactly as the official checkpoint stores them (FP8 E4M3 + E8M0 per 128x128,
FP4 E2M1 + E8M0 per 32, BF16, F32, I64 tid2eid). Their scales keep activations O(1) through the
stack and give logits a spread of several nats, so a wrong mechanism shows up in the top-k.

size "bench": the same architecture scaled to > 2 GB of weights. FP8/FP4 codes and BF16 values
are drawn directly as random bytes / normals (no quantisation pass) so it is written in seconds;
numerically it is noise, which is all a throughput benchmark needs.

Called by tools/make_tiny.py; not a CLI of its own.
"""
import json
import os

import numpy as np

import st
import tokjson

# Special tokens at fixed low ids; BOS/EOS as in the real model, the rest in one block after them.
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<think>", "</think>", "<｜latest_reminder｜>", "｜DSML｜",
            "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>"]

COMMON = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "num_key_value_heads": 1,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "num_nextn_predict_layers": 1,
    "expert_dtype": "fp4",
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
}

SIZES = {
    "tiny": {
        "vocab_size": 1024, "hidden_size": 128, "num_hidden_layers": 4,
        "compress_ratios": [0, 4, 8, 4, 0],
        "num_attention_heads": 2, "head_dim": 128, "q_lora_rank": 128,
        "o_groups": 2, "o_lora_rank": 128, "sliding_window": 8,
        "index_n_heads": 2, "index_head_dim": 128, "index_topk": 2,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 128, "num_hash_layers": 1, "max_position_embeddings": 1024,
    },
    "bench": {
        "vocab_size": 32768, "hidden_size": 2048, "num_hidden_layers": 8,
        "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 0],
        "num_attention_heads": 16, "head_dim": 512, "q_lora_rank": 1024,
        "o_groups": 4, "o_lora_rank": 1024, "sliding_window": 128,
        "index_n_heads": 16, "index_head_dim": 128, "index_topk": 512,
        "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 1,
        "moe_intermediate_size": 1024, "num_hash_layers": 2, "max_position_embeddings": 65536,
    },
}


def config_for(size):
    c = dict(COMMON)
    c.update(SIZES[size])
    return c


FP8_BENCH_STD = 100.0     # in E4M3 units: a 128x128 block of normals then has its largest near 448


class Weights:
    """Makes tensors in their checkpoint encodings. `exact` quantises seeded normals (tiny);
    otherwise codes are drawn directly (bench: fast, numerically meaningless)."""

    def __init__(self, seed, exact):
        self.rng = np.random.default_rng(seed)
        self.exact = exact

    def normal(self, shape, std):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def matrix(self, out_f, in_f, gain):
        """Seeded normal [out, in] with std gain/sqrt(in); gain may be per row [out,1] or column [1,in]."""
        return self.normal((out_f, in_f), 1 / np.sqrt(in_f)).astype(np.float64) * gain

    def fp8(self, out_f, in_f, gain=1.0):
        """Dense linear [out, in] -> {'weight': E4M3, 'scale': E8M0}."""
        so, si = -(-out_f // 128), -(-in_f // 128)
        if self.exact:
            q, s = st.fp8_quantize_weight(self.matrix(out_f, in_f, gain))
        else:
            q = self.normal_e4m3_codes((out_f, in_f))
            s = np.full((so, si), 127 + int(np.round(np.log2(1 / (FP8_BENCH_STD * np.sqrt(in_f))))), dtype=np.uint8)
        return {"weight": ("F8_E4M3", [out_f, in_f], q.tobytes()),
                "scale": ("F8_E8M0", [so, si], s.tobytes())}

    def normal_e4m3_codes(self, shape):
        """E4M3 codes (round to nearest) of normal samples with std FP8_BENCH_STD, saturated at
        448: the spread a block-scaled checkpoint has (its largest code near 448), so exponent
        field 0 (zero and subnormals) is as rare as in real FP8 weights, where the FP8 kernels'
        fast decode applies (kernels_avx512.c, fp8_factors64)."""
        z = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(FP8_BENCH_STD)
        m, ex = np.frexp(np.minimum(np.abs(z), np.float32(448.0)))   # |z| = m * 2^ex, m in [0.5, 1)
        q = np.rint(m * 16).astype(np.int32)                          # four significant bits: 8..16
        up = q == 16
        e = np.where(up, ex + 7, ex + 6)                                # exponent field, 2^(e-7)
        k = np.where(up, 0, q - 8)
        sub = e < 1                                                     # below 2^-6: subnormal codes
        k = np.where(sub, np.rint(np.abs(z) * 512).astype(np.int32), k)
        code = np.where(sub, k, (e << 3) | k).astype(np.uint8)          # k = 8 is code 8 either way
        return code | (np.signbit(z).astype(np.uint8) << 7)

    def fp4(self, out_f, in_f, gain=1.0):
        """Routed-expert linear: packed E2M1 I8 [out, in/2] + E8M0 [out, in/32]."""
        if self.exact:
            q, s = st.fp4_quantize_weight(self.matrix(out_f, in_f, gain))
        else:
            q = self.rng.integers(0, 256, (out_f, in_f // 2), dtype=np.uint8).view(np.int8)
            s = np.full((out_f, in_f // 32), 127 + int(np.round(np.log2(1 / np.sqrt(in_f) / 2.9))), dtype=np.uint8)
        return {"weight": ("I8", [out_f, in_f // 2], q.tobytes()),
                "scale": ("F8_E8M0", [out_f, in_f // 32], s.tobytes())}

    def bf16(self, shape, std, mean=0.0):
        return ("BF16", list(shape), st.bf16_bytes(self.normal(shape, std) + np.float32(mean)))

    def f32(self, shape, std, mean=0.0):
        return (self.normal(shape, std) + np.float32(mean)).astype(np.float32)


def put(dst, prefix, parts):
    for k, v in parts.items():
        dst[f"{prefix}.{k}"] = v


def hc_params(w, dst, name, c):
    """mHC mixing for one sub-layer: fn [(2+hc)*hc, hc*D], base, scale [3]."""
    hc, d = c["hc_mult"], c["hidden_size"]
    mix = (2 + hc) * hc
    # mix = rsqrt(mean H^2) * fn . H has std ~ std(fn)*sqrt(hc*d); keep it ~0.5
    dst[f"{name}_fn"] = w.f32((mix, hc * d), 0.5 / np.sqrt(hc * d))
    dst[f"{name}_base"] = w.f32((mix,), 0.5)
    dst[f"{name}_scale"] = w.f32((3,), 0.2, 1.0)


def compressor(w, dst, prefix, c, ratio, dim):
    coff = 2 if ratio == 4 else 1
    d = c["hidden_size"]
    dst[f"{prefix}.ape"] = w.f32((ratio, coff * dim), 0.5)
    dst[f"{prefix}.norm.weight"] = w.bf16((dim,), 0.1, 1.0)
    dst[f"{prefix}.wkv.weight"] = w.bf16((coff * dim, d), 1 / np.sqrt(d))
    dst[f"{prefix}.wgate.weight"] = w.bf16((coff * dim, d), 1 / np.sqrt(d))


def attention(w, dst, p, c, ratio):
    d, h, hd = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    ql, g, ol = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    dst[f"{p}.attn_sink"] = w.f32((h,), 1.0)
    dst[f"{p}.q_norm.weight"] = w.bf16((ql,), 0.1, 1.0)
    dst[f"{p}.kv_norm.weight"] = w.bf16((hd,), 0.1, 1.0)
    put(dst, f"{p}.wq_a", w.fp8(ql, d))
    put(dst, f"{p}.wq_b", w.fp8(h * hd, ql))
    put(dst, f"{p}.wkv", w.fp8(hd, d))
    put(dst, f"{p}.wo_a", w.fp8(g * ol, h * hd // g))
    put(dst, f"{p}.wo_b", w.fp8(d, g * ol))
    if ratio:
        compressor(w, dst, f"{p}.compressor", c, ratio, hd)
    if ratio == 4:
        ih, ihd = c["index_n_heads"], c["index_head_dim"]
        compressor(w, dst, f"{p}.indexer.compressor", c, ratio, ihd)
        dst[f"{p}.indexer.weights_proj.weight"] = w.bf16((ih, d), 1 / np.sqrt(d))
        put(dst, f"{p}.indexer.wq_b", w.fp8(ih * ihd, ql))


def tid2eid(w, c):
    """[vocab, k] expert ids, distinct within a row (hash routing)."""
    v, e, k = c["vocab_size"], c["n_routed_experts"], c["num_experts_per_tok"]
    keys = w.rng.random((v, e))
    return np.argsort(keys, axis=1)[:, :k].astype(np.int64)


def moe(w, dst, p, c, hashed):
    d, e, inter = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]
    dst[f"{p}.gate.weight"] = w.bf16((e, d), 1 / np.sqrt(d))
    if hashed:
        dst[f"{p}.gate.tid2eid"] = tid2eid(w, c)
    else:
        dst[f"{p}.gate.bias"] = w.f32((e,), 0.3)
    # A few hidden units with 10x gain push |w1.x| and |w3.x| past swiglu_limit (10) often, so
    # the clamp is live; w2 scales those units back down to keep the output O(1).
    hot = np.ones(inter)
    hot[: max(1, inter // 16)] = 10.0
    shapes = {"w1": (inter, d, hot[:, None]), "w3": (inter, d, hot[:, None]), "w2": (d, inter, 1 / hot[None, :])}
    for name, (o, i, gain) in shapes.items():
        put(dst, f"{p}.shared_experts.{name}", w.fp8(o, i, gain))
    for j in range(e):
        for name, (o, i, gain) in shapes.items():
            put(dst, f"{p}.experts.{j}.{name}", w.fp4(o, i, gain))


def block(w, c, prefix, ratio, hashed):
    dst = {}
    d = c["hidden_size"]
    dst[f"{prefix}.attn_norm.weight"] = w.bf16((d,), 0.1, 1.0)
    dst[f"{prefix}.ffn_norm.weight"] = w.bf16((d,), 0.1, 1.0)
    hc_params(w, dst, f"{prefix}.hc_attn", c)
    hc_params(w, dst, f"{prefix}.hc_ffn", c)
    attention(w, dst, f"{prefix}.attn", c, ratio)
    moe(w, dst, f"{prefix}.ffn", c, hashed)
    return dst


def hc_head(w, dst, prefix, c):
    hc, d = c["hc_mult"], c["hidden_size"]
    dst[f"{prefix}hc_head_fn"] = w.f32((hc, hc * d), 0.5 / np.sqrt(hc * d))
    dst[f"{prefix}hc_head_base"] = w.f32((hc,), 0.5)
    dst[f"{prefix}hc_head_scale"] = w.f32((1,), 0.2, 1.0)


def top_level(w, c):
    v, d = c["vocab_size"], c["hidden_size"]
    dst = {"embed.weight": w.bf16((v, d), 1.0),
           # logits = head . unit-RMS vector: std 0.25 gives a logit spread of ~0.25*sqrt(D) nats
           "head.weight": w.bf16((v, d), 0.25 if w.exact else 1 / np.sqrt(d)),
           "norm.weight": w.bf16((d,), 0.1, 1.0)}
    hc_head(w, dst, "", c)
    return dst


def mtp(w, c, j):
    """MTP block j: an ordinary block (ratio from compress_ratios after the main layers) + its
    input projections, norms and hc_head."""
    n, d, p = c["num_hidden_layers"], c["hidden_size"], f"mtp.{j}"
    dst = block(w, c, p, c["compress_ratios"][n + j], False)
    put(dst, f"{p}.e_proj", w.fp8(d, d))
    put(dst, f"{p}.h_proj", w.fp8(d, d))
    for name in ("enorm", "hnorm", "norm"):
        dst[f"{p}.{name}.weight"] = w.bf16((d,), 0.1, 1.0)
    hc_head(w, dst, f"{p}.", c)
    return dst


def shard_groups(w, c):
    """Yields one dict of tensors per shard: top level, each layer, the MTP block."""
    yield top_level(w, c)
    for i in range(c["num_hidden_layers"]):
        yield block(w, c, f"layers.{i}", c["compress_ratios"][i], i < c["num_hash_layers"])
    for j in range(c["num_nextn_predict_layers"]):
        yield mtp(w, c, j)


def write_shards(outdir, groups, n_shards):
    """One shard per group, written as soon as it is made (bench weights never sit in memory whole)."""
    weight_map, total = {}, 0
    for i, tensors in enumerate(groups):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n_shards)
        st.write_file(os.path.join(outdir, fname), tensors)
        for k, v in tensors.items():
            weight_map[k] = fname
            total += v.nbytes if isinstance(v, np.ndarray) else len(v[2])
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return total


def make(outdir, size, seed):
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} (one of {sorted(SIZES)})")
    c = config_for(size)
    os.makedirs(outdir, exist_ok=True)
    for name in os.listdir(outdir):        # a previous, differently sharded run must not linger
        if name.endswith(".safetensors"):
            os.remove(os.path.join(outdir, name))
    w = Weights(seed, exact=(size == "tiny"))
    n_shards = 1 + c["num_hidden_layers"] + c["num_nextn_predict_layers"]
    total = write_shards(outdir, shard_groups(w, c), n_shards)
    if size == "bench" and total < 2 << 30:
        raise RuntimeError(f"bench model has only {total} bytes of weights (want >= 2 GiB)")
    tokjson.build(os.path.join(outdir, "tokenizer.json"), c["vocab_size"], list(enumerate(SPECIALS)),
                  "deepseek", seed)
    # config.json last: its presence marks a complete model (tests/conftest.py keys on it)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return total
