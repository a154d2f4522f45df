"""The tensor table (src/core/tensor_table.h) from outside: what `cairn run --weights-report` says a
decode step reads (weight bytes, routed experts at top-k) and what a token costs (FLOPs) equals an
independent count from the safetensors headers and config.json (tools/weight_count.py, no shared
code), on every registered family's tiny model and on the full-scale official layouts (sparse
checkpoints: FP8 with E8M0 block scales, packed FP4 experts, both Inkling layouts). And a tensor
with the wrong shape or dtype is refused by name, expected vs found."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FAMILIES, ROOT, make_model
from test_sparse_checkpoint import sparse_model

sys.path.insert(0, os.path.join(ROOT, "tools"))
import st  # noqa: E402
import weight_count  # noqa: E402

# Window, compression and indexer boundaries of the tiny configs, and far beyond them.
POSITIONS = [0, 1, 3, 4, 7, 8, 63, 64, 127, 128, 511, 512, 1000, 4095]


def report(cairn, model):
    r = subprocess.run([cairn, "run", "-m", model, "--weights-report", ",".join(map(str, POSITIONS))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_counts_agree(cairn, family, model):
    got, want = report(cairn, model), weight_count.count(family, model, POSITIONS)
    assert got["validated"] == want["validated"]
    assert got["decode_bytes"] == want["decode_bytes"]
    assert got["draft_bytes"] == want["draft_bytes"] and got["draft_flops"] == want["draft_flops"]
    for p in map(str, POSITIONS):
        assert got["token_flops"][p] == want["token_flops"][p], f"position {p}"
    flops = [got["token_flops"][str(p)] for p in POSITIONS]
    assert flops == sorted(flops) and flops[-1] > flops[0], "attention cost must grow with the position"


@pytest.mark.parametrize("family", [f["name"] for f in FAMILIES])
def test_tiny_counts_match_the_headers(cairn, family):
    assert_counts_agree(cairn, family, make_model(family))


@pytest.mark.parametrize("family,layout", [("deepseek_v4", "deepseek_v4"), ("glm", "glm"), ("inkling", "inkling"),
                                           ("inkling", "inkling-hf")])
def test_full_scale_counts_match_the_headers(cairn, family, layout):
    """Real tensor lists and formats at full size; routed experts dominate the checkpoint, so
    counting them at top-k (not all) is what this checks above all."""
    model = sparse_model(layout)
    got = report(cairn, model)
    assert_counts_agree(cairn, family, model)
    total = sum(b for _, _, b in weight_count.headers(model).values())
    assert got["decode_bytes"] < total / 4, "a decode step reads every expert?"


def corrupted_copy(src, dst, name, change):
    """The tiny checkpoint with tensor `name` replaced by change((dtype, shape, raw))."""
    tensors = st.read_dir(src)
    tensors[name] = change(tensors[name])
    os.makedirs(dst, exist_ok=True)
    st.write_file(os.path.join(dst, "model.safetensors"), tensors)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    return dst


def validated_tensors(family, model):
    """The tensors the engine must check (not scale companions, not ones a release ships unread)."""
    fam = weight_count.FAMILIES[family]
    c = fam.config(json.load(open(os.path.join(model, "config.json"))))
    h = weight_count.headers(model)
    return {n: v for n, v in h.items()
            if not weight_count.companion_of(n, h) and fam.classify(n, v[1], c, h)[0] != "ignored"}


def refused(cairn, model, name, *words):
    r = subprocess.run([cairn, "run", "-m", model, "--validate-only"], capture_output=True, text=True)
    assert r.returncode != 0 and name in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def shape_str(shape):
    return "[" + ",".join(map(str, shape)) + "]"


@pytest.mark.parametrize("family", [f["name"] for f in FAMILIES])
def test_transposed_matrix_is_named(cairn, family, tmp_path):
    model = make_model(family)
    mats = sorted(n for n, (dt, shape, _) in validated_tensors(family, model).items()
                  if len(shape) == 2 and shape[0] != shape[1] and shape[0] > 1 and dt in ("BF16", "F32", "F8_E4M3"))
    assert len(mats) > 10
    name = mats[len(mats) // 2]
    dt, shape, _ = validated_tensors(family, model)[name]
    bad = corrupted_copy(model, str(tmp_path / "m"), name, lambda t: (t[0], [t[1][1], t[1][0]], t[2]))
    refused(cairn, bad, name, "expected", shape_str(shape), "found", shape_str([shape[1], shape[0]]))


@pytest.mark.parametrize("family", [f["name"] for f in FAMILIES])
def test_reshaped_vector_is_named(cairn, family, tmp_path):
    model = make_model(family)
    vecs = sorted(n for n, (_, shape, _) in validated_tensors(family, model).items() if len(shape) == 1 and shape[0] > 1)
    assert len(vecs) > 3
    name = vecs[len(vecs) // 2]
    n = validated_tensors(family, model)[name][1][0]
    bad = corrupted_copy(model, str(tmp_path / "m"), name, lambda t: (t[0], [n, 1], t[2]))
    refused(cairn, bad, name, "expected", "found", shape_str([n, 1]))


@pytest.mark.parametrize("family", [f["name"] for f in FAMILIES])
def test_wrong_dtype_is_named(cairn, family, tmp_path):
    """BF16 bytes relabelled F16 (same size, a dtype no family accepts) on a matrix and a vector."""
    model = make_model(family)
    valid = validated_tensors(family, model)
    picks = [sorted(n for n, (dt, shape, _) in valid.items() if dt == "BF16" and len(shape) == k) for k in (1, 2)]
    for i, names in enumerate(picks):
        assert names, "no BF16 tensor of this rank: the test would be blind"
        name = names[len(names) // 2]
        bad = corrupted_copy(model, str(tmp_path / f"m{i}"), name, lambda t: ("F16", t[1], t[2]))
        refused(cairn, bad, name, "expected", "found F16")
