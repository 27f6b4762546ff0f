/* mark.c - step marks: the one writer (kiln-train writes every mark with it) and the one parser
 * (the agent reads every stdout and stderr line with it) of the line that tells which step the
 * lines after it belong to. Not the metric definitions that use the step (agent/metrics.c). */
#include "rank/rank.h"

#include <stdio.h>
#include <string.h>

#define MARK_PREFIX_LEN (sizeof(RANK_STEP_MARK_PREFIX) - 1)

int rank_step_mark_format(int64_t step, char *buf, size_t n)
{
    if (n > 0)
        buf[0] = '\0';
    if (step < 0 || n < RANK_STEP_MARK_MAX)
        return -1;
    int len = snprintf(buf, n, RANK_STEP_MARK_PREFIX "%lld\n", (long long)step);
    return len > 0 && (size_t)len < n ? len : -1;
}

int rank_step_mark_write(FILE *f, int64_t step)
{
    char buf[RANK_STEP_MARK_MAX];
    if (rank_step_mark_format(step, buf, sizeof(buf)) < 0 || fputs(buf, f) == EOF)
        return KILN_EIO;
    return 0;
}

bool rank_step_mark_parse(const char *line, size_t len, int64_t *step)
{
    char digits[24];
    size_t nd = len > MARK_PREFIX_LEN ? len - MARK_PREFIX_LEN : 0;
    if (nd == 0 || nd >= sizeof(digits) || memcmp(line, RANK_STEP_MARK_PREFIX, MARK_PREFIX_LEN))
        return false;
    memcpy(digits, line + MARK_PREFIX_LEN, nd);
    digits[nd] = '\0';
    int64_t v;
    /* one spelling per step, the writer's: digits only, no leading zero */
    if (digits[0] < '0' || digits[0] > '9' || (digits[0] == '0' && nd > 1) || kiln_parse_int64(digits, &v))
        return false;
    *step = v;
    return true;
}
