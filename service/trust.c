/* trust.c - what cluster admins do about workers: approve one that waits (kilnd --agent-approval),
 * remove one (its attempts are lost as when a worker dies, its credential stops working) and ban
 * its worker id and client certificate, list and lift bans; and the certificate fingerprint a
 * worker is bound to. Registration and its checks are agent.c's; join tokens are join.c's. */
#include "service/svc_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int svc_cert_sha256(const char *pem, size_t len, char out[SVC_CERT_HEX], kiln_err_t *err)
{
    static const char begin[] = "-----BEGIN CERTIFICATE-----", end[] = "-----END CERTIFICATE-----";
    out[0] = '\0';
    const char *b = pem ? memmem(pem, len, begin, sizeof(begin) - 1) : NULL;
    if (b) {
        b += sizeof(begin) - 1;
        const char *e = memmem(b, len - (size_t)(b - pem), end, sizeof(end) - 1);
        size_t n = e ? (size_t)(e - b) : 0;
        unsigned char *der = n ? malloc(n) : NULL;
        size_t der_len = 0;
        if (der && sodium_base642bin(der, n, b, n, " \t\r\n", &der_len, NULL, sodium_base64_VARIANT_ORIGINAL) == 0 &&
            der_len > 0) {
            kiln_sha256_hex(der, der_len, out);
            free(der);
            return 0;
        }
        free(der);
    }
    return kiln_err_set(err, KILN_EINVAL, NULL, "the client certificate is not a PEM certificate");
}

/* After a change to a worker's standing: drop cached credentials, re-read capacity, wake the
 * scheduler. */
static void worker_changed(svc_t *s)
{
    svc_auth_invalidate(s);
    kiln_err_t e2;
    store_conn_t *c = NULL;
    if (store_conn_get(s->store, &c, &e2) == 0) {
        if (svc_cap_refresh(s, c, &e2))
            log_warn("could not refresh capacity: %s", e2.message);
        store_conn_put(s->store, c);
    }
    svc_sched_wake(s);
}

int svc_worker_approve(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, "approving workers", err);
    if (rc == 0)
        rc = svc_check_str("id", id, 63, err);
    if (rc)
        return rc;
    store_conn_t *c = NULL;
    bool changed = false;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = store_worker_approve(c, id ? id : "", who->user, &changed, err);
    if (rc == 0)
        rc = store_worker_get_json(c, id, out, err);
    store_conn_put(s->store, c);
    if (rc == KILN_ENOTFOUND)
        kiln_err_hint(err, "kiln workers lists the workers");
    if (rc)
        return rc;
    if (changed) {
        log_info("worker %s approved by %s: it may take work now", id, who->user);
        worker_changed(s);
    }
    return 0;
}

int svc_worker_remove(svc_t *s, const svc_caller_t *who, const char *id, bool ban, const char *reason,
                      json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, "removing workers", err);
    if (rc == 0)
        rc = svc_check_str("id", id, 63, err);
    if (rc == 0)
        rc = svc_check_line("reason", reason, 200, err);
    if (rc)
        return rc;
    if (!ban && reason && *reason) {
        kiln_err_set(err, KILN_EINVAL, "reason", "a reason is recorded with a ban: it needs ban=true");
        return KILN_EINVAL;
    }
    svc_tx_t tx;
    store_worker_removed_t rm;
    json_t *ban_json = NULL;
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_worker_remove(tx.c, id ? id : "", who->user, &rm, err);
    if (rc == 0 && ban)
        rc = store_ban_insert(tx.c, id, rm.cert_sha256, reason, who->user, &ban_json, err);
    if (rc) {
        svc_tx_abort(&tx);
        if (rc == KILN_ENOTFOUND)
            kiln_err_hint(err, "kiln workers lists the workers");
        return rc;
    }
    rc = svc_tx_commit(&tx, err);
    if (rc) {
        json_decref(ban_json);
        return rc;
    }
    /* Its credential is gone; what it ran is lost, as when a worker dies. */
    svc_auth_invalidate(s);
    store_lost_t *lost = NULL;
    int nlost = 0;
    store_conn_t *c = NULL;
    kiln_err_t e2;
    if (store_conn_get(s->store, &c, &e2) == 0) {
        if (store_assign_held_by(c, id, &lost, &nlost, &e2))
            log_warn("worker %s: could not read its assignments: %s (the liveness check releases them)", id,
                     e2.message);
        store_conn_put(s->store, c);
    }
    for (int i = 0; i < nlost; i++) {
        char why[300];
        snprintf(why, sizeof(why), "worker %s (%s) was removed by %s", id, rm.hostname, who->user);
        if (svc_job_lost(s, lost[i].job_id, lost[i].attempt, id, why, &e2))
            log_warn("worker %s: could not handle job %s: %s", id, lost[i].job_id, e2.message);
    }
    free(lost);
    if (!rm.already)
        log_info("worker %s (%s) removed by %s; %d attempt(s) lost", id, rm.hostname, who->user, nlost);
    if (ban_json)
        log_info("worker %s banned by %s (ban %lld%s%.16s)", id, who->user,
                 (long long)json_integer_value(json_object_get(ban_json, "id")),
                 rm.cert_sha256[0] ? ", certificate " : "", rm.cert_sha256);
    worker_changed(s);
    char when[40];
    *out = json_pack("{s:s, s:s, s:s, s:i, s:o}", "id", id, "removed_at", kiln_time_format(rm.removed_us, when, sizeof(when)),
                     "removed_by", rm.removed_by, "lost_attempts", nlost, "ban", ban_json ? ban_json : json_null());
    return 0;
}

int svc_worker_bans_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    return svc_trust_list(s, who, "listing worker bans", store_bans_list_json, "bans", out, err);
}

int svc_worker_ban_delete(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, "lifting worker bans", err);
    if (rc)
        return rc;
    int64_t n = 0;
    if (!id || kiln_parse_int64(id, &n) != 0 || n <= 0) {
        kiln_err_set(err, KILN_ENOTFOUND, "id", "worker ban \"%.40s\" not found", id ? id : "");
        kiln_err_hint(err, "kiln workers bans lists the bans with their numbers");
        return KILN_ENOTFOUND;
    }
    store_conn_t *c = NULL;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = store_ban_delete(c, n, out, err);
    store_conn_put(s->store, c);
    if (rc == 0)
        log_info("worker ban %lld lifted by %s", (long long)n, who->user);
    return rc;
}
