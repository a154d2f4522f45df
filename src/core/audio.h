/* audio.h — audio bytes to DMel frames: WAV / raw PCM16 decoding and Inkling's feature extractor.
 *
 * DMel (Hugging Face transformers models/inkling feature_extraction_inkling.py,
 * InklingFeatureExtractor defaults, which the released preprocessor uses):
 *   16 kHz mono; hop 800 samples (50 ms per audio token), periodic Hann window of 1600, n_fft 1600;
 *   the waveform is left-padded by n_fft - hop zeros and right-padded to a whole number of hops,
 *   then framed without centering, so a clip of n samples gives ceil(n / 800) frames;
 *   magnitude = sqrt(max(re^2 + im^2, 1e-10)) of the one-sided spectrum (801 bins);
 *   80 Slaney-normalised Slaney-scale mel filters over 0..8000 Hz (weights rounded to f32, as
 *   the extractor stores them); log10(max(mel, 1e-10)) clamped to [-7, 2];
 *   level = index of the nearest of 16 evenly spaced centres linspace(-7, 2, 16) (ties: lower).
 * A frame is DMEL_MELS bytes, one level per mel bin, in [0, DMEL_LEVELS).
 *
 * Arithmetic is f64 throughout (the extractor's STFT runs in f32): levels differ from it only
 * where a log-mel value falls within ~1e-6 of a boundary between two centres.
 *
 * Decoding accepts RIFF/WAVE PCM (8/16/24/32-bit integer), IEEE float32 and WAVE_FORMAT_EXTENSIBLE
 * with either, any channel count (averaged to mono, as the extractor's force_mono does); and raw
 * little-endian 16-bit mono PCM (16 kHz: it carries no rate). Every failure names what is wrong
 * (not RIFF, truncated chunk, unsupported encoding, rate, no samples).
 *
 * RESAMPLING. The extractor takes 16 kHz only; the processor's loader (transformers audio_utils
 * load_audio) resamples upstream, through torchcodec — FFmpeg's libswresample — or, without it,
 * librosa (soxr). A WAV at another rate (AUDIO_RATE_MIN..AUDIO_RATE_MAX) is resampled here with
 * libswresample's default design: band-limited interpolation by a Kaiser-windowed sinc (beta 9),
 * cutoff 0.97 of the lower Nyquist frequency, 2 x ceil(16 / f) taps where f = 0.97 x
 * min(16000 / rate, 1), each output's taps normalised to unit sum, zeros beyond the clip. Output j
 * sits exactly at input time j x rate / 16000 (rational phase, no interpolation between phases);
 * there are ceil(n x 16000 / rate) outputs. The design is libswresample's, the numbers are not
 * claimed bit-equal to FFmpeg's (its phase table and start-up delay handling differ) nor to soxr:
 * tools/ref/dmel.py implements this definition independently and the tests compare against it.
 */
#ifndef CAIRN_AUDIO_H
#define CAIRN_AUDIO_H

#include <stddef.h>
#include <stdint.h>

enum {
    DMEL_RATE = 16000,
    DMEL_HOP = 800,
    DMEL_WIN = 1600,
    DMEL_MELS = 80,
    DMEL_LEVELS = 16,
    AUDIO_RATE_MIN = 4000,
    AUDIO_RATE_MAX = 384000,
};

/* Decode a WAV file image into mono f32 samples at 16 kHz (*pcm malloc'd, caller frees). */
int audio_decode_wav(const unsigned char *buf, size_t len, float **pcm, size_t *n, char *err, size_t errlen);
/* in[n] at `rate` Hz (AUDIO_RATE_MIN..AUDIO_RATE_MAX) -> *out[*m] at 16 kHz (malloc'd), as above. */
int audio_resample(const float *in, size_t n, int rate, float **out, size_t *m, char *err, size_t errlen);
/* Raw little-endian signed 16-bit mono samples at 16 kHz. */
int audio_decode_pcm16(const unsigned char *buf, size_t len, float **pcm, size_t *n, char *err, size_t errlen);

size_t dmel_frames(size_t n_samples);                 /* ceil(n / DMEL_HOP) */
/* out[dmel_frames(n)][DMEL_MELS] levels. Returns -1 (err) only if memory for the spectrum runs out. */
int dmel_compute(const float *pcm, size_t n, unsigned char *out, char *err, size_t errlen);

#endif
