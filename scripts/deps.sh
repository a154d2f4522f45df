#!/bin/sh
# Installs the Debian packages cairn needs (as root), or prints the exact command and stops.
# --build: only check what compiling needs (plain `make`), and print the command, never install.
set -e
# clang + libclang-rt-14-dev: the libFuzzer targets (make fuzz-build, run by make test).
# chromium: the chat page's browser tests (driven by puppeteer-core, tests/node/webui.test.mjs).
# nginx + libnginx-mod-http-js: replicas behind nginx (deploy/nginx.conf, tests/test_replicas.py).
# openmpi-bin + libopenmpi-dev: expert parallelism (make mpi -> build/mpi/cairn, tests/test_mpi.py).
PKGS="build-essential libcjson-dev libpcre2-dev libmicrohttpd-dev python3-numpy python3-pytest nodejs npm clang libclang-rt-14-dev chromium nginx libnginx-mod-http-js openmpi-bin libopenmpi-dev"
if [ "$1" = "--build" ]; then
    missing=""
    for p in build-essential libcjson-dev libpcre2-dev libmicrohttpd-dev; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    [ -z "$missing" ] && exit 0
    echo "cairn: the build needs Debian packages that are missing. Run:" >&2
    echo "  sudo apt-get install -y$missing" >&2
    echo "(or 'make test' / 'make run' as root, which install everything they need)" >&2
    exit 1
fi
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# node/npm may come from outside Debian (e.g. a preinstalled nodejs); accept any working binaries.
case "$missing" in *nodejs*|*npm*) command -v node >/dev/null && command -v npm >/dev/null &&
    missing=$(echo "$missing" | sed 's/ nodejs//; s/ npm//') ;; esac
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "deps: installing$missing"
        apt-get update -qq
        # Debian starts a service as its package is installed (nginx would take port 80 and stay up);
        # cairn only runs its own nginx processes, so refuse service starts during this install, the way
        # Debian's container images do, unless the machine already has a policy of its own.
        policy=""
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            policy=/usr/sbin/policy-rc.d
            printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null || { rc=$?; [ -n "$policy" ] && rm -f "$policy"; exit $rc; }
        [ -n "$policy" ] && rm -f "$policy"
    else
        echo "deps: missing packages. Run:"
        echo "  sudo apt-get install -y$missing"
        exit 1
    fi
fi
# Node packages used as real-world oracles and clients in tests (puppeteer-core drives the
# Debian chromium above; it downloads no browser of its own).
# Every dependency package.json names must be there: a tree installed before one was added
# (ajv, say) would otherwise pass this check and fail the tests that need it.
node_missing=""
for d in $(sed -n '/"dependencies"/,/}/s/^ *"\([^"]*\)": *".*/\1/p' tests/node/package.json); do
    [ -d "tests/node/node_modules/$d" ] || node_missing="$node_missing $d"
done
if [ -n "$node_missing" ]; then
    echo "deps: npm install (tests/node:$node_missing)"
    (cd tests/node && npm install --no-audit --no-fund --loglevel=error >/dev/null)
fi
