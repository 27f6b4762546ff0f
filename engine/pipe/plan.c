/* plan.c - the partition plan as JSON: written for people (logged, saved beside the job's output)
 * and read back as a user-supplied `partition_plan`, validated with messages that say which stage
 * and which blocks are wrong. It does not choose plans (partition.c does). */
#include "engine/pipe/pipe.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_FIELD "distribution.model_parallel.partition_plan"

void pipe_plan_init(pipe_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->version = 1;
    p->schedule = PIPE_SCHED_INTERLEAVED;
    p->microbatches = 1;
    p->head_blocks = 1;
}

void pipe_plan_deinit(pipe_plan_t *p)
{
    if (!p)
        return;
    free(p->stages);
    p->stages = NULL;
    p->n_stages = 0;
}

int pipe_plan_copy(pipe_plan_t *dst, const pipe_plan_t *src)
{
    *dst = *src;
    dst->stages = NULL;
    if (src->n_stages > 0) {
        dst->stages = malloc(sizeof(pipe_stage_t) * (size_t)src->n_stages);
        if (!dst->stages) {
            dst->n_stages = 0;
            return KILN_ENOMEM;
        }
        memcpy(dst->stages, src->stages, sizeof(pipe_stage_t) * (size_t)src->n_stages);
    }
    return 0;
}

int pipe_plan_stage_of(const pipe_plan_t *p, int block)
{
    for (int s = 0; s < p->n_stages; s++)
        if (block >= p->stages[s].first && block <= p->stages[s].last)
            return s;
    return -1;
}

/* Rounds to 3 decimals so the written plan reads well (jansson prints 17 digits otherwise). */
static double round3(double x) { return (double)(long long)(x * 1000.0 + (x >= 0 ? 0.5 : -0.5)) / 1000.0; }

json_t *pipe_plan_to_json(const pipe_plan_t *p)
{
    json_t *o = json_object(), *stages = json_array();
    if (!o || !stages)
        goto fail;
    json_object_set_new(o, "version", json_integer(p->version));
    json_object_set_new(o, "optimize", json_string(pipe_optimize_name(p->optimize)));
    json_object_set_new(o, "schedule", json_string(pipe_sched_name(p->schedule)));
    json_object_set_new(o, "microbatches", json_integer(p->microbatches));
    json_object_set_new(o, "n_blocks", json_integer(p->n_blocks));
    json_object_set_new(o, "head_blocks", json_integer(p->head_blocks > 0 ? p->head_blocks : 1));
    json_object_set_new(o, "memory_limit_mb", json_real(round3(p->memory_limit_mb)));
    json_object_set_new(o, "manual", json_boolean(p->manual));
    for (int s = 0; s < p->n_stages; s++) {
        const pipe_stage_t *st = &p->stages[s];
        json_t *so = json_pack("{s:i, s:[i, i], s:f, s:f}", "stage", s, "blocks", st->first, st->last,
                               "predicted_ms", round3(st->predicted_ms), "predicted_mem_mb",
                               round3(st->predicted_mem_mb));
        if (!so || json_array_append_new(stages, so))
            goto fail;
    }
    json_object_set_new(o, "stages", stages);
    json_object_set_new(o, "balance", json_real(round3(p->balance)));
    json_object_set_new(o, "predicted_pass_ms", json_real(round3(p->predicted_pass_ms)));
    json_object_set_new(o, "predicted_bubble", json_real(round3(p->predicted_bubble)));
    return o;
fail:
    json_decref(o);
    json_decref(stages);
    return NULL;
}

/* Top-level fields one per line, each stage on one line: easy to read and to edit by hand. */
char *pipe_plan_to_string(const pipe_plan_t *p)
{
    json_t *j = pipe_plan_to_json(p);
    char *out = NULL;
    size_t cap = 256, len = 0;
    if (!j)
        return NULL;
    const size_t flags = JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10) | JSON_ENCODE_ANY;
    out = malloc(cap);
    if (!out)
        goto fail;
    out[len++] = '{';
    const char *key;
    json_t *val;
    bool first = true;
    json_object_foreach(j, key, val) {
        char *parts[2] = {NULL, NULL};
        size_t np = 0;
        if (!strcmp(key, "stages")) {
            size_t n = json_array_size(val), tot = 8;
            char **st = calloc(n ? n : 1, sizeof(char *));
            if (!st)
                goto fail;
            for (size_t i = 0; i < n; i++) {
                st[i] = json_dumps(json_array_get(val, i), flags);
                tot += (st[i] ? strlen(st[i]) : 0) + 8;
            }
            parts[0] = malloc(tot);
            if (parts[0]) {
                size_t o = (size_t)sprintf(parts[0], "[");
                for (size_t i = 0; i < n; i++)
                    o += (size_t)sprintf(parts[0] + o, "\n    %s%s", st[i] ? st[i] : "null", i + 1 < n ? "," : "");
                sprintf(parts[0] + o, "\n  ]");
            }
            for (size_t i = 0; i < n; i++)
                free(st[i]);
            free(st);
        } else {
            parts[0] = json_dumps(val, flags);
        }
        np = parts[0] ? strlen(parts[0]) : 0;
        size_t need = len + strlen(key) + np + 16;
        if (need > cap) {
            while (cap < need)
                cap *= 2;
            char *n2 = realloc(out, cap);
            if (!n2) {
                free(parts[0]);
                goto fail;
            }
            out = n2;
        }
        len += (size_t)sprintf(out + len, "%s\n  \"%s\": %s", first ? "" : ",", key, parts[0] ? parts[0] : "null");
        free(parts[0]);
        first = false;
    }
    if (len + 4 > cap) {
        char *n2 = realloc(out, len + 4);
        if (!n2)
            goto fail;
        out = n2;
    }
    sprintf(out + len, "\n}\n");
    json_decref(j);
    return out;
fail:
    free(out);
    json_decref(j);
    return NULL;
}

static int bad(kiln_err_t *err, const char *hint, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(kiln_err_t *err, const char *hint, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kiln_err_set(err, KILN_EINVAL, PLAN_FIELD, "invalid partition plan: %s", msg);
    if (hint)
        kiln_err_hint(err, "%s", hint);
    return KILN_EINVAL;
}

#define HINT_FORM "write {\"stages\": [[0, 3], [4, 7]]}: one inclusive [first, last] block range per stage, in order"

int pipe_plan_validate(const pipe_plan_t *p, int n_blocks, int n_stages, kiln_err_t *err)
{
    char hint[480], head[96];
    int J = p->head_blocks > 0 ? p->head_blocks : 1, L = (n_blocks - 1 - J) / 2;
    if (J == 1)
        snprintf(head, sizeof(head), "%d the final norm, head and loss", n_blocks - 1);
    else
        snprintf(head, sizeof(head), "%d..%d the head in %d vocabulary slices", 2 * L + 1, n_blocks - 1, J);
    snprintf(hint, sizeof(hint), "the model has %d blocks (0..%d; for a GPT: 0 is the embedding, 2l+1 and 2l+2 "
             "are layer l's attention and MLP halves, and %s) and the job %d partitions", n_blocks, n_blocks - 1,
             head, n_stages);
    if (p->n_stages <= 0)
        return bad(err, HINT_FORM, "the plan has no stages");
    if (p->n_stages > n_stages)
        return bad(err, hint, "the plan has %d stages but the job has only %d partitions (pipeline ranks); "
                   "give exactly one stage per partition", p->n_stages, n_stages);
    if (p->n_stages < n_stages)
        return bad(err, hint, "the plan has %d stage%s but the job has %d partitions; give exactly one stage "
                   "per partition", p->n_stages, p->n_stages == 1 ? "" : "s", n_stages);
    for (int s = 0; s < p->n_stages; s++) {
        int f = p->stages[s].first, l = p->stages[s].last;
        if (l < f)
            return bad(err, hint, "stage %d is empty (blocks [%d, %d]); every stage needs at least one block",
                       s, f, l);
        if (f < 0 || l >= n_blocks)
            return bad(err, hint, "stage %d holds blocks [%d, %d], out of range: the model has blocks 0..%d",
                       s, f, l, n_blocks - 1);
    }
    for (int s = 1; s < p->n_stages; s++)
        if (p->stages[s].first < p->stages[s - 1].first)
            return bad(err, hint, "stages are out of order: stage %d starts at block %d, before stage %d (block %d); "
                       "list the stages from the first block to the last", s, p->stages[s].first, s - 1,
                       p->stages[s - 1].first);
    int next = 0; /* first block not yet covered */
    for (int s = 0; s < p->n_stages; s++) {
        int f = p->stages[s].first, l = p->stages[s].last;
        if (f < next) {
            int other = pipe_plan_stage_of(&(pipe_plan_t){.stages = p->stages, .n_stages = s}, f);
            return bad(err, hint, "stages %d and %d overlap: both hold block %d (stage %d starts before the "
                       "previous one ends)", other < 0 ? s - 1 : other, s, f, s);
        }
        if (f > next) {
            if (f - 1 == next)
                return bad(err, hint, "block %d is in no stage (stage %d starts at block %d)", next, s, f);
            return bad(err, hint, "blocks %d..%d are in no stage (stage %d starts at block %d)", next, f - 1, s, f);
        }
        next = l + 1;
    }
    if (next < n_blocks) {
        if (next == n_blocks - 1)
            return bad(err, hint, "block %d is in no stage (the last stage ends at block %d)", next, next - 1);
        return bad(err, hint, "blocks %d..%d are in no stage (the last stage ends at block %d)", next,
                   n_blocks - 1, next - 1);
    }
    return 0;
}

/* Reads one stage's [first, last] from either [a, b] or {"blocks": [a, b], ...}. */
static int read_range(const json_t *e, int s, int *first, int *last, kiln_err_t *err)
{
    const json_t *r = e;
    if (json_is_object(e)) {
        r = json_object_get(e, "blocks");
        if (!r)
            return bad(err, HINT_FORM, "stage %d has no \"blocks\" range", s);
        const json_t *idx = json_object_get(e, "stage");
        if (idx && (!json_is_integer(idx) || json_integer_value(idx) != s))
            return bad(err, HINT_FORM, "stage number %d is listed at position %d; list stages in order 0, 1, ...",
                       json_is_integer(idx) ? (int)json_integer_value(idx) : -1, s);
    }
    if (!json_is_array(r))
        return bad(err, HINT_FORM, "stage %d: blocks must be an inclusive [first, last] range", s);
    if (json_array_size(r) == 0) {
        *first = 0;
        *last = -1; /* empty: reported by validate */
        return 0;
    }
    if (json_array_size(r) != 2 || !json_is_integer(json_array_get(r, 0)) ||
        !json_is_integer(json_array_get(r, 1)))
        return bad(err, HINT_FORM, "stage %d: blocks must be an inclusive [first, last] pair of integers", s);
    json_int_t a = json_integer_value(json_array_get(r, 0)), b = json_integer_value(json_array_get(r, 1));
    if (a < -1000000 || a > 1000000 || b < -1000000 || b > 1000000)
        return bad(err, HINT_FORM, "stage %d: block numbers out of range", s);
    *first = (int)a;
    *last = (int)b;
    return 0;
}

int pipe_plan_json_head_blocks(const json_t *j)
{
    const json_t *v = json_is_object(j) ? json_object_get(j, "head_blocks") : NULL;
    if (!v)
        return 1;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > PIPE_MAX_HEAD_BLOCKS)
        return 0;
    return (int)json_integer_value(v);
}

int pipe_plan_from_json(const json_t *j, int n_blocks, int n_stages, pipe_plan_t *out, kiln_err_t *err)
{
    int rc;
    pipe_plan_init(out);
    const json_t *stages = j;
    if (json_is_object(j)) {
        stages = json_object_get(j, "stages");
        const json_t *v;
        if ((v = json_object_get(j, "version")) && (!json_is_integer(v) || json_integer_value(v) != 1))
            return bad(err, "write \"version\": 1 or leave it out", "unsupported plan version");
        if ((v = json_object_get(j, "optimize")) &&
            (!json_is_string(v) || pipe_optimize_parse(json_string_value(v), &out->optimize)))
            return bad(err, "use \"speed\" or \"memory\"", "\"optimize\" must be \"speed\" or \"memory\"");
        if ((v = json_object_get(j, "schedule")) &&
            (!json_is_string(v) || pipe_sched_parse(json_string_value(v), &out->schedule)))
            return bad(err, "use \"simple\" or \"interleaved\"", "\"schedule\" must be \"simple\" or \"interleaved\"");
        if ((v = json_object_get(j, "microbatches"))) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 16))
                return bad(err, NULL, "\"microbatches\" must be a positive integer");
            out->microbatches = (int)json_integer_value(v);
        }
        out->head_blocks = pipe_plan_json_head_blocks(j);
        if (out->head_blocks < 1)
            return bad(err, "leave \"head_blocks\" out (1), or give the number in the plan kiln wrote",
                       "\"head_blocks\" must be an integer from 1 to %d", PIPE_MAX_HEAD_BLOCKS);
        if ((v = json_object_get(j, "n_blocks")) && json_is_integer(v) && json_integer_value(v) != n_blocks)
            return bad(err, "make a new plan for this model, or start from the one kiln writes to partition_plan.json",
                       "the plan was made for a model of %d blocks, this model has %d", (int)json_integer_value(v),
                       n_blocks);
        if ((v = json_object_get(j, "balance")) && json_is_number(v))
            out->balance = json_number_value(v);
        if ((v = json_object_get(j, "memory_limit_mb")) && json_is_number(v))
            out->memory_limit_mb = json_number_value(v);
        if ((v = json_object_get(j, "predicted_pass_ms")) && json_is_number(v))
            out->predicted_pass_ms = json_number_value(v);
        if ((v = json_object_get(j, "predicted_bubble")) && json_is_number(v))
            out->predicted_bubble = json_number_value(v);
    } else if (!json_is_array(j)) {
        return bad(err, HINT_FORM, "the plan must be an object with \"stages\"");
    }
    if (!stages)
        return bad(err, HINT_FORM, "the plan has no \"stages\"");
    if (!json_is_array(stages))
        return bad(err, HINT_FORM, "\"stages\" must be a list of block ranges");
    size_t ns = json_array_size(stages);
    if (ns > 1000000)
        return bad(err, HINT_FORM, "too many stages");
    out->n_stages = (int)ns;
    out->n_blocks = n_blocks;
    out->manual = true;
    if (ns) {
        out->stages = calloc(ns, sizeof(pipe_stage_t));
        if (!out->stages) {
            out->n_stages = 0;
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
    }
    for (size_t s = 0; s < ns; s++) {
        const json_t *e = json_array_get(stages, s);
        if ((rc = read_range(e, (int)s, &out->stages[s].first, &out->stages[s].last, err)))
            goto fail;
        if (json_is_object(e)) {
            const json_t *v;
            if ((v = json_object_get(e, "predicted_ms")) && json_is_number(v))
                out->stages[s].predicted_ms = json_number_value(v);
            if ((v = json_object_get(e, "predicted_mem_mb")) && json_is_number(v))
                out->stages[s].predicted_mem_mb = json_number_value(v);
        }
    }
    if ((rc = pipe_plan_validate(out, n_blocks, n_stages, err)))
        goto fail;
    return 0;
fail:
    pipe_plan_deinit(out);
    return rc;
}
