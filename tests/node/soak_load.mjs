// load.mjs — the mixed load of `make soak`: autocannon over N connections for D seconds, cycling
// each connection through OpenAI non-streaming, OpenAI streaming, Anthropic non-streaming and
// Anthropic streaming requests. Prints one JSON object: autocannon's result plus, from every
// response, the status counts and how many 429s came without a Retry-After header.
//
// usage: node tests/node/soak_load.mjs URL CONNECTIONS SECONDS
import autocannon from "autocannon";

const [url, connections, seconds] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const seen = { status: {}, missingRetryAfter: 0 };
function onResponse(status, body, context, headers) {
  seen.status[status] = (seen.status[status] || 0) + 1;
  if (status === 429) {
    const h = headers || {};
    if (!Object.keys(h).some((k) => k.toLowerCase() === "retry-after")) seen.missingRetryAfter++;
  }
}
const chat = (stream, i) => JSON.stringify({
  messages: [{ role: "user", content: `soak ${stream ? "stream" : "plain"} ${i % 7}` }],
  max_tokens: 8, temperature: 0, stream,
});
const messages = (stream, i) => JSON.stringify({
  messages: [{ role: "user", content: `soak anthropic ${i % 5}` }], max_tokens: 8, stream,
});
const json = { "content-type": "application/json" };
const requests = [];
for (let i = 0; i < 4; i++) {
  requests.push({ method: "POST", path: "/v1/chat/completions", headers: json, body: chat(false, i), onResponse });
  requests.push({ method: "POST", path: "/v1/chat/completions", headers: json, body: chat(true, i), onResponse });
  requests.push({ method: "POST", path: "/v1/messages", headers: { ...json, "anthropic-version": "2023-06-01" },
    body: messages(false, i), onResponse });
  requests.push({ method: "POST", path: "/v1/messages", headers: { ...json, "anthropic-version": "2023-06-01" },
    body: messages(true, i), onResponse });
}
const result = await autocannon({ url, connections, duration: seconds, requests, timeout: 120 });
console.log(JSON.stringify({ errors: result.errors, timeouts: result.timeouts, non2xx: result.non2xx,
  requests: result.requests.total, statusCodeStats: result.statusCodeStats, seen }));
