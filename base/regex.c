/* regex.c - the one place a metric definition's pattern is compiled and judged, so that spec/
 * refuses at submission exactly what kiln-agent would refuse when it runs the job. */
#include "base/base.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>

void *kiln_metric_regex_compile(const char *regex, const char *field, kiln_err_t *err)
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
    uint32_t groups = 0, backref = 0;
    pcre2_pattern_info(re, PCRE2_INFO_CAPTURECOUNT, &groups);
    pcre2_pattern_info(re, PCRE2_INFO_BACKREFMAX, &backref);
    if (groups < 1) {
        kiln_err_set(err, KILN_EINVAL, field, "%s needs a capture group for the value", field);
        kiln_err_hint(err, "wrap the number in parentheses, e.g. \"val loss ([0-9.]+)\"");
    } else if (backref > 0) {
        kiln_err_set(err, KILN_EINVAL, field, "%s uses a backreference (to group %u), which metric definitions may not",
                     field, backref);
        kiln_err_hint(err, "match the text itself instead of referring back to a group");
    } else {
        return re;
    }
    pcre2_code_free(re);
    return NULL;
}
