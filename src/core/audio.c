/* audio.c — WAV/PCM16 decoding and the DMel feature extractor (recipe and invariants in audio.h). */
#include "audio.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- decoding --------------------------------------------------------------------------- */

static uint32_t le16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le32(const unsigned char *p) { return le16(p) | le16(p + 2) << 16; }

typedef struct {
    int format;          /* 1 PCM, 3 IEEE float */
    int channels, bits;
    uint32_t rate;
} wav_fmt;

static int read_fmt(const unsigned char *p, uint32_t size, wav_fmt *f, char *err, size_t errlen) {
    if (size < 16) return errf(err, errlen, "WAV: fmt chunk of %u bytes is too short", size);
    f->format = (int)le16(p);
    f->channels = (int)le16(p + 2);
    f->rate = le32(p + 4);
    f->bits = (int)le16(p + 14);
    if (f->format == 0xFFFE) {                    /* WAVE_FORMAT_EXTENSIBLE: the sub-format GUID says */
        if (size < 40) return errf(err, errlen, "WAV: extensible fmt chunk of %u bytes is too short", size);
        f->format = (int)le16(p + 24);
    }
    int ok = (f->format == 1 && (f->bits == 8 || f->bits == 16 || f->bits == 24 || f->bits == 32)) ||
             (f->format == 3 && f->bits == 32);
    if (!ok)
        return errf(err, errlen, "WAV: encoding %d with %d bits per sample is not supported (PCM 8/16/24/32-bit or "
                    "float32)", f->format, f->bits);
    if (f->channels < 1) return errf(err, errlen, "WAV: %d channels", f->channels);
    if (f->rate < AUDIO_RATE_MIN || f->rate > AUDIO_RATE_MAX)
        return errf(err, errlen, "WAV: sample rate %u Hz is outside %d..%d Hz", f->rate, AUDIO_RATE_MIN, AUDIO_RATE_MAX);
    return 0;
}

static float sample_at(const unsigned char *p, const wav_fmt *f) {
    switch (f->bits) {
    case 8: return ((float)p[0] - 128.0f) / 128.0f;
    case 16: return (float)(int16_t)le16(p) / 32768.0f;
    case 24: return (float)((int32_t)(le32(p) << 8) >> 8) / 8388608.0f;
    default:
        if (f->format == 3) {
            float v;
            uint32_t u = le32(p);
            memcpy(&v, &u, sizeof v);
            return v;
        }
        return (float)((double)(int32_t)le32(p) / 2147483648.0);
    }
}

static int decode_samples(const unsigned char *data, uint32_t size, const wav_fmt *f, float **pcm, size_t *n,
                          char *err, size_t errlen) {
    size_t frame = (size_t)f->channels * (size_t)(f->bits / 8);
    if (size % frame) return errf(err, errlen, "WAV: data chunk of %u bytes is not whole %zu-byte frames", size, frame);
    *n = size / frame;
    if (!*n) return errf(err, errlen, "WAV: the data chunk holds no samples");
    float *out = malloc(*n * sizeof *out);
    if (!out) return errf(err, errlen, "WAV: out of memory for %zu samples", *n);
    for (size_t i = 0; i < *n; i++) {
        double acc = 0;
        for (int c = 0; c < f->channels; c++) acc += sample_at(data + i * frame + (size_t)c * (f->bits / 8), f);
        out[i] = (float)(acc / f->channels);
        if (!isfinite(out[i])) {
            free(out);
            return errf(err, errlen, "WAV: sample %zu is not finite", i);
        }
    }
    *pcm = out;
    return 0;
}

int audio_decode_wav(const unsigned char *buf, size_t len, float **pcm, size_t *n, char *err, size_t errlen) {
    *pcm = NULL;
    *n = 0;
    if (len < 12 || memcmp(buf, "RIFF", 4) || memcmp(buf + 8, "WAVE", 4))
        return errf(err, errlen, "not a WAV file (no RIFF/WAVE header)");
    wav_fmt f = {0};
    int have_fmt = 0;
    for (size_t off = 12; off + 8 <= len;) {
        uint32_t size = le32(buf + off + 4);
        const unsigned char *body = buf + off + 8;
        if (size > len - off - 8)
            return errf(err, errlen, "WAV: chunk '%.4s' claims %u bytes but only %zu remain (truncated file)",
                        (const char *)buf + off, size, len - off - 8);
        if (!memcmp(buf + off, "fmt ", 4)) {
            if (read_fmt(body, size, &f, err, errlen)) return -1;
            have_fmt = 1;
        } else if (!memcmp(buf + off, "data", 4)) {
            if (!have_fmt) return errf(err, errlen, "WAV: data chunk before the fmt chunk");
            if (decode_samples(body, size, &f, pcm, n, err, errlen)) return -1;
            if (f.rate == DMEL_RATE) return 0;
            float *in = *pcm;
            int rc = audio_resample(in, *n, (int)f.rate, pcm, n, err, errlen);
            free(in);
            return rc;
        }
        off += 8 + (size_t)size + (size & 1);     /* chunks are word-aligned */
    }
    return errf(err, errlen, have_fmt ? "WAV: no data chunk (truncated file?)" : "WAV: no fmt chunk");
}

int audio_decode_pcm16(const unsigned char *buf, size_t len, float **pcm, size_t *n, char *err, size_t errlen) {
    wav_fmt f = {.format = 1, .channels = 1, .bits = 16, .rate = DMEL_RATE};
    *pcm = NULL;
    *n = 0;
    if (len % 2) return errf(err, errlen, "PCM16: %zu bytes is not a whole number of 16-bit samples", len);
    if (len > UINT32_MAX) return errf(err, errlen, "PCM16: %zu bytes is too long", len);
    return decode_samples(buf, (uint32_t)len, &f, pcm, n, err, errlen);
}

/* ---- resampling to 16 kHz (design in audio.h) --------------------------------------------- */

enum { RS_HALF_TAPS = 16, RS_TABLE_MAX = 1 << 22 };
#define RS_CUTOFF 0.97
#define RS_BETA 9.0

static long gcd(long a, long b) { return b ? gcd(b, a % b) : a; }

/* The modified Bessel function I0 by its power series (terms fall below 1e-17 of the sum). */
static double bessel_i0(double x) {
    double sum = 1, term = 1, q = x * x / 4;
    for (int k = 1; term > 1e-17 * sum; k++) {
        term *= q / ((double)k * k);
        sum += term;
    }
    return sum;
}

/* The 2W taps of output phase frac (in [0, 1): the output's offset past its input sample) for
 * inputs floor(t) - W + 1 .. floor(t) + W, normalised to unit sum. */
static void rs_taps(double frac, double f, int w, double *c) {
    double sum = 0;
    for (int k = 0; k < 2 * w; k++) {
        double d = frac + (double)(w - 1 - k), x = M_PI * f * d, r = d / w;
        double v = (x == 0 ? 1.0 : sin(x) / x) * bessel_i0(RS_BETA * sqrt(fmax(0.0, 1.0 - r * r)));
        c[k] = v;
        sum += v;
    }
    for (int k = 0; k < 2 * w; k++) c[k] /= sum;
}

int audio_resample(const float *in, size_t n, int rate, float **out, size_t *m, char *err, size_t errlen) {
    long g = gcd(rate, DMEL_RATE), phases = DMEL_RATE / g, step = rate / g;
    double f = RS_CUTOFF * fmin((double)DMEL_RATE / rate, 1.0);
    int w = (int)ceil(RS_HALF_TAPS / f);
    *m = (size_t)(((unsigned long long)n * DMEL_RATE + (unsigned long long)rate - 1) / (unsigned long long)rate);
    *out = malloc(*m * sizeof **out);
    /* one row of taps per phase when the table is small (every common rate), else one row reused */
    int table = phases * 2 * w <= RS_TABLE_MAX;
    double *c = malloc((size_t)(table ? phases : 1) * 2 * (size_t)w * sizeof *c);
    if (!*out || !c) {
        free(*out);
        free(c);
        *out = NULL;
        return errf(err, errlen, "resampling %d Hz: out of memory for %zu samples", rate, *m);
    }
    for (long p = 0; table && p < phases; p++) rs_taps((double)p / phases, f, w, c + p * 2 * w);
    for (size_t j = 0; j < *m; j++) {
        unsigned long long pos = (unsigned long long)j * (unsigned long long)step;
        long base = (long)(pos / (unsigned long long)phases), p = (long)(pos % (unsigned long long)phases);
        const double *row = table ? c + p * 2 * w : c;
        if (!table) rs_taps((double)p / phases, f, w, c);
        double acc = 0;
        for (int k = 0; k < 2 * w; k++) {
            long i = base - w + 1 + k;
            if (i >= 0 && (size_t)i < n) acc += row[k] * in[i];
        }
        (*out)[j] = (float)acc;
    }
    free(c);
    return 0;
}

/* ---- DMel ------------------------------------------------------------------------------- */

size_t dmel_frames(size_t n_samples) { return (n_samples + DMEL_HOP - 1) / DMEL_HOP; }

/* Slaney mel scale (linear below 1 kHz, logarithmic above), as librosa/torchaudio and the extractor. */
static double hz_to_mel(double hz) {
    const double f_sp = 200.0 / 3.0, min_log_hz = 1000.0, logstep = log(6.4) / 27.0;
    return hz >= min_log_hz ? min_log_hz / f_sp + log(hz / min_log_hz) / logstep : hz / f_sp;
}

static double mel_to_hz(double mel) {
    const double f_sp = 200.0 / 3.0, min_log_hz = 1000.0, logstep = log(6.4) / 27.0, min_log_mel = min_log_hz / f_sp;
    return mel >= min_log_mel ? min_log_hz * exp(logstep * (mel - min_log_mel)) : mel * f_sp;
}

enum { N_BINS = DMEL_WIN / 2 + 1 };

/* Triangular filters between consecutive mel edges, area-normalised (Slaney), stored as f32. */
static void mel_filters(float *w /* [DMEL_MELS][N_BINS] */) {
    double edges[DMEL_MELS + 2], top = hz_to_mel(DMEL_RATE / 2.0);
    for (int i = 0; i < DMEL_MELS + 2; i++) edges[i] = mel_to_hz(top * i / (DMEL_MELS + 1));
    for (int m = 0; m < DMEL_MELS; m++) {
        double norm = 2.0 / (edges[m + 2] - edges[m]);
        for (int k = 0; k < N_BINS; k++) {
            double f = (double)k * DMEL_RATE / DMEL_WIN;
            double lower = (f - edges[m]) / (edges[m + 1] - edges[m]), upper = (edges[m + 2] - f) / (edges[m + 2] - edges[m + 1]);
            double v = fmax(0.0, fmin(lower, upper));
            w[(size_t)m * N_BINS + k] = (float)(v * norm);
        }
    }
}

static unsigned char level_of(double logmel) {
    const double lo = -7.0, hi = 2.0, step = (hi - lo) / (DMEL_LEVELS - 1);
    double v = fmin(fmax(logmel, lo), hi);
    int best = 0;
    double best_d = INFINITY;
    for (int b = 0; b < DMEL_LEVELS; b++) {
        double d = fabs(v - (lo + step * b));
        if (d < best_d) { best_d = d; best = b; }
    }
    return (unsigned char)best;
}

/* One frame's magnitude spectrum by a direct DFT over a cos/sin table of the frame length. */
static void magnitudes(const double *x, const double *cs, const double *sn, double *mag) {
    for (int k = 0; k < N_BINS; k++) {
        double re = 0, im = 0;
        int idx = 0;
        for (int t = 0; t < DMEL_WIN; t++) {
            re += x[t] * cs[idx];
            im -= x[t] * sn[idx];
            idx += k;
            if (idx >= DMEL_WIN) idx -= DMEL_WIN;
        }
        mag[k] = sqrt(fmax(re * re + im * im, 1e-10));
    }
}

int dmel_compute(const float *pcm, size_t n, unsigned char *out, char *err, size_t errlen) {
    size_t frames = dmel_frames(n);
    float *filt = malloc((size_t)DMEL_MELS * N_BINS * sizeof *filt);
    double *tab = malloc((size_t)(3 * DMEL_WIN + N_BINS) * sizeof *tab);
    if (!filt || !tab) {
        free(filt);
        free(tab);
        return errf(err, errlen, "DMel: out of memory");
    }
    double *cs = tab, *sn = tab + DMEL_WIN, *x = tab + 2 * DMEL_WIN, *mag = tab + 3 * DMEL_WIN;
    mel_filters(filt);
    for (int t = 0; t < DMEL_WIN; t++) {
        cs[t] = cos(2.0 * M_PI * t / DMEL_WIN);
        sn[t] = sin(2.0 * M_PI * t / DMEL_WIN);
    }
    /* Frame f covers padded samples [f*hop, f*hop + win) where the padded signal is
     * (win - hop) zeros, the clip, then zeros up to a whole hop. */
    const long left = DMEL_WIN - DMEL_HOP;
    for (size_t f = 0; f < frames; f++) {
        for (int t = 0; t < DMEL_WIN; t++) {
            long src = (long)(f * DMEL_HOP) + t - left;
            double hann = 0.5 - 0.5 * cs[t];             /* periodic Hann */
            x[t] = src >= 0 && (size_t)src < n ? hann * pcm[src] : 0.0;
        }
        magnitudes(x, cs, sn, mag);
        for (int m = 0; m < DMEL_MELS; m++) {
            double e = 0;
            for (int k = 0; k < N_BINS; k++) e += (double)filt[(size_t)m * N_BINS + k] * mag[k];
            out[f * DMEL_MELS + m] = level_of(log10(fmax(e, 1e-10)));
        }
    }
    free(filt);
    free(tab);
    return 0;
}
