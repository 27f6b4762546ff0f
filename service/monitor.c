/* monitor.c - what kilnd tells Prometheus about the control plane: the service's own counters
 * and histograms (finished jobs by outcome, queue waits, scheduling passes, ingested lines and
 * points), and at scrape time the database's view (jobs by state, queue lengths, workers and
 * slots by state) and the connection pool's use. The HTTP side is api/'s. */
#include "service/svc_int.h"

#include <stdio.h>
#include <string.h>

prom_family_t svc_prom_finished = PROM_FAMILY("kiln_jobs_finished_total",
                                              "Jobs that ended here, by outcome (completed, failed, stopped).",
                                              PROM_COUNTER);
prom_family_t svc_prom_queue_wait = PROM_HISTOGRAM_FAMILY(
    "kiln_job_queue_wait_seconds", "Time jobs waited in QUEUED or RESTARTING before they were placed.",
    prom_wait_buckets);
prom_family_t svc_prom_sched_pass = PROM_HISTOGRAM_FAMILY(
    "kiln_scheduler_pass_seconds", "Time of one scheduling pass (placing queued jobs) on the leader.",
    prom_latency_buckets);
prom_family_t svc_prom_lines = PROM_FAMILY("kiln_ingested_log_lines_total",
                                           "Log lines stored from agents.", PROM_COUNTER);
prom_family_t svc_prom_points = PROM_FAMILY("kiln_ingested_metric_points_total",
                                            "Metric points stored from agents.", PROM_COUNTER);
static prom_family_t svc_prom_artifact_bytes = PROM_FAMILY(
    "kiln_artifact_bytes_total",
    "Artifact bytes kilnd's artifact store took from agents (direction=\"stored\") and sent to clients "
    "(direction=\"served\", by api: rest or grpc).",
    PROM_COUNTER);
static prom_family_t svc_prom_deleted = PROM_FAMILY("kiln_jobs_deleted_total",
                                                    "Ended jobs deleted with everything they left.", PROM_COUNTER);

void svc_prom_artifact_bytes_stored(int64_t n)
{
    prom_add(&svc_prom_artifact_bytes, "direction=\"stored\"", (double)n);
}

void svc_artifact_served(const char *api, int64_t n)
{
    char l[64], labels[96];
    snprintf(labels, sizeof labels, "direction=\"served\",%s", prom_label(l, sizeof l, "api", api));
    prom_add(&svc_prom_artifact_bytes, labels, (double)n);
}

void svc_prom_job_deleted(void)
{
    prom_add(&svc_prom_deleted, "", 1);
}

void svc_prom_init(void)
{
    prom_register(&svc_prom_finished);
    prom_register(&svc_prom_queue_wait);
    prom_register(&svc_prom_sched_pass);
    prom_register(&svc_prom_lines);
    prom_register(&svc_prom_points);
    prom_register(&svc_prom_artifact_bytes);
    prom_register(&svc_prom_deleted);
    prom_add(&svc_prom_artifact_bytes, "direction=\"stored\"", 0);
    prom_add(&svc_prom_deleted, "", 0);
    prom_add(&svc_prom_lines, "", 0);
    prom_add(&svc_prom_points, "", 0);
}

/* One gauge family from a JSON object {key: n} with the keys as values of label: lower-cased
 * when lower (a state), as they are otherwise (a queue's name). */
static void write_gauges(prom_buf_t *b, const char *name, const char *help, const char *label, json_t *obj,
                         bool lower)
{
    prom_header(b, name, help, PROM_GAUGE);
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        char l[160];
        prom_printf(b, "%s{%s} %lld\n", name,
                    lower ? prom_label_lower(l, sizeof l, label, k) : prom_label(l, sizeof l, label, k),
                    (long long)json_integer_value(v));
    }
}

int svc_prom_write(svc_t *s, prom_buf_t *b, kiln_err_t *err)
{
    prom_header(b, "kiln_leader", "1 when this kilnd leads its replicas (runs the scheduler and liveness).",
                PROM_GAUGE);
    prom_printf(b, "kiln_leader %d\n", svc_is_leader(s) ? 1 : 0);
    int size = 0, in_use = 0;
    store_pool_usage(s->store, &size, &in_use);
    prom_header(b, "kiln_db_pool_connections", "PostgreSQL connections of kilnd's pool, by use.", PROM_GAUGE);
    prom_printf(b, "kiln_db_pool_connections{state=\"in_use\"} %d\nkiln_db_pool_connections{state=\"idle\"} %d\n",
                in_use, size - in_use);
    store_conn_t *c = NULL;
    json_t *st = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc == 0)
        rc = store_stats_json(c, &st, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    /* Every state, so that a state with no job reads 0 rather than vanishing. */
    json_t *jobs = json_object_get(st, "jobs");
    for (int i = JOB_STATE_NONE + 1; i < JOB_STATE_COUNT_; i++)
        if (!json_object_get(jobs, svc_state_name((svc_job_state_t)i)))
            json_object_set_new(jobs, svc_state_name((svc_job_state_t)i), json_integer(0));
    write_gauges(b, "kiln_jobs", "Jobs by state (queued, running, completed, ...).", "state", jobs, true);
    json_t *queues = json_object_get(st, "queues");
    if (!json_object_get(queues, "default"))
        json_object_set_new(queues, "default", json_integer(0));
    write_gauges(b, "kiln_queue_length", "QUEUED jobs by queue.", "queue", queues, false);
    write_gauges(b, "kiln_workers", "Registered workers by state (alive, dead; draining: alive ones shutting down).",
                 "state", json_object_get(st, "workers"), true);
    prom_header(b, "kiln_slots", "Slots of the alive workers, by slot type and use.", PROM_GAUGE);
    const char *type;
    json_t *v;
    json_object_foreach(json_object_get(st, "slots"), type, v) {
        char l[96];
        prom_label(l, sizeof l, "slot_type", type);
        long long total = json_integer_value(json_object_get(v, "total")), used = json_integer_value(json_object_get(v, "used"));
        prom_printf(b, "kiln_slots{%s,state=\"used\"} %lld\nkiln_slots{%s,state=\"free\"} %lld\n", l, used, l,
                    total - used > 0 ? total - used : 0);
    }
    json_decref(st);
    return 0;
}
