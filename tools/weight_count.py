#!/usr/bin/python3
"""What one decode step of a checkpoint reads, counted from its safetensors headers and config.json
alone: the independent side of the engine's tensor table (src/core/tensor_table.h), sharing no
code with it.

usage: python3 tools/weight_count.py FAMILY MODEL_DIR [POS,POS,...]
prints {"validated": N, "decode_bytes": B, "draft_bytes": D, "draft_flops": G,
"token_flops": {"POS": F, ...}} like
`cairn run -m MODEL_DIR --weights-report POS,...`.

Rules, from the official layouts (per family below):
  - every tensor the engine looks up is counted once in `validated` (block scales included);
    tensors a release ships but no implementation reads are left out (`ignored`);
  - bytes are a tensor's stored bytes; a quantized matrix's scale tensor counts with it, except
    NVFP4's per-matrix global scale (`_global_scale`, `_scale_2`), a constant read once at load;
  - a decode step reads every dense / shared-expert tensor whole, one row of a lookup table
    (embedding, hash routing table), of each layer's routed experts num_experts_per_tok out of
    num_experts (the layer's routed bytes * k // E), nothing of validated-only tensors (an MTP
    layer the engine does not draft with, audio);
  - an MTP layer the engine drafts with (GLM, DeepSeek V4 block 0) is counted by the same rules
    on its own: draft_bytes and draft_flops are what one MTP step over one token reads and computes (0 without one);
  - FLOPs are 2 * rows * cols per matrix a token passes through (routed experts at the same
    k / E share), plus the position-dependent work the family's attention does (`extra_flops`).
"""
import json
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

# ---- headers ---------------------------------------------------------------------------------


def headers(d):
    """{name: (dtype, shape, nbytes)} from every shard's JSON header (no tensor data is read)."""
    out = {}
    for name in st.shard_files(d):
        with open(os.path.join(d, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            for k, v in json.loads(f.read(n)).items():
                if k != "__metadata__":
                    out[k] = (v["dtype"], v["shape"], v["data_offsets"][1] - v["data_offsets"][0])
    return out


# NVFP4's global scales: one number per matrix, held by value, not streamed per token.
GLOBAL_SCALES = ("_global_scale", "_scale_2")


def companion_of(name, h):
    """The matrix a scale tensor belongs to, or None when `name` is not a scale tensor. Packed
    codes are `<w>_packed` (compressed-tensors) or `<w>` itself (ModelOpt, DeepSeek)."""
    for suffix, base in (("_scale_inv", ""), ("_scale_2", ""), ("_global_scale", "_packed"), ("_scale", "_packed"),
                         ("_scale", ""), (".scale", ".weight"), (".qs", "")):
        if name.endswith(suffix) and name[: -len(suffix)] + base in h:
            return name[: -len(suffix)] + base
    return None


def matrix_dims(name, h, scales):
    """Logical [rows, cols] of a 2-D matrix: packed FP4 holds two columns per byte."""
    dt, shape, _ = h[name]
    if any(h[s][0] == "F32" and s.endswith(".qs") for s in scales):
        raise NotImplementedError(f"{name}: int containers carry no column count in the header")
    if dt in ("I8", "U8") and scales:
        return shape[0], 2 * shape[1]
    return shape[0], shape[1]


# ---- families --------------------------------------------------------------------------------
# classify(name, shape, cfg, h) -> (role, layer, draft): role "dense" | "routed" | "lookup" |
# "idle" | "ignored", draft True for the tensors of an MTP layer the engine drafts with; matmul(name, shape) says whether a 2-D (or stacked 3-D) tensor is a product a token
# runs; experts(cfg) -> (E, k); extra_flops(cfg, h, pos).


def rows(h, name):
    """Rows of matrix `name`, stored as is or as compressed-tensors' `<name>_packed`."""
    return h[name if name in h else name + "_packed"][1][0]


def layer_of(pattern, name):
    m = re.match(pattern, name)
    return int(m.group(1)) if m else -1


class DeepSeekV4:
    def config(self, c):
        return c

    def classify(self, name, shape, c, h):
        if name.startswith("mtp."):     # block 0 drafts when it is window-only; the others are validated only
            n, ratios = c["num_hidden_layers"], c["compress_ratios"]
            if not name.startswith("mtp.0.") or len(ratios) <= n or ratios[n] != 0:
                return "idle", -1, False
            return ("routed", n, True) if re.match(r"mtp\.0\.ffn\.experts\.\d+\.", name) else ("dense", -1, True)
        if name == "embed.weight" or name.endswith("ffn.gate.tid2eid"):
            return "lookup", -1, False
        layer = layer_of(r"layers\.(\d+)\.ffn\.experts\.\d+\.", name)
        return ("routed" if layer >= 0 else "dense"), layer, False

    def matmul(self, name, shape):
        return len(shape) == 2 and not name.endswith((".ape", "tid2eid"))

    def experts(self, c):
        return c["n_routed_experts"], c["num_experts_per_tok"]

    def extra_flops(self, c, h, pos):
        f = 0.0
        for l in range(c["num_hidden_layers"]):
            r = c["compress_ratios"][l]
            nvis = (pos + 1) // r if r else 0
            cand = min(pos + 1, c["sliding_window"]) + (min(nvis, c["index_topk"]) if r == 4 else nvis)
            f += 4.0 * c["num_attention_heads"] * c["head_dim"] * cand
            if r == 4:
                f += 2.0 * c["index_n_heads"] * c["index_head_dim"] * nvis
        return f


class Glm:
    def config(self, c):
        return c

    def classify(self, name, shape, c, h):
        draft = layer_of(r"model\.layers\.(\d+)\.", name) >= c["num_hidden_layers"]      # the MTP layer
        if name == "model.embed_tokens.weight":
            return "lookup", -1, False
        layer = layer_of(r"model\.layers\.(\d+)\.mlp\.experts\.\d+\.", name)
        return ("routed" if layer >= 0 else "dense"), layer, draft

    def matmul(self, name, shape):
        return len(shape) == 2

    def experts(self, c):
        return c["n_routed_experts"], c["num_experts_per_tok"]

    def extra_flops(self, c, h, pos):
        indexed = "index_topk" in c
        attended = min(pos + 1, c["index_topk"]) if indexed else pos + 1
        f = 0.0
        for i in range(c["num_hidden_layers"]):
            f += 2.0 * c["num_attention_heads"] * attended * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
            if indexed and f"model.layers.{i}.self_attn.indexer.wq_b.weight" in h:
                f += c["index_n_heads"] * c["index_head_dim"] * (pos + 1)
        return 2.0 * f


class KimiK3:
    def config(self, c):
        return c.get("text_config", c)

    @staticmethod
    def bare(name):
        return name[len("language_model."):] if name.startswith("language_model.") else name

    def classify(self, name, shape, c, h):
        n = self.bare(name)
        if n.startswith("model.layers.0.self_attention_res_"):
            return "ignored", -1, False  # layer 0's attention-site mixer has nothing to mix
        if n == "model.embed_tokens.weight":
            return "lookup", -1, False
        layer = layer_of(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.\d+\.", n)
        return ("routed" if layer >= 0 else "dense"), layer, False

    def matmul(self, name, shape):
        return len(shape) == 2 and "_res_proj" not in name      # [1, n] residual projections

    def experts(self, c):
        return c["num_experts"], c["num_experts_per_token"]

    def extra_flops(self, c, h, pos):
        lin = c["linear_attn_config"]
        root = "language_model." if "language_model.model.embed_tokens.weight" in h else ""
        f = 0.0
        for i in range(c["num_hidden_layers"]):
            if f"{root}model.layers.{i}.self_attn.A_log" in h:
                f += 4.0 * lin["num_heads"] * lin["head_dim"] ** 2
            else:
                f += 2.0 * c["num_attention_heads"] * (pos + 1) * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
        return 2.0 * f


class Inkling:
    def config(self, c):
        return c.get("text_config", c)

    def classify(self, name, shape, c, h):
        if name.startswith("model.mtp."):
            return "ignored", -1, False
        if name.startswith("model.audio"):
            return "idle", -1, False
        if name in ("model.llm.embed.weight", "model.language_model.embed_tokens.weight"):
            return "lookup", -1, False
        layer = layer_of(r"model\.(?:llm|language_model)\.layers\.(\d+)\.mlp\.experts\.", name)
        return ("routed" if layer >= 0 else "dense"), layer, False

    def matmul(self, name, shape):
        return len(shape) in (2, 3) and shape[1] != 1 and not name.endswith("rel_logits_proj.proj")

    def experts(self, c):
        return c.get("n_routed_experts", 256), c.get("num_experts_per_tok", 6)

    @staticmethod
    def sliding(c, i):
        if "layer_types" in c:
            return c["layer_types"][i] == "hybrid_sliding"
        if "local_layer_ids" in c:
            return i in c["local_layer_ids"]
        return (i + 1) % 6 != 0

    def extra_flops(self, c, h, pos):
        raw = "model.llm.embed.weight" in h
        d_rel, dim = c.get("d_rel", 16), c.get("hidden_size", 6144)
        k = c.get("sconv_kernel_size", c.get("conv_kernel_size", 4))
        window = c.get("sliding_window_size", 512)
        f = 0.0
        for i in range(c["num_hidden_layers"]):
            p = f"model.llm.layers.{i}.attn." if raw else f"model.language_model.layers.{i}.self_attn."
            kvd = rows(h, p + ("wk_dv.weight" if raw else "k_proj.weight"))
            heads = rows(h, p + ("wr_du.weight" if raw else "r_proj.weight")) // d_rel
            head_dim = h[p + "q_norm.weight"][1][0]
            extent = h[p + "rel_logits_proj.proj"][1][1]
            keys = min(pos + 1, window) if self.sliding(c, i) else pos + 1
            f += (2 * kvd + 2.0 * dim) * k + heads * d_rel * extent + 2.0 * heads * keys * head_dim
        return 2.0 * f


FAMILIES = {"deepseek_v4": DeepSeekV4(), "glm": Glm(), "kimi_k3": KimiK3(), "inkling": Inkling()}


# ---- the count -------------------------------------------------------------------------------


def count(family, d, positions):
    fam = FAMILIES[family]
    c = fam.config(json.load(open(os.path.join(d, "config.json"))))
    h = headers(d)
    scales = {}
    for name in h:
        base = companion_of(name, h)
        if base:
            scales.setdefault(base, []).append(name)
    companions = {s for v in scales.values() for s in v}
    E, k = fam.experts(c)
    # [decode, draft] sums: dense bytes, dense FLOPs, routed bytes and FLOPs by layer
    dense, flops, routed_b, routed_f = [0, 0], [0.0, 0.0], [{}, {}], [{}, {}]
    validated = 0
    for name, (dt, shape, nbytes) in h.items():
        if name in companions:
            continue
        role, layer, draft = fam.classify(name, shape, c, h)
        w = int(draft)
        if role == "ignored":
            continue
        validated += 1 + len(scales.get(name, []))
        nbytes += sum(h[s][2] for s in scales.get(name, []) if not s.endswith(GLOBAL_SCALES))
        mm = 0.0
        if fam.matmul(name, shape) and role in ("dense", "routed"):
            if len(shape) == 3:   # a stack; packed codes hold two columns per byte
                mm = 2.0 * shape[0] * shape[1] * shape[2] * (2 if dt == "U8" and name in scales else 1)
            else:
                rows, cols = matrix_dims(name, h, scales.get(name, []))
                mm = 2.0 * rows * cols
        if role == "dense":
            dense[w] += nbytes
            flops[w] += mm
        elif role == "lookup":
            dense[w] += nbytes // shape[0]
        elif role == "routed":
            routed_b[w][layer] = routed_b[w].get(layer, 0) + nbytes
            routed_f[w][layer] = routed_f[w].get(layer, 0.0) + mm
    nbytes = [dense[w] + sum(b * k // E for b in routed_b[w].values()) for w in (0, 1)]
    nflops = [flops[w] + sum(f * k / E for f in routed_f[w].values()) for w in (0, 1)]
    return {"validated": validated, "decode_bytes": nbytes[0], "draft_bytes": nbytes[1], "draft_flops": nflops[1],
            "token_flops": {str(p): nflops[0] + fam.extra_flops(c, h, p) for p in positions}}


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in FAMILIES:
        sys.exit(__doc__)
    positions = [int(p) for p in sys.argv[3].split(",")] if len(sys.argv) == 4 else [0]
    print(json.dumps(count(sys.argv[1], sys.argv[2], positions)))


if __name__ == "__main__":
    main()
