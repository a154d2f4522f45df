#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/config.h"
#include "../core/util.h"

/* Families register here: one ops table per family file. */
extern const family_ops deepseek_v4_ops;
extern const family_ops glm_ops;
extern const family_ops inkling_ops;

const family_ops *family_find(const char *model_type) {
    const family_ops *all[] = {&deepseek_v4_ops, &glm_ops, &inkling_ops};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (strcmp(all[i]->model_type, model_type) == 0) return all[i];
    return NULL;
}

static void read_eos_ids(model *m) {
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(m->config, "eos_token_id");
    if (cJSON_IsNumber(eos)) m->eos_ids[m->n_eos++] = eos->valueint;
    else if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) if (cJSON_IsNumber(e) && m->n_eos < 8) m->eos_ids[m->n_eos++] = e->valueint;
    }
}

model *model_open(const char *dir, numerics num, int progress, char *err, size_t errlen) {
    model *m = xcalloc(1, sizeof *m);
    m->dir = xstrdup(dir);
    m->num = num;
    m->bos_id = -1;
    m->media_token = -1;
    if (!(m->config = config_load(dir, err, errlen))) goto fail;
    const char *type;
    if (config_string(m->config, "model_type", &type, err, errlen)) goto fail;
    if (!(m->ops = family_find(type))) { errf(err, errlen, "config.json: unsupported model_type '%s'", type); goto fail; }
    if (!(m->st = st_open(dir, progress, err, errlen))) goto fail;
    m->fingerprint = st_fingerprint(m->st);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        /* Weights are usable without text: a tokenizer.json of a kind cairn does not read (or a
         * broken one) leaves the model serving token-id prompts, and says why. */
        char tok_err[256];
        if (!(m->tok = tok_load(path, tok_err, sizeof tok_err)))
            fprintf(stderr, "cairn: %s: tokenizer not usable, token-id prompts only: %s\n", path, tok_err);
    }
    int bos;
    if (config_int_or(m->config, "bos_token_id", -1, &bos, err, errlen)) goto fail;
    m->bos_id = bos;
    read_eos_ids(m);
    if (config_int_or(m->config, "max_position_embeddings", 4096, &m->max_ctx, err, errlen)) goto fail;
    if (m->ops->load(m, err, errlen)) goto fail;
    return m;
fail:
    model_close(m);
    return NULL;
}

void model_close(model *m) {
    if (!m) return;
    if (m->ops && m->priv) m->ops->free(m);
    if (m->tok) tok_free(m->tok);
    if (m->st) st_close(m->st);
    cJSON_Delete(m->config);
    free(m->dir);
    free(m);
}

int model_is_eos(const model *m, int id) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] == id) return 1;
    return 0;
}

seq *seq_new(model *m, int ctx, char *err, size_t errlen) {
    seq *s = xcalloc(1, sizeof *s);
    s->m = m;
    s->chunk = 64;
    state_init(&s->st, ctx);     /* a record allocation failure only disables reuse */
    if (!(s->fam = m->ops->seq_new(m, &s->st, ctx, err, errlen))) {
        state_deinit(&s->st);
        free(s);
        return NULL;
    }
    return s;
}

int seq_set_media(seq *s, const unsigned char *bytes, size_t len, char *err, size_t errlen) {
    s->media = 0;
    if (!s->m->ops->set_media) return bytes ? errf(err, errlen, "this model takes no media input") : 0;
    int n = s->m->ops->set_media(s->m, s->fam, bytes, len, err, errlen);
    s->media = bytes && n > 0;
    return n;
}

static int holds_media_token(const seq *s, const int *ids, int n) {
    for (int i = 0; s->media && i < n; i++)
        if (ids[i] == s->m->media_token) return 1;
    return 0;
}

void seq_free(seq *s) {
    if (!s) return;
    s->m->ops->seq_free(s->m, s->fam);
    state_deinit(&s->st);
    free(s);
}

static int feed(seq *s, const int *ids, int n, float *logits, float *all_logits, char *err, size_t errlen) {
    if (s->st.len + n > s->st.cap) return errf(err, errlen, "context full: %d + %d > %d", s->st.len, n, s->st.cap);
    for (int done = 0; done < n;) {
        int k = MIN(s->chunk, n - done);
        int pos0 = s->st.len;
        float *out = done + k == n ? logits : NULL;
        float *all = all_logits ? all_logits + (size_t)done * s->m->vocab_size : NULL;
        if (s->m->ops->forward(s->m, s->fam, ids + done, pos0, k, out, all, err, errlen)) {
            state_taint(&s->st);
            return -1;
        }
        state_record(&s->st, ids + done, pos0, k);
        /* the ids do not describe what the placeholders carried: never reuse this state */
        if (holds_media_token(s, ids + done, k)) state_taint(&s->st);
        done += k;
    }
    return 0;
}

int seq_feed(seq *s, const int *ids, int n, float *logits, char *err, size_t errlen) {
    return feed(s, ids, n, logits, NULL, err, errlen);
}

int seq_feed_all(seq *s, const int *ids, int n, float *all_logits, char *err, size_t errlen) {
    return feed(s, ids, n, NULL, all_logits, err, errlen);
}
