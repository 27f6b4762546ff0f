/* ingest.c - the high-volume side of the store: log lines and metric points written with one COPY
 * per batch (never a statement or a transaction per row), and the reads that serve history:
 * logs by job and seq (optionally by rank or time), metric series by job, name and step,
 * downsampled in the database. */
#include "store/store_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends s for COPY text format, replacing invalid UTF-8 (which would make PostgreSQL reject the
 * whole batch) with U+FFFD. */
static void buf_copy_utf8(store_buf_t *b, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    store_buf_reserve(b, 3 * n);
    char *d = b->p + b->len;
    size_t i = 0;
    while (i < n) {
        unsigned char ch = u[i];
        if (ch < 0x80) {
            switch (ch) {
            case '\\': *d++ = '\\'; *d++ = '\\'; break;
            case '\t': *d++ = '\\'; *d++ = 't'; break;
            case '\n': *d++ = '\\'; *d++ = 'n'; break;
            case '\r': *d++ = '\\'; *d++ = 'r'; break;
            default: *d++ = (char)ch; break;
            }
            i++;
            continue;
        }
        size_t len = kiln_utf8_seq(u + i, n - i);
        bool ok = len > 0;
        if (ok) {
            memcpy(d, u + i, len);
            d += len;
            i += len;
        } else {
            memcpy(d, "\xef\xbf\xbd", 3);
            d += 3;
            i++;
        }
    }
    b->len = (size_t)(d - b->p);
}

int store_ingest_claim(store_conn_t *c, const char *job_id, uint64_t stream_id, const char *kind,
                       uint64_t batch_seq, bool *fresh, kiln_err_t *err)
{
    *fresh = true;
    if (stream_id == 0 || batch_seq == 0)
        return 0;
    char sid[24], seq[24];
    /* bigint columns: the agent's unsigned numbers are stored as their two's-complement image */
    snprintf(sid, sizeof(sid), "%lld", (long long)(int64_t)stream_id);
    snprintf(seq, sizeof(seq), "%lld", (long long)(batch_seq > INT64_MAX ? INT64_MAX : batch_seq));
    const char *p[4] = {job_id, sid, kind, seq};
    PGresult *r = NULL;
    int rc = store_qp(c, "record an ingested batch",
                      "INSERT INTO ingest_batches (job_id, stream_id, kind, last_seq)"
                      " VALUES ($1::uuid, $2::bigint, $3, $4::bigint)"
                      " ON CONFLICT (job_id, stream_id, kind) DO UPDATE SET last_seq = EXCLUDED.last_seq,"
                      "  updated_at = now() WHERE ingest_batches.last_seq < EXCLUDED.last_seq RETURNING 1",
                      4, p, &r, err);
    if (rc)
        return rc;
    *fresh = PQntuples(r) == 1;
    PQclear(r);
    return 0;
}

int store_log_seq_take(store_conn_t *c, const char *job_id, int64_t n, int64_t *first, kiln_err_t *err)
{
    char nb[24];
    snprintf(nb, sizeof(nb), "%lld", (long long)n);
    const char *p[2] = {job_id, nb};
    PGresult *r = NULL;
    int rc = store_qp(c, "number log lines",
                      "INSERT INTO log_seqs (job_id, last_seq) VALUES ($1::uuid, $2::bigint)"
                      " ON CONFLICT (job_id) DO UPDATE SET last_seq = log_seqs.last_seq + EXCLUDED.last_seq"
                      " RETURNING last_seq", 2, p, &r, err);
    if (rc)
        return rc;
    *first = store_get_i64(r, 0, 0) - n + 1;
    PQclear(r);
    return 0;
}

int store_ingest_prune(store_conn_t *c, int older_than_s, int *n, kiln_err_t *err)
{
    char age[24];
    snprintf(age, sizeof(age), "%d", older_than_s);
    const char *p[1] = {age};
    PGresult *r = NULL;
    *n = 0;
    int rc = store_q(c, "forget old ingested batch numbers",
                     "DELETE FROM ingest_batches WHERE updated_at < now() - $1::int * interval '1 second'", 1, p, &r,
                     err);
    if (rc)
        return rc;
    *n = atoi(PQcmdTuples(r));
    PQclear(r);
    return 0;
}

int store_logs_copy(store_conn_t *c, const char *job_id, int attempt, Kiln__LogLine *const *lines,
                    size_t n, int64_t first_seq, int64_t now_us, kiln_err_t *err)
{
    if (n == 0)
        return 0;
    store_buf_t b = {0};
    size_t idlen = strlen(job_id);
    store_buf_reserve(&b, n * 128);
    for (size_t i = 0; i < n; i++) {
        const Kiln__LogLine *l = lines[i];
        store_buf_put(&b, job_id, idlen);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, first_seq + (int64_t)i);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, attempt);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, l->rank);
        store_buf_putc(&b, '\t');
        if (l->stream && strcmp(l->stream, "stderr") == 0)
            store_buf_put(&b, "stderr\t", 7);
        else
            store_buf_put(&b, "stdout\t", 7);
        store_buf_i64(&b, l->time_us > 0 ? l->time_us : now_us);
        store_buf_putc(&b, '\t');
        buf_copy_utf8(&b, l->line ? l->line : "");
        store_buf_putc(&b, '\n');
    }
    int rc = store_copy(c, "store log lines",
                        "COPY logs (job_id, seq, attempt, rank, stream, time_us, line) FROM STDIN", &b,
                        err);
    store_buf_free(&b);
    return rc;
}

/* Points of one (name, rank) group of a batch, as indexes into the batch. */
typedef struct chunk {
    const char *name;
    int rank;
    size_t *idx;
    size_t n, cap;
} chunk_t;

static int cmp_idx_by_step(const void *a, const void *b, void *arg)
{
    Kiln__MetricPoint *const *pts = arg;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int64_t sx = pts[x]->step, sy = pts[y]->step;
    if (sx != sy)
        return sx < sy ? -1 : 1;
    return x < y ? -1 : x > y;  /* stable: batch order breaks ties */
}

static bool sorted_by_step(Kiln__MetricPoint *const *pts, const chunk_t *ch)
{
    for (size_t i = 1; i < ch->n; i++)
        if (pts[ch->idx[i]]->step < pts[ch->idx[i - 1]]->step)
            return false;
    return true;
}

/* The summary of one (name, rank) group of a batch, its indexes sorted by step (stably, so of
 * the points at one step the batch's later one comes last and wins). */
static void chunk_summary(Kiln__MetricPoint *const *pts, const chunk_t *k, store_metric_sum_t *o)
{
    memset(o, 0, sizeof *o);
    o->name = k->name;
    o->rank = k->rank;
    o->lo_step = pts[k->idx[0]]->step;
    o->hi_step = pts[k->idx[k->n - 1]]->step;
    for (size_t i = 0; i < k->n; i++) {
        const Kiln__MetricPoint *p = pts[k->idx[i]];
        if (i + 1 < k->n && pts[k->idx[i + 1]]->step == p->step)
            continue; /* a later point of the batch has this step */
        if (!isfinite(p->value))
            continue;
        if (o->n == 0 || p->value < o->min) {
            o->min = p->value;
            o->min_step = p->step;
        }
        if (o->n == 0 || p->value > o->max) {
            o->max = p->value;
            o->max_step = p->step;
        }
        o->last = p->value;
        o->last_step = p->step;
        o->n++;
    }
}

int store_metrics_copy(store_conn_t *c, const char *job_id, int attempt,
                       Kiln__MetricPoint *const *pts, size_t n, int64_t now_us,
                       store_metric_sum_t **sums, size_t *nsums, kiln_err_t *err)
{
    if (sums) {
        *sums = NULL;
        *nsums = 0;
    }
    if (n == 0)
        return 0;
    /* Group the batch by (name, rank): agents send a few metrics for many steps, so a handful
     * of groups, and consecutive points usually hit the group of the previous one. */
    chunk_t *ch = NULL;
    size_t nch = 0, capch = 0, last = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const Kiln__MetricPoint *m = pts[i];
        const char *name = m->name ? m->name : "";
        size_t g = nch;
        if (nch > 0 && ch[last].rank == m->rank && strcmp(ch[last].name, name) == 0) {
            g = last;
        } else {
            for (size_t k = 0; k < nch; k++)
                if (ch[k].rank == m->rank && strcmp(ch[k].name, name) == 0) {
                    g = k;
                    break;
                }
        }
        if (g == nch) {
            if (nch == capch) {
                capch = capch ? 2 * capch : 16;
                chunk_t *nc = realloc(ch, capch * sizeof(*ch));
                if (!nc) {
                    rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                    goto out;
                }
                ch = nc;
            }
            memset(&ch[nch], 0, sizeof(ch[nch]));
            ch[nch].name = name;
            ch[nch].rank = m->rank;
            nch++;
        }
        chunk_t *k = &ch[g];
        if (k->n == k->cap) {
            k->cap = k->cap ? 2 * k->cap : 64;
            size_t *ni = realloc(k->idx, k->cap * sizeof(size_t));
            if (!ni) {
                rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                goto out;
            }
            k->idx = ni;
        }
        k->idx[k->n++] = i;
        last = g;
    }

    store_buf_t b = {0};
    size_t idlen = strlen(job_id);
    store_metric_sum_t *sm = NULL;
    size_t nsm = 0;
    if (sums && !(sm = calloc(nch, sizeof *sm))) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    store_buf_reserve(&b, n * 48 + nch * 128);
    for (size_t g = 0; g < nch; g++) {
        chunk_t *k = &ch[g];
        if (!sorted_by_step(pts, k))
            qsort_r(k->idx, k->n, sizeof(size_t), cmp_idx_by_step, (void *)pts);
        if (sm) {
            /* One summary per name: the lowest rank of the batch that reported it. */
            store_metric_sum_t one;
            chunk_summary(pts, k, &one);
            size_t s = 0;
            while (s < nsm && strcmp(sm[s].name, one.name) != 0)
                s++;
            if (s == nsm)
                sm[nsm++] = one;
            else if (one.rank < sm[s].rank)
                sm[s] = one;
        }
        store_buf_put(&b, job_id, idlen);
        store_buf_putc(&b, '\t');
        buf_copy_utf8(&b, k->name);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, k->rank);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, attempt);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, pts[k->idx[0]]->step);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, pts[k->idx[k->n - 1]]->step);
        store_buf_putc(&b, '\t');
        store_buf_i64(&b, (int64_t)k->n);
        store_buf_put(&b, "\t{", 2);
        for (size_t i = 0; i < k->n; i++) {
            if (i)
                store_buf_putc(&b, ',');
            store_buf_i64(&b, pts[k->idx[i]]->step);
        }
        store_buf_put(&b, "}\t{", 3);
        for (size_t i = 0; i < k->n; i++) {
            if (i)
                store_buf_putc(&b, ',');
            store_buf_double(&b, pts[k->idx[i]]->value);
        }
        store_buf_put(&b, "}\t{", 3);
        for (size_t i = 0; i < k->n; i++) {
            if (i)
                store_buf_putc(&b, ',');
            int64_t t = pts[k->idx[i]]->time_us;
            store_buf_i64(&b, t > 0 ? t : now_us);
        }
        store_buf_put(&b, "}\n", 2);
    }
    rc = store_copy(c, "store metric points",
                    "COPY metric_chunks (job_id, name, rank, attempt, first_step, last_step, n, steps,"
                    " vals, times_us) FROM STDIN", &b, err);
    store_buf_free(&b);
    if (rc == 0 && sm) {
        *sums = sm;
        *nsums = nsm;
        sm = NULL;
    }
    free(sm);
out:
    for (size_t g = 0; g < nch; g++)
        free(ch[g].idx);
    free(ch);
    return rc;
}

int store_metric_summaries_update(store_conn_t *c, const char *job_id, int attempt,
                                  const store_metric_sum_t *sums, size_t n, kiln_err_t *err)
{
    if (n == 0)
        return 0;
    /* Rows are written in name order, so that two batches of one job lock them in the same
     * order (the job row, updated first in the same transaction, serialises them anyway). The
     * merge: a lower rank replaces the row; a higher rank leaves it; the same rank merges when
     * the batch's steps lie wholly outside the row's [lo_step, hi_step], and otherwise marks
     * the row dirty for a rebuild from the chunks (metric_summary_rebuild, migration 0005). */
    static const char *sql =
        "INSERT INTO metric_summaries AS s (job_id, name, rank, n, min, max, last, min_step, max_step,"
        "  last_step, lo_step, hi_step, attempt)"
        " SELECT $1::uuid, b.name, b.rank, b.n, b.min, b.max, b.last, b.min_step, b.max_step, b.last_step,"
        "  b.lo, b.hi, $2::int"
        " FROM unnest($3::text[], $4::int[], $5::bigint[], $6::float8[], $7::float8[], $8::float8[],"
        "  $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[])"
        "  AS b(name, rank, n, min, max, last, min_step, max_step, last_step, lo, hi)"
        " ORDER BY b.name"
        " ON CONFLICT (job_id, name) DO UPDATE SET"
        "  rank = excluded.rank,"
        "  n = CASE WHEN excluded.rank < s.rank THEN excluded.n"
        "   WHEN excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step THEN s.n + excluded.n ELSE s.n END,"
        "  min = CASE WHEN excluded.rank < s.rank THEN excluded.min"
        "   WHEN excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step THEN LEAST(s.min, excluded.min)"
        "   ELSE s.min END,"
        "  max = CASE WHEN excluded.rank < s.rank THEN excluded.max"
        "   WHEN excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step THEN GREATEST(s.max, excluded.max)"
        "   ELSE s.max END,"
        "  min_step = CASE WHEN excluded.rank < s.rank THEN excluded.min_step"
        "   WHEN NOT (excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step) THEN s.min_step"
        "   WHEN excluded.min < s.min OR s.min IS NULL THEN excluded.min_step"
        "   WHEN excluded.min = s.min THEN LEAST(s.min_step, excluded.min_step) ELSE s.min_step END,"
        "  max_step = CASE WHEN excluded.rank < s.rank THEN excluded.max_step"
        "   WHEN NOT (excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step) THEN s.max_step"
        "   WHEN excluded.max > s.max OR s.max IS NULL THEN excluded.max_step"
        "   WHEN excluded.max = s.max THEN LEAST(s.max_step, excluded.max_step) ELSE s.max_step END,"
        "  last = CASE WHEN excluded.rank < s.rank THEN excluded.last"
        "   WHEN NOT (excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step) THEN s.last"
        "   WHEN excluded.last_step > s.last_step OR s.last_step IS NULL THEN excluded.last ELSE s.last END,"
        "  last_step = CASE WHEN excluded.rank < s.rank THEN excluded.last_step"
        "   WHEN NOT (excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step) THEN s.last_step"
        "   WHEN excluded.last_step > s.last_step OR s.last_step IS NULL THEN excluded.last_step"
        "   ELSE s.last_step END,"
        "  lo_step = CASE WHEN excluded.rank < s.rank THEN excluded.lo_step ELSE LEAST(s.lo_step, excluded.lo_step) END,"
        "  hi_step = CASE WHEN excluded.rank < s.rank THEN excluded.hi_step ELSE GREATEST(s.hi_step, excluded.hi_step) END,"
        "  attempt = CASE WHEN excluded.rank < s.rank THEN excluded.attempt ELSE GREATEST(s.attempt, excluded.attempt) END,"
        "  dirty = excluded.rank = s.rank AND NOT (excluded.hi_step < s.lo_step OR excluded.lo_step > s.hi_step)"
        " WHERE excluded.rank <= s.rank"
        " RETURNING name, dirty";
    store_buf_t a[11];
    memset(a, 0, sizeof a);
    /* The names in order, and each column in the same order. */
    size_t *order = malloc(n * sizeof *order);
    if (!order)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0 && strcmp(sums[order[k - 1]].name, sums[order[k]].name) > 0; k--) {
            size_t t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    for (size_t i = 0; i < n; i++) {
        const store_metric_sum_t *m = &sums[order[i]];
        bool any = m->n > 0;
        store_buf_elems(a, 11, (int)i);
        store_buf_array_text(&a[0], m->name);
        store_buf_i64(&a[1], m->rank);
        store_buf_i64(&a[2], m->n);
        if (any) {
            store_buf_double(&a[3], m->min);
            store_buf_double(&a[4], m->max);
            store_buf_double(&a[5], m->last);
            store_buf_i64(&a[6], m->min_step);
            store_buf_i64(&a[7], m->max_step);
            store_buf_i64(&a[8], m->last_step);
        } else {
            for (int col = 3; col <= 8; col++)
                store_buf_put(&a[col], "NULL", 4);
        }
        store_buf_i64(&a[9], m->lo_step);
        store_buf_i64(&a[10], m->hi_step);
    }
    store_buf_arrays_end(a, 11, (int)n);
    free(order);
    char att[16];
    snprintf(att, sizeof att, "%d", attempt);
    const char *p[13] = {job_id, att};
    for (int col = 0; col < 11; col++)
        p[2 + col] = a[col].p;
    PGresult *r = NULL;
    int rc = store_qp(c, "update metric summaries", sql, 13, p, &r, err);
    for (int col = 0; col < 11; col++)
        store_buf_free(&a[col]);
    if (rc)
        return rc;
    /* Rebuild the rows a retried or out-of-order batch overlapped. */
    store_buf_t dirty = {0};
    int ndirty = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        if (!store_get_bool(r, i, 1))
            continue;
        store_buf_elem(&dirty, ndirty++);
        store_buf_array_text(&dirty, store_get_str(r, i, 0));
    }
    store_buf_array_end(&dirty, ndirty);
    PQclear(r);
    if (ndirty) {
        const char *p2[2] = {job_id, dirty.p};
        rc = store_qp(c, "rebuild metric summaries",
                      "SELECT metric_summary_rebuild($1::uuid, n) FROM unnest($2::text[]) AS n", 2, p2, NULL, err);
    }
    store_buf_free(&dirty);
    return rc;
}

int store_metric_names_count(store_conn_t *c, const char *job_id, int64_t *n, kiln_err_t *err)
{
    PGresult *r = NULL;
    const char *p[1] = {job_id};
    *n = 0;
    int rc = store_qp(c, "count metric names", "SELECT count(*) FROM metric_summaries WHERE job_id = $1::uuid", 1, p,
                      &r, err);
    if (rc == 0)
        *n = store_get_i64(r, 0, 0);
    PQclear(r);
    return rc;
}

int store_logs_query_json(store_conn_t *c, const char *job_id, const store_log_query_t *q,
                          json_t **out, int64_t *last_seq, kiln_err_t *err)
{
    char sql[512], after[24], rank[16], since[24], lim[16];
    const char *p[5];
    int np = 0;
    *out = NULL;
    *last_seq = q->after_seq;
    p[np++] = job_id;
    snprintf(after, sizeof(after), "%lld", (long long)q->after_seq);
    p[np++] = after;
    size_t len = (size_t)snprintf(sql, sizeof(sql),
                                  "SELECT seq, rank, stream, time_us, line, attempt FROM logs"
                                  " WHERE job_id = $1::uuid AND seq > $2::bigint");
    if (q->rank >= 0) {
        snprintf(rank, sizeof(rank), "%d", q->rank);
        p[np++] = rank;
        len += (size_t)snprintf(sql + len, sizeof(sql) - len, " AND rank = $%d::int", np);
    }
    if (q->since_us > 0) {
        snprintf(since, sizeof(since), "%lld", (long long)q->since_us);
        p[np++] = since;
        len += (size_t)snprintf(sql + len, sizeof(sql) - len, " AND time_us >= $%d::bigint", np);
    }
    snprintf(lim, sizeof(lim), "%d", q->limit);
    p[np++] = lim;
    snprintf(sql + len, sizeof(sql) - len, " ORDER BY seq LIMIT $%d::int", np);
    PGresult *r = NULL;
    int rc = store_q(c, "read log lines", sql, np, p, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    int n = PQntuples(r);
    for (int i = 0; i < n; i++) {
        json_t *o = json_object();
        int64_t seq = store_get_i64(r, i, 0), t = store_get_i64(r, i, 3);
        char tb[40];
        json_object_set_new(o, "seq", json_integer(seq));
        json_object_set_new(o, "rank", json_integer(store_get_int(r, i, 1)));
        json_object_set_new(o, "stream", json_string(store_get_str(r, i, 2)));
        json_object_set_new(o, "time", json_string(kiln_time_format(t, tb, sizeof(tb))));
        json_object_set_new(o, "time_us", json_integer(t));
        json_object_set_new(o, "line", json_string(store_get_str(r, i, 4)));
        json_object_set_new(o, "attempt", json_integer(store_get_int(r, i, 5)));
        json_array_append_new(arr, o);
        *last_seq = seq;
    }
    PQclear(r);
    *out = arr;
    return 0;
}

/* One stored point of a series, with what orders and deduplicates it. */
typedef struct hpoint {
    int64_t step, time_us, cid;
    double value;
    int rank, attempt, ord;
} hpoint_t;

/* Step, rank, attempt, then the order stored: groups each rank's points of a step together, so
 * the latest attempt's can be picked out. */
static int hpoint_cmp_rank(const void *a, const void *b)
{
    const hpoint_t *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->attempt != y->attempt)
        return x->attempt < y->attempt ? -1 : 1;
    if (x->cid != y->cid)
        return x->cid < y->cid ? -1 : 1;
    return (x->ord > y->ord) - (x->ord < y->ord);
}

/* The order a series is returned in: step, attempt, rank, then the order stored. */
static int hpoint_cmp(const void *a, const void *b)
{
    const hpoint_t *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    if (x->attempt != y->attempt)
        return x->attempt < y->attempt ? -1 : 1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->cid != y->cid)
        return x->cid < y->cid ? -1 : 1;
    return (x->ord > y->ord) - (x->ord < y->ord);
}

/* PostgreSQL's order of float8: NaN above every number and equal to itself. */
static int value_cmp(double a, double b)
{
    bool na = isnan(a), nb = isnan(b);
    if (na || nb)
        return na - nb;
    return (a > b) - (a < b);
}

/* Parses a PostgreSQL array's text ("{1,2,3}") of n numbers into out (int64 or double). */
static bool parse_pg_array(const char *t, size_t n, int64_t *i64, double *f64)
{
    if (*t++ != '{')
        return false;
    for (size_t k = 0; k < n; k++) {
        char *end;
        if (i64)
            i64[k] = strtoll(t, &end, 10);
        else
            f64[k] = strtod(t, &end);
        if (end == t || (*end != ',' && *end != '}'))
            return false;
        t = end + 1;
    }
    return true;
}

/* Appends series name's points (pts[0..n), one chunk's worth at a time already parsed) to arr,
 * deduplicated (attempt -1) and thinned as store_metrics_query_json says. KILN_ENOMEM when it
 * could not (no series is left out silently). */
static int history_series(json_t *arr, const char *name, hpoint_t *pts, size_t n, int max_points, int attempt,
                          kiln_err_t *err)
{
    size_t m = n;
    if (attempt == -1) {
        /* a retried step counts once: the points of the latest attempt that reported it */
        qsort(pts, n, sizeof *pts, hpoint_cmp_rank);
        m = 0;
        for (size_t g = 0; g < n;) {
            size_t e = g;
            int last = pts[g].attempt;
            while (e < n && pts[e].step == pts[g].step && pts[e].rank == pts[g].rank) {
                if (pts[e].attempt > last)
                    last = pts[e].attempt;
                e++;
            }
            for (size_t k = g; k < e; k++)
                if (pts[k].attempt == last)
                    pts[m++] = pts[k];
            g = e;
        }
        /* in step, rank order now; step, attempt, rank differs only where attempts differ */
        bool one_attempt = true;
        for (size_t k = 1; k < m && one_attempt; k++)
            one_attempt = pts[k].attempt == pts[0].attempt;
        if (!one_attempt)
            qsort(pts, m, sizeof *pts, hpoint_cmp);
    } else {
        qsort(pts, m, sizeof *pts, hpoint_cmp);
    }
    /* which to keep: all, or the first, the last and each bucket's lowest and highest */
    bool *keep = calloc(m ? m : 1, sizeof *keep);
    if (!keep)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory thinning metric %s", name);
    if ((int64_t)m <= max_points) {
        for (size_t k = 0; k < m; k++)
            keep[k] = true;
    } else if (m > 0) {
        keep[0] = keep[m - 1] = true;
        int64_t nb = (max_points - 2) / 2;
        if (nb > 0 && m > 2) {
            size_t k = 1;
            while (k < m - 1) {
                int64_t b = ((int64_t)(k - 1) * nb) / (int64_t)(m - 2);
                size_t lo = k, hi = k;
                size_t e = k;
                while (e < m - 1 && ((int64_t)(e - 1) * nb) / (int64_t)(m - 2) == b) {
                    if (value_cmp(pts[e].value, pts[lo].value) < 0)
                        lo = e;
                    if (value_cmp(pts[e].value, pts[hi].value) > 0)
                        hi = e;
                    e++;
                }
                keep[lo] = keep[hi] = true;
                k = e;
            }
        }
    }
    json_t *series = json_object(), *points = json_array();
    json_object_set_new(series, "name", json_string(name));
    json_object_set_new(series, "points", points);
    json_array_append_new(arr, series);
    for (size_t k = 0; k < m; k++) {
        if (!keep[k])
            continue;
        const hpoint_t *p = &pts[k];
        json_t *pt = json_object();
        char tb[40];
        json_object_set_new(pt, "step", json_integer(p->step));
        json_object_set_new(pt, "value", isfinite(p->value) ? json_real(p->value) : json_null());
        json_object_set_new(pt, "time", json_string(kiln_time_format(p->time_us, tb, sizeof(tb))));
        json_object_set_new(pt, "time_us", json_integer(p->time_us));
        json_object_set_new(pt, "rank", json_integer(p->rank));
        json_object_set_new(pt, "attempt", json_integer(p->attempt));
        json_array_append_new(points, pt);
    }
    free(keep);
    return 0;
}

int store_metrics_query_json(store_conn_t *c, const char *job_id, const store_metrics_query_t *q,
                             json_t **out, kiln_err_t *err)
{
    /* Steps outside [start_step, end_step] (0: no bound) are left out, chunks by their step
     * range and points by their step, so a zoomed chart reads only its range. Attempt N > 0 reads
     * only attempt N's chunks, 0 every attempt's. Attempt -1 (latest) counts a retried step once:
     * of the attempts that reported a rank's step, only the latest one's points stay (every one
     * of them: a metric matched in log lines before any step record has several points at one
     * step). Then each series, in step and then attempt order, keeps its first and last point and
     * splits the rest into (max_points - 2) / 2 buckets of consecutive points, keeping each
     * bucket's lowest and highest value (the first of equal ones; NaN above every number, as
     * PostgreSQL orders them), so spikes survive thinning. The chunks come from PostgreSQL as
     * stored and are thinned here: sorting 100,000 points in C takes a few milliseconds, where
     * the same windows in SQL took a quarter of a second per series. */
    static const char *sql =
        "SELECT name, rank, attempt, id, n, steps, vals, times_us FROM metric_chunks"
        " WHERE job_id = $1::uuid AND ($2::text IS NULL OR name = $2)"
        "  AND ($3::bigint IS NULL OR last_step >= $3) AND ($4::bigint IS NULL OR first_step <= $4)"
        "  AND ($5::int <= 0 OR attempt = $5::int)"
        " ORDER BY name, id";
    int64_t start_step = q->start_step, end_step = q->end_step;
    char sb[24], eb[24], at[16];
    snprintf(sb, sizeof(sb), "%lld", (long long)start_step);
    snprintf(eb, sizeof(eb), "%lld", (long long)end_step);
    snprintf(at, sizeof(at), "%d", q->attempt);
    const char *p[5] = {job_id, q->name, start_step > 0 ? sb : NULL, end_step > 0 ? eb : NULL, at};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "read metrics", sql, 5, p, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    hpoint_t *pts = NULL;
    size_t npts = 0, cap = 0;
    int64_t *steps = NULL, *times = NULL;
    double *vals = NULL;
    size_t acap = 0;
    int rows = PQntuples(r);
    for (int i = 0; i <= rows && rc == 0; i++) {
        const char *nm = i < rows ? store_get_str(r, i, 0) : NULL;
        if (i > 0 && (!nm || strcmp(nm, store_get_str(r, i - 1, 0)) != 0)) {
            if (npts)
                rc = history_series(arr, store_get_str(r, i - 1, 0), pts, npts, q->max_points, q->attempt, err);
            npts = 0;
        }
        if (!nm || rc)
            break;
        size_t n = (size_t)store_get_int(r, i, 4);
        if (n > acap) {
            acap = n;
            int64_t *ns = realloc(steps, n * sizeof *ns), *nt = ns ? realloc(times, n * sizeof *nt) : NULL;
            if (ns)
                steps = ns;
            if (nt)
                times = nt;
            double *nv = nt ? realloc(vals, n * sizeof *nv) : NULL;
            if (nv)
                vals = nv;
            if (!ns || !nt || !nv) {
                rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                break;
            }
        }
        if (!parse_pg_array(store_get_str(r, i, 5), n, steps, NULL) ||
            !parse_pg_array(store_get_str(r, i, 6), n, NULL, vals) ||
            !parse_pg_array(store_get_str(r, i, 7), n, times, NULL)) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "a stored metric chunk could not be read");
            break;
        }
        if (npts + n > cap) {
            size_t nc = cap ? cap : 4096;
            while (nc < npts + n)
                nc *= 2;
            hpoint_t *np = realloc(pts, nc * sizeof *np);
            if (!np) {
                rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                break;
            }
            pts = np;
            cap = nc;
        }
        int rank = store_get_int(r, i, 1), attempt = store_get_int(r, i, 2);
        int64_t cid = store_get_i64(r, i, 3);
        for (size_t k = 0; k < n; k++) {
            if ((start_step > 0 && steps[k] < start_step) || (end_step > 0 && steps[k] > end_step))
                continue;
            pts[npts++] = (hpoint_t){.step = steps[k], .time_us = times[k], .cid = cid, .value = vals[k],
                                     .rank = rank, .attempt = attempt, .ord = (int)k};
        }
    }
    free(pts);
    free(steps);
    free(times);
    free(vals);
    PQclear(r);
    if (rc) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return 0;
}
