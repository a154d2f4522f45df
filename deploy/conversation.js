// conversation.js — the conversation key nginx hashes to pick a cairn replica (deploy/nginx.conf).
//
// nginx reads no JSON itself, so this njs function (Debian libnginx-mod-http-js) does, from the
// request body nginx has already buffered in memory. The first of these that is present wins:
//   1. the X-Conversation-Id header (any API; the only key a raw /v1/completions prompt can carry),
//   2. the OpenAI `user` field,
//   3. the Anthropic `metadata.user_id` field,
//   4. the opening of the conversation: the Anthropic `system` field and the messages up to and
//      including the first user message (cut to OPENING_MAX characters). Every later turn of a
//      chat resends that opening unchanged, so it names the conversation when the client names
//      nothing — and two chats that open the same way share a prefix the replica can reuse.
// Nothing present (a body that is not JSON, a keyless completions prompt): the empty key, for
// which nginx's hash balancer falls back to round-robin.
// The value is only hashed, never parsed or logged beyond nginx's access log; a key is a string,
// so a number or object in those fields counts as absent.

var OPENING_MAX = 4096;

function nonEmptyString(v) {
    return typeof v === 'string' && v.length > 0;
}

function opening(body) {
    if (!Array.isArray(body.messages)) return '';
    var first = [];
    for (var i = 0; i < body.messages.length; i++) {
        var m = body.messages[i];
        first.push(m);
        if (m && m.role === 'user') break;
    }
    return JSON.stringify([body.system === undefined ? null : body.system, first]).slice(0, OPENING_MAX);
}

// {source, key} for the request: source is what the key came from (logged by nginx.conf),
// header | user | metadata.user_id | opening | none.
function derive(r) {
    var header = r.headersIn['X-Conversation-Id'];
    if (nonEmptyString(header)) return {source: 'header', key: header};
    var body;
    try {
        // requestText is there because nginx reads the whole body before it picks an upstream
        // (proxy_request_buffering on) and keeps it in one memory buffer (nginx.conf).
        body = JSON.parse(r.requestText);
    } catch (e) {
        return {source: 'none', key: ''};
    }
    if (body === null || typeof body !== 'object') return {source: 'none', key: ''};
    if (nonEmptyString(body.user)) return {source: 'user', key: body.user};
    if (body.metadata && nonEmptyString(body.metadata.user_id))
        return {source: 'metadata.user_id', key: body.metadata.user_id};
    var open = opening(body);
    return {source: open ? 'opening' : 'none', key: open};
}

// njs gives every request its own copy of this module's globals, so the body is parsed once
// per request however often nginx reads the variables (hash, retries, log).
var derived = null;

function once(r) {
    if (derived === null) derived = derive(r);
    return derived;
}

function key(r) {
    return once(r).key;
}

function keySource(r) {
    return once(r).source;
}

export default {key, keySource};
