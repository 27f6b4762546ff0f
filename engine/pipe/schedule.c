/* schedule.c - pipeline schedules as data: per-stage action lists (simple = GPipe, interleaved =
 * 1F1B), the one loop that runs a list through hooks, and a deterministic simulator that plays
 * all stages' lists against each other (to check they match and to predict the bubble).
 * It does not move tensors: the hooks given to pipe_run() do. */
#include "engine/pipe/pipe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *pipe_action_name(pipe_action_kind_t k)
{
    switch (k) {
    case PIPE_FORWARD: return "F";
    case PIPE_BACKWARD: return "B";
    case PIPE_SEND_ACT: return "SA";
    case PIPE_RECV_ACT: return "RA";
    case PIPE_SEND_GRAD: return "SG";
    case PIPE_RECV_GRAD: return "RG";
    }
    return "?";
}

double pipe_bubble_theory(int n_stages, int m)
{
    return (double)(n_stages - 1) / (double)(m + n_stages - 1);
}

void pipe_sched_deinit(pipe_sched_t *s)
{
    if (!s)
        return;
    free(s->actions);
    s->actions = NULL;
    s->n = 0;
}

/* Builder state: appends actions and hands out activation slots (lowest free first). */
typedef struct builder {
    pipe_sched_t *s;
    int *slot_of;   /* (m) slot held by each microbatch, -1 when none */
    bool *busy;     /* (m) slot in use */
    int live;
} builder_t;

static int take_slot(builder_t *b, int mb)
{
    if (b->slot_of[mb] >= 0)
        return b->slot_of[mb];
    int k = 0;
    while (b->busy[k])
        k++;
    b->busy[k] = true;
    b->slot_of[mb] = k;
    if (++b->live > b->s->peak_live)
        b->s->peak_live = b->live;
    return k;
}

static void push(builder_t *b, pipe_action_kind_t kind, int mb)
{
    pipe_sched_t *s = b->s;
    int slot;
    if (kind == PIPE_RECV_ACT || kind == PIPE_FORWARD)
        slot = take_slot(b, mb);
    else
        slot = b->slot_of[mb] >= 0 ? b->slot_of[mb] : 0;
    s->actions[s->n++] = (pipe_action_t){.kind = kind, .mb = mb, .slot = slot};
    if (kind == PIPE_BACKWARD && b->slot_of[mb] >= 0) {
        /* The activation set dies with its backward; SEND_GRAD still names the slot it came from. */
        b->busy[b->slot_of[mb]] = false;
        b->live--;
    }
}

static void push_fwd(builder_t *b, int mb)
{
    const pipe_sched_t *s = b->s;
    if (s->stage > 0)
        push(b, PIPE_RECV_ACT, mb);
    push(b, PIPE_FORWARD, mb);
    if (s->stage < s->n_stages - 1)
        push(b, PIPE_SEND_ACT, mb);
}

static void push_bwd(builder_t *b, int mb)
{
    const pipe_sched_t *s = b->s;
    if (s->stage < s->n_stages - 1)
        push(b, PIPE_RECV_GRAD, mb);
    push(b, PIPE_BACKWARD, mb);
    int slot = s->actions[s->n - 1].slot;
    if (s->stage > 0) {
        push(b, PIPE_SEND_GRAD, mb);
        s->actions[s->n - 1].slot = slot;
    }
}

int pipe_sched_build(pipe_sched_kind_t kind, int stage, int n_stages, int m, pipe_sched_t *out,
                     kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    if (n_stages < 1 || stage < 0 || stage >= n_stages || m < 1)
        return kiln_err_set(err, KILN_EINVAL, NULL, "bad schedule request: stage %d of %d, %d microbatches",
                            stage, n_stages, m);
    if (kind != PIPE_SCHED_SIMPLE && kind != PIPE_SCHED_INTERLEAVED && kind != PIPE_SCHED_FORWARD)
        return kiln_err_set(err, KILN_EINVAL, NULL, "unknown schedule %d", (int)kind);
    int rc = 0;
    out->kind = kind;
    out->stage = stage;
    out->n_stages = n_stages;
    out->m = m;
    builder_t b = {.s = out};
    out->actions = calloc((size_t)m * 6, sizeof(pipe_action_t));
    b.slot_of = malloc(sizeof(int) * (size_t)m);
    b.busy = calloc((size_t)m, sizeof(bool));
    if (!out->actions || !b.slot_of || !b.busy) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory building a schedule of %d microbatches", m);
        goto fail;
    }
    for (int i = 0; i < m; i++)
        b.slot_of[i] = -1;
    if (kind == PIPE_SCHED_FORWARD) {
        for (int mb = 0; mb < m; mb++)
            push_fwd(&b, mb);
        for (int i = 0; i < out->n; i++)
            out->actions[i].slot = 0;
        out->peak_live = 1;
    } else if (kind == PIPE_SCHED_SIMPLE) {
        for (int mb = 0; mb < m; mb++)
            push_fwd(&b, mb);
        for (int mb = 0; mb < m; mb++)
            push_bwd(&b, mb);
    } else {
        int warm = n_stages - stage - 1;
        if (warm > m)
            warm = m;
        int f = 0, bw = 0;
        for (; f < warm; f++)
            push_fwd(&b, f);
        for (; f < m; f++) {
            push_fwd(&b, f);
            push_bwd(&b, bw++);
        }
        while (bw < m)
            push_bwd(&b, bw++);
    }
    free(b.slot_of);
    free(b.busy);
    return 0;
fail:
    free(b.slot_of);
    free(b.busy);
    pipe_sched_deinit(out);
    return rc;
}

char *pipe_sched_format(const pipe_sched_t *s, char *buf, size_t n)
{
    size_t off = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; i < s->n && off < n; i++) {
        int w = snprintf(buf + off, n - off, "%s%s%d", i ? " " : "", pipe_action_name(s->actions[i].kind),
                         s->actions[i].mb);
        if (w < 0)
            break;
        off += (size_t)w;
    }
    return buf;
}

/* ---- the loop ---------------------------------------------------------------------------- */

int pipe_run(const pipe_sched_t *s, const pipe_hooks_t *h, void *ctx, pipe_trace_entry_t *trace,
             kiln_err_t *err)
{
    for (int i = 0; i < s->n; i++) {
        const pipe_action_t *a = &s->actions[i];
        int (*fn)(void *, int, int, kiln_err_t *) = NULL;
        switch (a->kind) {
        case PIPE_FORWARD: fn = h->forward; break;
        case PIPE_BACKWARD: fn = h->backward; break;
        case PIPE_SEND_ACT: fn = h->send_act; break;
        case PIPE_RECV_ACT: fn = h->recv_act; break;
        case PIPE_SEND_GRAD: fn = h->send_grad; break;
        case PIPE_RECV_GRAD: fn = h->recv_grad; break;
        }
        double t0 = trace ? kiln_mono_s() : 0;
        if (fn) {
            int rc = fn(ctx, a->mb, a->slot, err);
            if (rc)
                return rc;
        }
        if (trace)
            trace[i] = (pipe_trace_entry_t){.kind = a->kind, .mb = a->mb, .t0 = t0, .t1 = kiln_mono_s()};
    }
    return h->finish ? h->finish(ctx, err) : 0;
}

/* ---- the simulator ----------------------------------------------------------------------- */

int pipe_sim_run(const pipe_sched_t *scheds, int p, const pipe_sim_costs_t *costs, pipe_sim_result_t *out,
                 kiln_err_t *err)
{
    int rc = 0, m = p > 0 ? scheds[0].m : 0;
    /* act[s*m + mb]: time stage s's activation of mb is available to stage s+1 (NAN: not sent);
     * grad[s*m + mb]: time stage s's input gradient of mb is available to stage s-1. */
    double *act = NULL, *grad = NULL, *t = NULL;
    char *act_got = NULL, *grad_got = NULL;
    int *pc = NULL;
    memset(out, 0, sizeof(*out));
    if (p < 1 || m < 1)
        return kiln_err_set(err, KILN_EINVAL, NULL, "simulator needs at least one stage and microbatch");
    for (int s = 0; s < p; s++)
        if (scheds[s].m != m || scheds[s].n_stages != p || scheds[s].stage != s)
            return kiln_err_set(err, KILN_EINVAL, NULL, "schedule %d is for stage %d of %d with %d microbatches; "
                                "expected stage %d of %d with %d", s, scheds[s].stage, scheds[s].n_stages,
                                scheds[s].m, s, p, m);
    size_t N = (size_t)p * (size_t)m;
    act = malloc(sizeof(double) * N);
    grad = malloc(sizeof(double) * N);
    act_got = calloc(N, 1);
    grad_got = calloc(N, 1);
    t = calloc((size_t)p, sizeof(double));
    pc = calloc((size_t)p, sizeof(int));
    if (!act || !grad || !act_got || !grad_got || !t || !pc) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < N; i++)
        act[i] = grad[i] = NAN;
    double comm = costs && costs->comm > 0 ? costs->comm : 0;
    bool progress = true;
    while (progress) {
        progress = false;
        for (int s = 0; s < p; s++) {
            const pipe_sched_t *sc = &scheds[s];
            while (pc[s] < sc->n) {
                const pipe_action_t *a = &sc->actions[pc[s]];
                int mb = a->mb;
                if (mb < 0 || mb >= m) {
                    rc = kiln_err_set(err, KILN_EINVAL, NULL, "stage %d action %d names microbatch %d of %d", s,
                                      pc[s], mb, m);
                    goto fail;
                }
                bool blocked = false;
                switch (a->kind) {
                case PIPE_FORWARD: {
                    double c = costs && costs->fwd ? costs->fwd[s] : 1.0;
                    t[s] += c;
                    out->busy_total += c;
                    break;
                }
                case PIPE_BACKWARD: {
                    double c = costs && costs->bwd ? costs->bwd[s] : 1.0;
                    t[s] += c;
                    out->busy_total += c;
                    break;
                }
                case PIPE_SEND_ACT:
                case PIPE_SEND_GRAD: {
                    bool is_act = a->kind == PIPE_SEND_ACT;
                    int peer = is_act ? s + 1 : s - 1;
                    double *slot = is_act ? &act[(size_t)s * m + mb] : &grad[(size_t)s * m + mb];
                    if (peer < 0 || peer >= p) {
                        rc = kiln_err_set(err, KILN_EINVAL, NULL, "stage %d sends %s%d to stage %d, which does not exist",
                                          s, pipe_action_name(a->kind), mb, peer);
                        goto fail;
                    }
                    if (!isnan(*slot)) {
                        rc = kiln_err_set(err, KILN_EINVAL, NULL, "stage %d sends %s%d twice", s,
                                          pipe_action_name(a->kind), mb);
                        goto fail;
                    }
                    *slot = t[s] + comm;
                    break;
                }
                case PIPE_RECV_ACT:
                case PIPE_RECV_GRAD: {
                    bool is_act = a->kind == PIPE_RECV_ACT;
                    int peer = is_act ? s - 1 : s + 1;
                    if (peer < 0 || peer >= p) {
                        rc = kiln_err_set(err, KILN_EINVAL, NULL, "stage %d receives %s%d from stage %d, which does "
                                          "not exist", s, pipe_action_name(a->kind), mb, peer);
                        goto fail;
                    }
                    size_t k = (size_t)peer * m + mb;
                    double avail = is_act ? act[k] : grad[k];
                    char *got = is_act ? &act_got[k] : &grad_got[k];
                    if (isnan(avail)) {
                        blocked = true;
                        break;
                    }
                    if (*got) {
                        rc = kiln_err_set(err, KILN_EINVAL, NULL, "stage %d receives %s%d twice", s,
                                          pipe_action_name(a->kind), mb);
                        goto fail;
                    }
                    *got = 1;
                    if (avail > t[s])
                        t[s] = avail;
                    break;
                }
                }
                if (blocked)
                    break;
                pc[s]++;
                progress = true;
            }
        }
    }
    for (int s = 0; s < p; s++)
        if (pc[s] < scheds[s].n) {
            const pipe_action_t *a = &scheds[s].actions[pc[s]];
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "schedule deadlocks: stage %d waits forever at action %d (%s%d)",
                              s, pc[s], pipe_action_name(a->kind), a->mb);
            goto fail;
        }
    for (size_t i = 0; i < N; i++) {
        if (!isnan(act[i]) && !act_got[i]) {
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "stage %d sends activation %d that stage %d never receives",
                              (int)(i / m), (int)(i % m), (int)(i / m) + 1);
            goto fail;
        }
        if (!isnan(grad[i]) && !grad_got[i]) {
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "stage %d sends gradient %d that stage %d never receives",
                              (int)(i / m), (int)(i % m), (int)(i / m) - 1);
            goto fail;
        }
    }
    for (int s = 0; s < p; s++)
        if (t[s] > out->makespan)
            out->makespan = t[s];
    out->bubble = out->makespan > 0 ? 1.0 - out->busy_total / ((double)p * out->makespan) : 0.0;
fail:
    free(act);
    free(grad);
    free(act_got);
    free(grad_got);
    free(t);
    free(pc);
    return rc;
}

int pipe_plan_simulate(pipe_plan_t *plan, const pipe_block_profile_t *prof, kiln_err_t *err)
{
    int p = plan->n_stages, rc = 0;
    pipe_sched_t *sc = calloc((size_t)(p > 0 ? p : 1), sizeof(pipe_sched_t));
    double *fwd = calloc((size_t)(p > 0 ? p : 1), sizeof(double)), *bwd = calloc((size_t)(p > 0 ? p : 1), sizeof(double));
    if (!sc || !fwd || !bwd) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    for (int k = 0; k < p; k++) {
        for (int b = plan->stages[k].first; b <= plan->stages[k].last; b++) {
            fwd[k] += prof[b].fwd_ms;
            bwd[k] += prof[b].bwd_ms;
        }
        if ((rc = pipe_sched_build(plan->schedule, k, p, plan->microbatches, &sc[k], err)))
            goto done;
    }
    pipe_sim_costs_t costs = {.fwd = fwd, .bwd = bwd};
    pipe_sim_result_t r;
    if ((rc = pipe_sim_run(sc, p, &costs, &r, err)))
        goto done;
    plan->predicted_pass_ms = r.makespan;
    plan->predicted_bubble = r.bubble;
done:
    for (int k = 0; sc && k < p; k++)
        pipe_sched_deinit(&sc[k]);
    free(sc);
    free(fwd);
    free(bwd);
    return rc;
}
