/* slot_api.h — llama.cpp-server's slot endpoints: GET /slots lists the engine slots, and
 * POST /slots/{id}?action=save|restore|erase (body {"filename": NAME} for save and restore)
 * saves a slot's state to a file name under --kv-dir, loads it back into a slot, or empties it.
 *
 * INVARIANTS
 *  - The slot is taken like a generation takes it (it waits for the slot, never interrupts a
 *    reply) and released only after the engine answered, as turn.h does.
 *  - A save keeps the slot routed to its conversation; after a restore or erase the slot's text
 *    record is unknown / empty, so a conversation finds the restored state by pinning the slot
 *    (cache_slot) or by the engine's own reuse once routed there.
 *  - File names are checked here and by the engine (wire.h wire_slot_name_ok): a name never
 *    leaves DIR/slots/.
 */
#ifndef CAIRN_SLOT_API_H
#define CAIRN_SLOT_API_H

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "turn.h"

/* n_ctx from the engine's CAPS (NULL when not known yet). */
enum MHD_Result slot_list(serve_ctx *sc, struct MHD_Connection *c, const wire_caps *caps, req_info *ri);
enum MHD_Result slot_action(serve_ctx *sc, struct MHD_Connection *c, const char *id, const cJSON *body,
                            req_info *ri);

#endif
