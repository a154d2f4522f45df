#include "slot_api.h"

#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "params.h"

enum MHD_Result slot_list(serve_ctx *sc, struct MHD_Connection *c, const wire_caps *caps, req_info *ri) {
    slots_stats st;
    slots_get_stats(sc->sl, &st);
    cJSON *r = cJSON_CreateArray();
    for (int i = 0; i < st.n; i++) {
        size_t n = 0;
        char *rec = slots_record(sc->sl, i, &n);
        free(rec);
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "id", i);
        if (caps) cJSON_AddNumberToObject(s, "n_ctx", caps->ctx);
        else cJSON_AddNullToObject(s, "n_ctx");
        cJSON_AddNumberToObject(s, "record_bytes", (double)n);
        cJSON_AddItemToArray(r, s);
    }
    ri->status = 200;
    return http_send_json(c, 200, r);
}

/* What the slot's release needs once the engine answered. */
typedef struct {
    serve_ctx *sc;
    int slot;
    char *record;                 /* kept for a save; NULL otherwise */
    size_t len;
} slot_job;

static void on_finish(gen *g, void *user) {
    slot_job *j = user;
    slots_release(j->sc->sl, j->slot, g->status == GEN_DONE ? j->record : NULL, g->status == GEN_DONE ? j->len : 0);
    free(j->record);
    free(j);
}

static enum MHD_Result failed(struct MHD_Connection *c, req_info *ri, http_err *e) {
    ri->status = e->status;
    return http_send_error(c, API_OPENAI, e);
}

static int gone(void *conn) { return conn && http_client_gone(conn); }

enum MHD_Result slot_action(serve_ctx *sc, struct MHD_Connection *c, const char *id, const cJSON *body,
                            req_info *ri) {
    http_err e = {0};
    char *end;
    long slot = strtol(id, &end, 10);
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    static const char *const actions[] = {"save", "restore", "erase"};
    int a = -1;
    for (int i = 0; action && i < 3; i++)
        if (!strcmp(action, actions[i])) a = i;
    const char *name = NULL;
    if (!*id || *end || slot < 0 || slot >= sc->nslots) {
        http_err_set(&e, 404, "invalid_request_error", "not_found", "id_slot", "no slot %s (slots 0..%d)", id, sc->nslots - 1);
        return failed(c, ri, &e);
    }
    if (a < 0) {
        http_err_set(&e, 400, "invalid_request_error", "invalid_value", "action", "?action= must be save, restore or erase");
        return failed(c, ri, &e);
    }
    if (a != WIRE_SLOT_ERASE) {
        if (!cJSON_IsObject(body) || param_str(body, "filename", &name, &e) || !name) {
            if (!e.status) http_err_set(&e, 400, "invalid_request_error", "invalid_value", "filename", "'filename' is required");
            return failed(c, ri, &e);
        }
        if (!wire_slot_name_ok(name, strlen(name))) {
            http_err_set(&e, 400, "invalid_request_error", "invalid_value", "filename",
                         "'filename' must be 1..63 of A-Z a-z 0-9 . _ - and not start with '.'");
            return failed(c, ri, &e);
        }
    }
    int got;
    slot_request want = {.prompt = "", .pinned = (int)slot};
    int rc = slots_acquire(sc->sl, &want, sc->queue_timeout, gone, c, &got);
    if (rc != SLOTS_OK) {
        http_err_set(&e, rc == SLOTS_GONE ? 499 : 503, "server_error", "slot_unavailable", NULL,
                     "slot %ld did not become free", slot);
        return failed(c, ri, &e);
    }
    slot_job *j = xcalloc(1, sizeof *j);
    j->sc = sc;
    j->slot = got;
    if (a == WIRE_SLOT_SAVE) j->record = slots_record(sc->sl, got, &j->len);
    gen *g = gen_new(on_finish, j);
    char err[200];
    if (eng_slot(sc->engine, g, got, (wire_slot_action)a, name ? name : "erase", sc->queue_timeout, err, sizeof err)) {
        gen_unref(g);
        slots_release(sc->sl, got, j->record, j->len);
        free(j->record);
        free(j);
        http_err_set(&e, 503, "server_error", "engine_unavailable", NULL, "%s", err);
        return failed(c, ri, &e);
    }
    pthread_mutex_lock(&g->mu);
    while (!g->finished) pthread_cond_wait(&g->cv, &g->mu);
    int ok = g->status == GEN_DONE, n = g->completion_tokens;
    char why[256];
    snprintf(why, sizeof why, "%s", g->error);
    pthread_mutex_unlock(&g->mu);
    gen_unref(g);
    if (!ok) {
        http_err_set(&e, strncmp(why, "BAD_REQUEST", 11) ? 500 : 400, "invalid_request_error", "slot_action_failed",
                     "filename", "slot %ld %s: %s", slot, actions[a], why);
        return failed(c, ri, &e);
    }
    static const char *const counted[] = {"n_saved", "n_restored", "n_erased"};
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "id_slot", (double)slot);
    if (name) cJSON_AddStringToObject(r, "filename", name);
    cJSON_AddNumberToObject(r, counted[a], n);
    ri->status = 200;
    return http_send_json(c, 200, r);
}
