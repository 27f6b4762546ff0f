/* search_cursor.c - the cursor of a search's page: {"p": 1|2, "k": [one value per sort key],
 * "id": uuid}, which search.c makes from the last row of a page and which comes back from a
 * client inside a page token; here it is checked against the order before any SQL sees it, as
 * the tuning job list's cursor (tune.c's) is checked. Pure: no database. */
#include "store/store_int.h"

#include <math.h>
#include <string.h>

const query_order_t *store_search_order(const query_order_t *o, query_order_t *dflt)
{
    if (o && o->n > 0)
        return o;
    memset(dflt, 0, sizeof *dflt);
    dflt->n = 1;
    dflt->keys[0].field.id = QF_CREATED;
    dflt->keys[0].field.type = QT_TIME;
    dflt->keys[0].desc = true;
    return dflt;
}

bool store_search_cursor_ok(const query_order_t *o, const json_t *cur)
{
    query_order_t dflt;
    o = store_search_order(o, &dflt);
    const json_t *k = json_object_get(cur, "k");
    const char *id = json_string_value(json_object_get(cur, "id"));
    json_int_t phase = json_integer_value(json_object_get(cur, "p"));
    if (!json_is_object(cur) || !json_is_array(k) || json_array_size(k) != (size_t)o->n || !id ||
        !store_is_uuid(id) || (phase != 1 && phase != 2))
        return false;
    if (phase == 2 && !o->keys[0].field.nullable)
        return false;
    for (int i = 0; i < o->n; i++) {
        const json_t *v = json_array_get(k, (size_t)i);
        const query_field_t *f = &o->keys[i].field;
        if (json_is_null(v)) {
            if (!f->nullable || (i == 0 && phase == 1))
                return false;
            continue;
        }
        if (i == 0 && phase == 2)
            return false;
        bool ok = f->type == QT_TIME   ? json_is_integer(v)
                  : f->type == QT_TEXT ? json_is_string(v) && (f->id != QF_ID || store_is_uuid(json_string_value(v)))
                                       : json_is_number(v) && isfinite(json_number_value(v));
        if (!ok)
            return false;
    }
    return true;
}

bool store_tuning_cursor_ok(const json_t *cur)
{
    const json_t *t = json_object_get(cur, "t");
    const char *id = json_string_value(json_object_get(cur, "id"));
    /* within +-2^53 us of the epoch (the years 1685 to 2255): the query's microseconds times an
     * interval stay exact, and every time kilnd stamps is one */
    const json_int_t bound = (json_int_t)1 << 53;
    return json_is_object(cur) && json_object_size(cur) == 2 && json_is_integer(t) &&
           json_integer_value(t) >= -bound && json_integer_value(t) <= bound && id && store_is_uuid(id);
}
