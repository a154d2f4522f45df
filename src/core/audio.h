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
 * little-endian 16-bit mono PCM. The rate must be 16000 Hz: there is no resampler, so any other
 * rate is refused by name rather than guessed. Every failure names what is wrong (not RIFF,
 * truncated chunk, unsupported encoding, rate, no samples).
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
};

/* Decode a WAV file image into mono f32 samples in [-1, 1] (*pcm malloc'd, caller frees). */
int audio_decode_wav(const unsigned char *buf, size_t len, float **pcm, size_t *n, char *err, size_t errlen);
/* Raw little-endian signed 16-bit mono samples at 16 kHz. */
int audio_decode_pcm16(const unsigned char *buf, size_t len, float **pcm, size_t *n, char *err, size_t errlen);

size_t dmel_frames(size_t n_samples);                 /* ceil(n / DMEL_HOP) */
/* out[dmel_frames(n)][DMEL_MELS] levels. Returns -1 (err) only if memory for the spectrum runs out. */
int dmel_compute(const float *pcm, size_t n, unsigned char *out, char *err, size_t errlen);

#endif
