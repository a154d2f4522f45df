/* audio_in.c — input_audio content parts to DMel frames (audio_in.h). */
#include "audio_in.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/audio.h"
#include "../core/base64.h"

static cJSON *refuse(http_err *e, int msg, int idx, const char *field, const char *why) {
    char param[96];
    snprintf(param, sizeof param, "messages[%d].content[%d].input_audio%s", msg, idx, field);
    http_err_set(e, 400, "invalid_request_error", "invalid_value", param, "%s: %s", param, why);
    return NULL;
}

cJSON *audio_in_part(const cJSON *part, int msg, int idx, sbuf *media, http_err *e) {
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(part, "input_audio");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(in, "data"), *fmt = cJSON_GetObjectItemCaseSensitive(in, "format");
    if (!cJSON_IsObject(in)) return refuse(e, msg, idx, "", "must be an object {data, format}");
    if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "wav") && strcmp(fmt->valuestring, "pcm16")))
        return refuse(e, msg, idx, ".format", "must be \"wav\" or \"pcm16\" (16 kHz mono)");
    if (!cJSON_IsString(data) || !*data->valuestring) return refuse(e, msg, idx, ".data", "must be non-empty base64");
    char err[256];
    unsigned char *bytes = NULL;
    size_t n = 0, samples = 0;
    float *pcm = NULL;
    cJSON *out = NULL;
    if (base64_decode(data->valuestring, strlen(data->valuestring), &bytes, &n, err, sizeof err))
        return refuse(e, msg, idx, ".data", err);
    int rc = !strcmp(fmt->valuestring, "wav") ? audio_decode_wav(bytes, n, &pcm, &samples, err, sizeof err)
                                              : audio_decode_pcm16(bytes, n, &pcm, &samples, err, sizeof err);
    free(bytes);
    if (rc) return refuse(e, msg, idx, ".data", err);
    size_t frames = dmel_frames(samples);
    unsigned char *levels = malloc(frames * DMEL_MELS);
    if (!levels || dmel_compute(pcm, samples, levels, err, sizeof err)) {
        refuse(e, msg, idx, ".data", levels ? err : "out of memory");
    } else {
        sbuf_put(media, (const char *)levels, frames * DMEL_MELS);
        out = cJSON_CreateObject();
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "type", "input_audio");
        cJSON_AddNumberToObject(a, "dmel_frames", (double)frames);
        cJSON_AddItemToObject(out, "input_audio", a);
    }
    free(levels);
    free(pcm);
    return out;
}
