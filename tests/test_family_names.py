"""No family is named outside src/models/: the generic layers (core, state, serve, the CLI
commands and the benches) learn everything from the family descriptor (src/models/model.h).

The code is checked with comments stripped (comments may cite a family as an example) but
string literals kept: a family's name, alias, model_type or one of its turn tokens inside a
literal is family knowledge too. The names come from the registry (`cairn families`), so a new
family is covered by registering."""
import glob
import os

import pytest

from conftest import FAMILIES, ROOT

def generic_files():
    files = []
    for d in ("core", "state", "serve"):
        files += glob.glob(os.path.join(ROOT, "src", d, "*.[ch]"))
    files += glob.glob(os.path.join(ROOT, "src", "cmd_*.c")) + glob.glob(os.path.join(ROOT, "src", "bench*.[ch]"))
    files += [os.path.join(ROOT, "src", f) for f in ("main.c", "cli.c", "cli.h")]
    return sorted(files)


def strip_comments(src):
    """C source without /* */ and // comments; string and character literals are kept."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def family_strings(desc):
    t = desc["turns"]
    words = [desc["name"], *desc["aliases"], *desc["model_types"], *t["start"], *t["boundaries"]]
    words += [w for w in (t["user"], t["assistant"]) if w]
    return sorted(set(words))


def test_stripper_keeps_literals_and_drops_comments():
    code = 'a = "x/*y*/"; /* glm */ b = \'"\'; // deepseek_v4\nc = "glm";'
    s = strip_comments(code)
    assert "deepseek_v4" not in s and "/* glm */" not in s
    assert '"x/*y*/"' in s and '"glm"' in s


def test_generic_files_exist():
    files = generic_files()
    assert any(f.endswith("engine.c") for f in files) and any(f.endswith("reuse.c") for f in files)


@pytest.mark.parametrize("desc", FAMILIES, ids=[f["name"] for f in FAMILIES])
def test_no_family_knowledge_outside_models(desc):
    found = []
    for path in generic_files():
        code = strip_comments(open(path, encoding="utf-8").read()).lower()
        for w in family_strings(desc):
            if w.lower() in code:
                found.append(f"{os.path.relpath(path, ROOT)}: {w!r}")
    assert not found, "family knowledge outside src/models/:\n" + "\n".join(found)
