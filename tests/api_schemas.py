"""The response objects of the OpenAI OpenAPI spec (openai/openai-openapi 2.3.0) and of the
Anthropic Messages API (@anthropic-ai/sdk types) that cairn serve answers with, written down as
their required fields and types, and a validator for them.

Each schema is {"field": type, ...}: a type is a Python type, a tuple of allowed types (None for
JSON null), a nested schema dict, [item type] for a list, or a str for a fixed string value. A
key ending in "?" is optional; every other key is required, as the spec's `required` lists say.
Fields that are not listed are allowed (the specs allow extensions such as reasoning_content)."""

NUM = (int, float)

# ---- OpenAI ------------------------------------------------------------------------------------
TOP_LOGPROB = {"token": str, "logprob": NUM, "bytes": ([int], None)}
TOKEN_LOGPROB = {"token": str, "logprob": NUM, "bytes": ([int], None), "top_logprobs": [TOP_LOGPROB]}
CHAT_LOGPROBS = {"content": ([TOKEN_LOGPROB], None), "refusal": ([TOKEN_LOGPROB], None)}
TOOL_CALL = {"id": str, "type": "function", "function": {"name": str, "arguments": str}}
USAGE = {"prompt_tokens": int, "completion_tokens": int, "total_tokens": int,
         "prompt_tokens_details?": {"cached_tokens?": int}}
CHAT_MESSAGE = {"role": "assistant", "content": (str, None), "refusal": (str, None), "tool_calls?": [TOOL_CALL]}
CHAT_COMPLETION = {
    "id": str, "object": "chat.completion", "created": int, "model": str,
    "choices": [{"index": int, "message": CHAT_MESSAGE, "logprobs": (CHAT_LOGPROBS, None),
                 "finish_reason": str}],
    "usage?": USAGE,
}
STREAM_TOOL_CALL = {"index": int, "id?": str, "type?": "function", "function?": {"name?": str, "arguments?": str}}
CHAT_CHUNK = {
    "id": str, "object": "chat.completion.chunk", "created": int, "model": str,
    "choices": [{"index": int, "delta": {"role?": "assistant", "content?": (str, None), "refusal?": (str, None),
                                         "tool_calls?": [STREAM_TOOL_CALL]},
                 "logprobs?": (CHAT_LOGPROBS, None), "finish_reason": (str, None)}],
    "usage?": (USAGE, None),
}
COMPLETION_LOGPROBS = {"text_offset?": [int], "token_logprobs?": [NUM], "tokens?": [str], "top_logprobs?": [dict]}
COMPLETION = {
    "id": str, "object": "text_completion", "created": int, "model": str,
    "choices": [{"index": int, "text": str, "logprobs": (COMPLETION_LOGPROBS, None), "finish_reason": str}],
    "usage?": USAGE,
}
# The spec has one schema for both; a streamed chunk's finish_reason is null until the last one.
COMPLETION_CHUNK = {**COMPLETION, "choices": [{**COMPLETION["choices"][0], "finish_reason": (str, None)}]}
MODEL = {"id": str, "object": "model", "created": int, "owned_by": str}
MODEL_LIST = {"object": "list", "data": [MODEL]}
OPENAI_ERROR = {"error": {"message": str, "type": str, "param": (str, None), "code": (str, None)}}

# ---- Anthropic ---------------------------------------------------------------------------------
A_USAGE = {"input_tokens": int, "output_tokens": int, "cache_creation_input_tokens": (int, None),
           "cache_read_input_tokens": (int, None)}
A_TEXT = {"type": "text", "text": str}
A_THINKING = {"type": "thinking", "thinking": str, "signature": str}
A_TOOL_USE = {"type": "tool_use", "id": str, "name": str, "input": dict}
A_MESSAGE = {"id": str, "type": "message", "role": "assistant", "model": str, "content": [dict],
             "stop_reason": (str, None), "stop_sequence": (str, None), "usage": A_USAGE}
A_BLOCKS = {"text": A_TEXT, "thinking": A_THINKING, "tool_use": A_TOOL_USE}
A_DELTA_USAGE = {"output_tokens": int, "input_tokens?": (int, None), "cache_read_input_tokens?": (int, None),
                 "cache_creation_input_tokens?": (int, None)}
A_EVENTS = {
    "message_start": {"type": "message_start", "message": A_MESSAGE},
    "content_block_start": {"type": "content_block_start", "index": int, "content_block": dict},
    "content_block_delta": {"type": "content_block_delta", "index": int, "delta": {"type": str}},
    "content_block_stop": {"type": "content_block_stop", "index": int},
    "message_delta": {"type": "message_delta", "delta": {"stop_reason": (str, None), "stop_sequence": (str, None)},
                      "usage": A_DELTA_USAGE},
    "message_stop": {"type": "message_stop"},
    "ping": {"type": "ping"},
}
A_COUNT = {"input_tokens": int}
A_MODEL = {"type": "model", "id": str, "display_name": str, "created_at": str}
A_MODEL_LIST = {"data": [A_MODEL], "has_more": bool, "first_id": (str, None), "last_id": (str, None)}
A_ERROR = {"type": "error", "error": {"type": str, "message": str}, "request_id?": str}


def _is(v, t):
    if t is None:
        return v is None
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if t is float:
        return isinstance(v, float)
    return isinstance(v, t)


def check(value, schema, path="$"):
    """A list of what in value breaks schema (empty = valid)."""
    if isinstance(schema, tuple):
        errs = [check(value, alt, path) for alt in schema]
        return [] if any(not e for e in errs) else [f"{path}: {value!r:.80} is none of the allowed types"]
    if schema is None:
        return [] if value is None else [f"{path}: want null, got {value!r:.80}"]
    if isinstance(schema, str):
        return [] if value == schema else [f"{path}: want {schema!r}, got {value!r:.80}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: want a list, got {value!r:.80}"]
        return [e for i, v in enumerate(value) for e in check(v, schema[0], f"{path}[{i}]")]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: want an object, got {value!r:.80}"]
        errs = []
        for key, sub in schema.items():
            optional = key.endswith("?")
            name = key.rstrip("?")
            if name not in value:
                if not optional:
                    errs.append(f"{path}.{name}: required field missing")
                continue
            errs += check(value[name], sub, f"{path}.{name}")
        return errs
    return [] if _is(value, schema) else [f"{path}: want {schema.__name__}, got {value!r:.80}"]
