/* log.c - line-oriented logging to stderr with a level filter.
 * One write(2) per line so lines from threads and processes never interleave mid-line. */
#include "base/base.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <stdlib.h>
#include <unistd.h>

static const char *log_program = "kiln";
static log_level_t log_level = LOG_INFO;

static const char *const log_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

void log_init(const char *program)
{
    if (program)
        log_program = program;
}

int log_level_parse(const char *name, log_level_t *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, names[i])) {
            *out = (log_level_t)i;
            return 0;
        }
    return KILN_EINVAL;
}

void log_set_level(log_level_t level) { log_level = level; }

bool log_enabled(log_level_t level) { return level >= log_level; }

void log_vwrite(log_level_t level, const char *fmt, va_list ap)
{
    if (!log_enabled(level))
        return;
    char line[4096];
    char ts[40];
    kiln_time_format(kiln_now_us(), ts, sizeof(ts));
    int n = snprintf(line, sizeof(line), "%s %s %s: ", ts, log_names[level], log_program);
    if (n < 0)
        return;
    char msg[sizeof(line)];
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (m < 0)
        return;
    /* One record a line, as it was formatted: a newline, CR or escape sequence in what others
     * wrote (a job's output quoted in a message) neither starts a line of its own nor acts on the
     * terminal of whoever reads the log (kiln_text_escape). */
    size_t len = (size_t)n + kiln_text_escape(line + n, sizeof(line) - (size_t)n - 1, msg,
                                              KILN_MIN((size_t)m, sizeof(msg) - 1), 0);
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void log_write(log_level_t level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, fmt, ap);
    va_end(ap);
}
