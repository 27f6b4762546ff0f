/* regex.c - the one place a metric definition's pattern is compiled and judged, so that spec/
 * refuses at submission exactly what kiln-agent would refuse when it runs the job: which group is
 * the value, which (a group named "step") the step, and whether that group can capture a step. */
#include "base/base.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define STEP_DIGITS_MAX 19      /* a step is an int64_t: at most 19 digits */
#define STEP_JUDGE_CALLS 1024   /* pcre2_match calls spent judging a step group, at most */
#define STEP_JUDGE_LIMIT 1000   /* PCRE2 match limit of each: a step group tried on at most 19 digits */

/* The index after the item of pattern p[0..n) that starts at i, for a scan that looks for the
 * parentheses of its structure only: an escape (\Q...\E as a whole), a character class, a
 * (?#...) comment, in extended mode (x) a # comment, else one byte. */
static size_t skip_item(const char *p, size_t n, size_t i, bool x)
{
    if (p[i] == '\\') {
        if (i + 1 < n && p[i + 1] == 'Q') {
            const char *e = strstr(p + i + 2, "\\E");
            return e ? (size_t)(e - p) + 2 : n;
        }
        return i + 2 < n ? i + 2 : n;
    }
    if (p[i] == '[') {
        size_t k = i + 1;
        if (k < n && p[k] == '^')
            k++;
        if (k < n && p[k] == ']') /* a leading ']' is a member */
            k++;
        while (k < n && p[k] != ']') {
            if (p[k] == '\\') {
                k += 2;
            } else if (p[k] == '[' && k + 1 < n && p[k + 1] == ':') {
                const char *e = strstr(p + k + 2, ":]");
                k = e ? (size_t)(e - p) + 2 : k + 1;
            } else {
                k++;
            }
        }
        return k < n ? k + 1 : n;
    }
    if (p[i] == '(' && i + 2 < n && p[i + 1] == '?' && p[i + 2] == '#') {
        const char *e = memchr(p + i, ')', n - i);
        return e ? (size_t)(e - p) + 1 : n;
    }
    if (x && p[i] == '#') {
        const char *e = memchr(p + i, '\n', n - i);
        return e ? (size_t)(e - p) + 1 : n;
    }
    return i + 1;
}

/* The text of the group named "step" of pattern p (n bytes): *body (OUT) and *len (OUT). x: the
 * pattern sets extended mode somewhere. False when no such group can be found by its name. */
static bool step_group_body(const char *p, size_t n, bool x, const char **body, size_t *len)
{
    static const char *const opens[] = {"(?<step>", "(?'step'", "(?P<step>"};
    for (size_t i = 0; i < n; i = skip_item(p, n, i, x)) {
        if (p[i] != '(')
            continue;
        for (size_t k = 0; k < KILN_ARRAY_LEN(opens); k++) {
            size_t ol = strlen(opens[k]);
            if (n - i < ol || memcmp(p + i, opens[k], ol))
                continue;
            size_t start = i + ol;
            int depth = 1;
            for (size_t j = start; j < n; j = skip_item(p, n, j, x)) {
                if (p[j] == '(')
                    depth++;
                else if (p[j] == ')' && --depth == 0) {
                    *body = p + start;
                    *len = j - start;
                    return true;
                }
            }
            return false;
        }
    }
    return false;
}

/* The digits a group's text (body, len bytes) can tell apart, one of each kind, into reps
 * (ascending); returns how many. A pattern sees digits through classes (\d, [0-9], \w, .) that
 * take them all alike, and through the digits written in it: a digit d may differ from d - 1 and
 * d + 1, a range a-b from a - 1 and b + 1. Digits of a {m,n} quantifier say nothing (skipped);
 * any other written digit (in an escape such as \x35) only adds a distinction, which costs time,
 * never correctness. */
static int digit_reps(const char *body, size_t len, char reps[10])
{
    bool cut[11] = {false}; /* cut[k]: digits k - 1 and k may differ */
    bool in_class = false;
    for (size_t i = 0; i < len; i++) {
        char ch = body[i];
        if (ch == '\\' && i + 1 < len) {
            i++;
            if (body[i] >= '0' && body[i] <= '9')
                cut[body[i] - '0'] = cut[body[i] - '0' + 1] = true;
            continue;
        }
        if (!in_class && ch == '{') {
            size_t k = i + 1;
            while (k < len && ((body[k] >= '0' && body[k] <= '9') || body[k] == ','))
                k++;
            if (k < len && body[k] == '}') {
                i = k;
                continue;
            }
        }
        if (ch == '[')
            in_class = true;
        else if (ch == ']')
            in_class = false;
        if (ch < '0' || ch > '9')
            continue;
        if (in_class && i + 2 < len && body[i + 1] == '-' && body[i + 2] >= ch && body[i + 2] <= '9') {
            cut[ch - '0'] = cut[body[i + 2] - '0' + 1] = true;
            i += 2;
            continue;
        }
        cut[ch - '0'] = cut[ch - '0' + 1] = true;
    }
    int n = 0;
    for (int d = 0; d <= 9; d++)
        if (d == 0 || cut[d])
            reps[n++] = (char)('0' + d);
    return n;
}

/* Whether pattern re matches, whole, a string of 1 to STEP_DIGITS_MAX digits that extends
 * buf[0..len): a depth-first walk over strings of the digits reps[0..nreps) (one of each kind
 * the pattern tells apart) that goes on from a prefix only while PCRE2 finds a (partial) match
 * of it. Returns 1 (it does), 0 (it cannot) or -1 (*calls ran out, or a limit: cannot tell). */
static int digits_match(pcre2_code *re, pcre2_match_data *md, pcre2_match_context *mc, const char *reps, int nreps,
                        char *buf, size_t len, int *calls)
{
    if (len > 0) {
        if ((*calls -= 2) < 0)
            return -1;
        if (pcre2_match(re, (PCRE2_SPTR)buf, len, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, mc) >= 0)
            return 1;
        if (len == STEP_DIGITS_MAX)
            return 0;
        /* (PCRE2 refuses PCRE2_ENDANCHORED with partial matching) */
        int rc = pcre2_match(re, (PCRE2_SPTR)buf, len, 0, PCRE2_ANCHORED | PCRE2_PARTIAL_HARD, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH)
            return 0; /* nothing that starts with buf can match */
        if (rc < 0 && rc != PCRE2_ERROR_PARTIAL)
            return -1; /* a limit: cannot tell */
    }
    for (int k = 0; k < nreps; k++) {
        buf[len] = reps[k];
        int r = digits_match(re, md, mc, reps, nreps, buf, len + 1, calls);
        if (r != 0)
            return r;
    }
    return 0;
}

/* Whether the step group's text (body, len bytes) can capture a step number: 1 yes, 0 no, -1
 * undecided (it does not compile on its own, it looks around itself, or judging ran too long). */
static int step_group_numeric(const char *body, size_t len, bool x)
{
    for (size_t i = 0; i + 2 < len; i++)
        if (body[i] == '(' && (body[i + 1] == '*' || !strncmp(body + i + 1, "?=", 2) || !strncmp(body + i + 1, "?!", 2) ||
                               !strncmp(body + i + 1, "?<=", 3) || !strncmp(body + i + 1, "?<!", 3)))
            return -1; /* a lookaround (or a verb) sees text outside the group: only running it can tell */
    int code = 0;
    PCRE2_SIZE off = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)body, len,
                                   PCRE2_UTF | PCRE2_NEVER_BACKSLASH_C | (x ? PCRE2_EXTENDED : 0), &code, &off, NULL);
    if (!re)
        return -1; /* it calls or tests other groups */
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    int rc = -1;
    if (md && mc) {
        pcre2_set_match_limit(mc, STEP_JUDGE_LIMIT);
        char buf[STEP_DIGITS_MAX + 1], reps[10];
        int calls = STEP_JUDGE_CALLS, nreps = digit_reps(body, len, reps);
        rc = digits_match(re, md, mc, reps, nreps, buf, 0, &calls);
    }
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc;
}

/* The last verdicts of step_group_numeric, by the group's text: a spec is judged again for every
 * value a tuning job's parameters may take, with the same metric definitions each time. */
#define STEP_VERDICTS 32
static struct step_verdict {
    char body[257];
    size_t len;
    bool x;
    int verdict;
} step_verdicts[STEP_VERDICTS];
static int step_verdicts_next;
static pthread_mutex_t step_verdicts_lock = PTHREAD_MUTEX_INITIALIZER;

static int step_group_judged(const char *body, size_t len, bool x)
{
    bool keep = len < sizeof step_verdicts[0].body;
    if (keep) {
        pthread_mutex_lock(&step_verdicts_lock);
        for (int i = 0; i < STEP_VERDICTS; i++) {
            const struct step_verdict *v = &step_verdicts[i];
            if (v->len == len && v->x == x && len && !memcmp(v->body, body, len)) {
                int verdict = v->verdict;
                pthread_mutex_unlock(&step_verdicts_lock);
                return verdict;
            }
        }
        pthread_mutex_unlock(&step_verdicts_lock);
    }
    int verdict = step_group_numeric(body, len, x);
    if (keep) {
        pthread_mutex_lock(&step_verdicts_lock);
        struct step_verdict *v = &step_verdicts[step_verdicts_next];
        step_verdicts_next = (step_verdicts_next + 1) % STEP_VERDICTS;
        memcpy(v->body, body, len);
        v->len = len;
        v->x = x;
        v->verdict = verdict;
        pthread_mutex_unlock(&step_verdicts_lock);
    }
    return verdict;
}

void *kiln_metric_regex_compile(const char *regex, const char *field, int *value_group, int *step_group,
                                kiln_err_t *err)
{
    int code = 0;
    PCRE2_SIZE off = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_NEVER_BACKSLASH_C,
                                   &code, &off, NULL);
    if (!re) {
        if (code == PCRE2_ERROR_NOMEMORY) {
            kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory compiling %s", field);
            return NULL;
        }
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(code, msg, sizeof(msg));
        kiln_err_set(err, KILN_EINVAL, field, "%s does not compile: %s (at offset %zu)", field, (const char *)msg,
                     (size_t)off);
        kiln_err_hint(err, "use a Perl-compatible regular expression (PCRE2), e.g. \"val loss ([0-9.]+)\"");
        return NULL;
    }
    uint32_t groups = 0, backref = 0, opts = 0;
    pcre2_pattern_info(re, PCRE2_INFO_CAPTURECOUNT, &groups);
    pcre2_pattern_info(re, PCRE2_INFO_BACKREFMAX, &backref);
    pcre2_pattern_info(re, PCRE2_INFO_ALLOPTIONS, &opts);
    int step = pcre2_substring_number_from_name(re, (PCRE2_SPTR) "step");
    int value = step == 1 ? 2 : 1; /* the first group that is not the step */
    size_t n = strlen(regex);
    bool x = (opts & PCRE2_EXTENDED) != 0;
    for (size_t i = 0; !x && i + 2 < n; i++)
        if (regex[i] == '(' && regex[i + 1] == '?') /* an inline option setting with x: (?x) (?ix: */
            for (size_t k = i + 2; k < n && strchr("imnsxJU^-", regex[k]); k++)
                if (regex[k] == 'x')
                    x = true;
    const char *body = NULL;
    size_t blen = 0;
    if (groups < 1 || (uint32_t)value > groups) {
        kiln_err_set(err, KILN_EINVAL, field, "%s needs a capture group for the value%s", field,
                     step > 0 ? " besides its step group" : "");
        kiln_err_hint(err, "wrap the number in parentheses, e.g. \"val loss ([0-9.]+)\"");
    } else if (backref > 0) {
        kiln_err_set(err, KILN_EINVAL, field, "%s uses a backreference (to group %u), which metric definitions may not",
                     field, backref);
        kiln_err_hint(err, "match the text itself instead of referring back to a group");
    } else if (step == PCRE2_ERROR_NOUNIQUESUBSTRING) {
        kiln_err_set(err, KILN_EINVAL, field, "%s has more than one group named \"step\"", field);
        kiln_err_hint(err, "name one group step: the one that captures the step number, e.g. \"(?<step>[0-9]+)\"");
    } else if (step > 0 && step_group_body(regex, n, x, &body, &blen) && step_group_judged(body, blen, x) == 0) {
        kiln_err_set(err, KILN_EINVAL, field, "%s: its group \"step\" can never capture a step number (a whole number "
                     "of at most 19 digits)", field);
        kiln_err_hint(err, "capture the step's digits alone, e.g. \"step (?<step>[0-9]+)\"");
    } else {
        if (value_group)
            *value_group = value;
        if (step_group)
            *step_group = step > 0 ? step : 0;
        return re;
    }
    pcre2_code_free(re);
    return NULL;
}
