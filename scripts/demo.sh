#!/bin/sh
# make run: start `cairn serve` on the tiny DeepSeek V4 model, hold a short multi-turn chat
# through the OpenAI-compatible HTTP API, and show the prompt tokens reused from the engine's
# state growing turn by turn.
#
# usage: scripts/demo.sh [--keep | --no-keep]
#   --keep     keep the server running after the demo (until Ctrl-C); default on a terminal
#   --no-keep  stop it after the demo; default when not on a terminal (CI, pipes)
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
MODEL=build/models/deepseek_v4-tiny-1234
KEEP=0
[ -t 0 ] && KEEP=1
case "$1" in
    --keep) KEEP=1 ;;
    --no-keep) KEEP=0 ;;
    "") ;;
    *) echo "usage: scripts/demo.sh [--keep | --no-keep]" >&2; exit 2 ;;
esac

[ -x build/cairn ] || { echo "demo: build/cairn missing; run make" >&2; exit 1; }
if [ ! -f "$MODEL/config.json" ]; then
    echo "demo: generating the tiny DeepSeek V4 model in $MODEL"
    $PY tools/make_tiny.py deepseek_v4 "$MODEL" --seed 1234
fi

PORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=build/demo-serve.log
build/cairn serve -m "$MODEL" --port "$PORT" --slots 2 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM

URL="http://127.0.0.1:$PORT"
$PY - "$URL" <<'EOF'
import json, sys, time, urllib.error, urllib.request

url = sys.argv[1]
deadline = time.time() + 120
while True:
    try:
        if urllib.request.urlopen(url + "/health").status == 200:
            break
    except (urllib.error.URLError, ConnectionError):
        pass
    if time.time() > deadline:
        sys.exit("demo: the server did not come up; see build/demo-serve.log")
    time.sleep(0.1)

model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
print(f"cairn serve is up at {url} serving '{model}' (a tiny random model: expect noise, not answers)\n")
messages = [{"role": "system", "content": "You are a helpful assistant."}]
for question in ["Hello! Who are you?", "What can you do?", "Tell me a short story.", "Thanks, goodbye."]:
    messages.append({"role": "user", "content": question})
    body = json.dumps({"model": model, "messages": messages, "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    t0 = time.time()
    r = json.load(urllib.request.urlopen(req))
    answer = r["choices"][0]["message"]["content"]
    u = r["usage"]
    print(f"user:      {question}")
    print(f"assistant: {answer!r}")
    print(f"           prompt_tokens={u['prompt_tokens']}  cached_tokens={u['prompt_tokens_details']['cached_tokens']}"
          f"  completion_tokens={u['completion_tokens']}  ({(time.time() - t0) * 1000:.0f} ms)\n")
    messages.append({"role": "assistant", "content": answer})
EOF

cat <<EOF
Point any OpenAI client at it:
  export OPENAI_BASE_URL=$URL/v1 OPENAI_API_KEY=unused
  python:  OpenAI(base_url="$URL/v1", api_key="unused").chat.completions.create(model="$(basename $MODEL)", messages=[...])
  curl $URL/v1/chat/completions -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"hi"}]}'
Anthropic clients: base URL $URL (POST /v1/messages). Metrics: $URL/metrics. Server log: $LOG
EOF
if [ "$KEEP" = 1 ]; then
    echo "Serving until Ctrl-C."
    wait $SERVER
else
    echo "Stopping the server (scripts/demo.sh --keep leaves it running)."
fi
