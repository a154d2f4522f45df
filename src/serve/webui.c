#include "webui.h"

#include <string.h>

#include "http.h"

const webui_asset *webui_find(const char *path) {
    if (!strcmp(path, "/")) path = "/index.html";
    for (int i = 0; i < webui_nassets; i++)
        if (!strcmp(webui_assets[i].path, path)) return &webui_assets[i];
    return NULL;
}

static const char *content_type(const char *path) {
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".svg", "image/svg+xml"}, {".json", "application/json"},
    };
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i][0])) return types[i][1];
    return "application/octet-stream";
}

/* data: images only for the page's own icons; 'self' connections are the API. */
#define WEBUI_CSP                                                                                      \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " \
    "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

enum MHD_Result webui_send(struct MHD_Connection *c, const webui_asset *a) {
    static const char *const headers[] = {
        "Content-Security-Policy", WEBUI_CSP,
        "X-Content-Type-Options", "nosniff",
        "X-Frame-Options", "DENY",
        "Referrer-Policy", "no-referrer",
        /* a new binary may bring a new page: revalidate rather than run a stale one */
        "Cache-Control", "no-cache",
        NULL,
    };
    return http_send_static(c, content_type(a->path), a->data, a->len, headers);
}
