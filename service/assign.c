/* assign.c - what an assignment carries for kiln-agent besides the spec's text: typed copies of
 * the threads per rank, the checkpoint directory, the metric definitions and the files the ranks
 * will read, so that the agent checks and uses them without parsing the spec. Building the
 * message only; delivering it is worker.c's. */
#include "service/svc_int.h"
#include "spec/spec.h"

#include <stdlib.h>
#include <string.h>

int svc_assignment_fill(arena_t *arena, const char *job_id, const char *spec_json, Kiln__Assignment *msg,
                        kiln_err_t *err)
{
    spec_t *sp = calloc(1, sizeof(*sp));
    if (!sp)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int rc = spec_parse_string(spec_json ? spec_json : "{}", sp, err);
    if (rc) {
        free(sp);
        return rc;
    }
    msg->threads_per_rank = sp->res.threads_per_rank;
    msg->checkpoint_dir = sp->ckpt_path[0] ? arena_sprintf(arena, "%s/%s", sp->ckpt_path, job_id)
                                            : svc_astr(arena, "");
    msg->metric_definitions = arena_alloc(arena, sizeof(Kiln__MetricDefinition *) *
                                                     (size_t)KILN_MAX(sp->n_metric_defs, 1));
    for (int i = 0; i < sp->n_metric_defs; i++) {
        Kiln__MetricDefinition *d = arena_alloc(arena, sizeof(*d));
        kiln__metric_definition__init(d);
        d->name = svc_astr(arena, sp->metric_defs[i].name);
        d->regex = svc_astr(arena, sp->metric_defs[i].regex);
        msg->metric_definitions[msg->n_metric_definitions++] = d;
    }
    /* every file kiln-train opens because the spec names it */
    const char *fields[3] = {"data.train", "data.val", "model.init_from"};
    const char *paths[3] = {strcmp(sp->data.format, "synthetic") ? sp->data.train : "", sp->data.val,
                            sp->model.init_from};
    msg->read_paths = arena_alloc(arena, sizeof(Kiln__JobPath *) * KILN_ARRAY_LEN(paths));
    for (size_t i = 0; i < KILN_ARRAY_LEN(paths); i++) {
        if (!paths[i][0])
            continue;
        Kiln__JobPath *p = arena_alloc(arena, sizeof(*p));
        kiln__job_path__init(p);
        p->field = svc_astr(arena, fields[i]);
        p->path = svc_astr(arena, paths[i]);
        msg->read_paths[msg->n_read_paths++] = p;
    }
    spec_deinit(sp);
    free(sp);
    return 0;
}
