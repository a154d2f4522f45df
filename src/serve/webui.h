/* webui.h — the chat page at `/`: the files under webui/ (and the markdown renderer and
 * sanitizer it vendors from npm), embedded into the binary at build time by
 * tools/embed_webui.py, so one binary still does everything and nothing is fetched at run time.
 *
 * INVARIANTS
 *  - Only GET and HEAD of a path in the table are answered here; every other URL is the API's.
 *  - The files are public: they hold no secret (the page asks for the API key and sends it with
 *    each API call), so they are served before the key check — a browser cannot attach a
 *    Bearer header to a navigation — but after the Host guard, like everything else.
 *  - Every file goes out with a Content-Security-Policy that lets scripts, styles and
 *    connections come from this origin only (no inline script, no eval, no images from
 *    elsewhere), and may not be framed: model output that slipped past the sanitizer could
 *    still neither run nor send anything out.
 */
#ifndef CAIRN_WEBUI_H
#define CAIRN_WEBUI_H

#include <microhttpd.h>
#include <stddef.h>

typedef struct {
    const char *path;             /* URL path, e.g. "/app.js"; "/index.html" is also "/" */
    const char *data;
    size_t len;
} webui_asset;

/* Generated into $(BUILD)/gen/webui_assets.c. */
extern const webui_asset webui_assets[];
extern const int webui_nassets;

/* The file served at path, or NULL. */
const webui_asset *webui_find(const char *path);
enum MHD_Result webui_send(struct MHD_Connection *c, const webui_asset *a);

#endif
