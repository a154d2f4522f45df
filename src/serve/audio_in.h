/* audio_in.h — OpenAI `input_audio` content parts: {"type": "input_audio", "input_audio":
 * {"data": BASE64, "format": "wav" | "pcm16"}} decoded into DMel frames in the gateway (core/audio.h)
 * so the engine receives the frames as the SUBMIT extension payload (protocol.md §1.3).
 *
 * INVARIANTS
 *  - A part is either fully decoded (its frames appended to the request's media, the part
 *    replaced by {"type": "input_audio", "input_audio": {"dmel_frames": N}} for the template) or
 *    the request fails with a 400 naming the field and what is wrong: bad base64, not a WAV,
 *    truncated, wrong sample rate, unsupported encoding or format, no samples. Nothing is sent.
 *  - "pcm16" is raw little-endian signed 16-bit mono at 16 kHz (the rate DMel is defined at).
 */
#ifndef CAIRN_AUDIO_IN_H
#define CAIRN_AUDIO_IN_H

#include <cjson/cJSON.h>

#include "../core/sbuf.h"
#include "http.h"

/* Decode part (messages[msg].content[idx]); returns the replacement part, or NULL + e. */
cJSON *audio_in_part(const cJSON *part, int msg, int idx, sbuf *media, http_err *e);

#endif
