#!/usr/bin/python3
"""Make a small model of a family in the official checkpoint layout.

usage: /usr/bin/python3 tools/make_tiny.py FAMILY OUTDIR [--size tiny|bench] [--seed N] [--layout hf|raw] [--nvfp4]
(another python3 without numpy re-runs itself with /usr/bin/python3, which has it)

Each family's generator is tools/tiny_<family>.py with a function
make(outdir, size, seed) that writes config.json, the safetensors and tokenizer.json.
--layout and --nvfp4 are passed on to generators that take them (Inkling: the released raw
layout; the main model's projections as NVFP4, the release format).
"""
import argparse
import importlib
import inspect
import os
import sys

try:
    import numpy  # noqa: F401  (the generators need it)
except ImportError:
    if not os.environ.get("CAIRN_MAKE_TINY_REEXEC") and os.path.exists("/usr/bin/python3"):
        os.environ["CAIRN_MAKE_TINY_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    sys.exit("make_tiny: numpy is missing: sudo apt-get install -y python3-numpy")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
FAMILIES = {"deepseek_v4": "tiny_deepseek_v4", "glm": "tiny_glm", "glm_moe_dsa": "tiny_glm", "kimi_k3": "tiny_kimi_k3",
            "inkling": "tiny_inkling"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("outdir")
    ap.add_argument("--size", choices=["tiny", "bench"], default="tiny")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layout", choices=["hf", "raw"], help="checkpoint layout (families with more than one)")
    ap.add_argument("--nvfp4", action="store_true", help="NVFP4 projections (families whose release ships them)")
    a = ap.parse_args()
    gen = importlib.import_module(FAMILIES[a.family])
    extra = {k: v for k, v in (("layout", a.layout), ("nvfp4", a.nvfp4)) if v}
    params = inspect.signature(gen.make).parameters
    for k in extra:
        if k not in params:
            ap.error(f"--{k} is not available for {a.family}")
    os.makedirs(a.outdir, exist_ok=True)
    gen.make(a.outdir, a.size, a.seed, **extra)


if __name__ == "__main__":
    main()
