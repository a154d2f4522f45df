/* tool_dmel.c — prints the DMel levels src/core/audio.c computes for a WAV file (or raw PCM16 with
 * --pcm16): one line of 80 hex digits per frame; with --samples, the decoded 16 kHz samples (after
 * resampling) one per line instead. tests/test_audio_dmel.py compares them with the numpy reference
 * tools/ref/dmel.py. Errors go to stderr with exit status 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/audio.h"
#include "core/util.h"

int main(int argc, char **argv) {
    char err[256];
    size_t len, n;
    float *pcm;
    int raw = argc > 2 && !strcmp(argv[1], "--pcm16"), samples = argc > 2 && !strcmp(argv[1], "--samples");
    if (argc < 2) return fprintf(stderr, "usage: tool_dmel [--pcm16 | --samples] FILE\n"), 2;
    unsigned char *buf = (unsigned char *)read_file(argv[argc - 1], &len, err, sizeof err);
    if (!buf || (raw ? audio_decode_pcm16(buf, len, &pcm, &n, err, sizeof err)
                     : audio_decode_wav(buf, len, &pcm, &n, err, sizeof err)))
        return fprintf(stderr, "%s\n", err), 1;
    for (size_t i = 0; samples && i < n; i++) printf("%.9g\n", pcm[i]);
    if (samples) n = 0;
    unsigned char *out = malloc(dmel_frames(n) * DMEL_MELS);
    if (dmel_compute(pcm, n, out, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    for (size_t f = 0; f < dmel_frames(n); f++) {
        for (int m = 0; m < DMEL_MELS; m++) printf("%x", out[f * DMEL_MELS + m]);
        printf("\n");
    }
    free(out);
    free(pcm);
    free(buf);
    return 0;
}
