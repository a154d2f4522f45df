"""Set-up (issue 13 §6): plain `make` on a machine without the C libraries names what is missing
with the exact install command (scripts/deps.sh --build) instead of failing on a missing header;
the tiny-model tool runs from any python3."""
import os
import subprocess

from conftest import ROOT


def test_build_check_prints_the_install_command(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    # A dpkg that knows only build-essential: the three libraries are "missing".
    (fake / "dpkg-query").write_text("#!/bin/sh\ncase \"$*\" in *build-essential*) echo 'install ok installed';; esac\n")
    (fake / "dpkg-query").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    r = subprocess.run(["sh", os.path.join(ROOT, "scripts", "deps.sh"), "--build"], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert r.returncode == 1, r
    assert "sudo apt-get install -y libcjson-dev libpcre2-dev libmicrohttpd-dev" in r.stderr, r.stderr
    ok = subprocess.run(["sh", os.path.join(ROOT, "scripts", "deps.sh"), "--build"], capture_output=True, text=True,
                        cwd=ROOT)
    assert ok.returncode == 0 and not ok.stderr, ok


def test_make_tiny_finds_numpys_interpreter(tmp_path):
    """Started by a python3 without numpy (here: one told to ignore site packages), the tool
    re-runs itself with /usr/bin/python3."""
    out = tmp_path / "m"
    r = subprocess.run(["/usr/bin/python3", "-I", "-S", os.path.join(ROOT, "tools", "make_tiny.py"), "glm", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (out / "config.json").exists()
