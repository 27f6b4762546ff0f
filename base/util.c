/* util.c - clocks, RFC 3339 times, bounded string copy and whole-file I/O with atomic replace. */
#include "base/base.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t kiln_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t kiln_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void kiln_deadline_in(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    int64_t ns = ts->tv_nsec + (ms % 1000) * 1000000;
    ts->tv_sec += (time_t)(ms / 1000 + ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

double kiln_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *kiln_time_format(int64_t us, char *buf, size_t n)
{
    time_t secs = (time_t)(us / 1000000);
    int ms = (int)((us % 1000000) / 1000);
    if (ms < 0) {
        ms += 1000;
        secs -= 1;
    }
    struct tm tm;
    gmtime_r(&secs, &tm);
    snprintf(buf, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
    return buf;
}

int kiln_time_parse(const char *s, int64_t *out_us)
{
    if (!s || !*s)
        return KILN_EINVAL;
    /* Plain Unix seconds: digits, possibly a fraction (no sign, exponent, "nan" or "inf"), and
     * not past the year 9999. */
    size_t nd = strspn(s, "0123456789");
    if (nd > 0 && (s[nd] == '\0' || (s[nd] == '.' && s[nd + 1] && strspn(s + nd + 1, "0123456789") == strlen(s + nd + 1)))) {
        double secs = strtod(s, NULL);
        if (!(secs >= 0 && secs < 253402300800.0))
            return KILN_EINVAL;
        *out_us = (int64_t)(secs * 1e6);
        return 0;
    }
    int Y, M, D, h, m, sec;
    int used = 0;
    if (sscanf(s, "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &Y, &M, &D, &h, &m, &sec, &used) != 6)
        return KILN_EINVAL;
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (M < 1 || M > 12 || D < 1 || D > mdays[M - 1] || h > 23 || m > 59 || sec > 60)
        return KILN_EINVAL; /* 2026-02-30 is no day, nor 2026-04-31 */
    if (M == 2 && D == 29 && !(Y % 4 == 0 && (Y % 100 != 0 || Y % 400 == 0)))
        return KILN_EINVAL;
    const char *p = s + used;
    int64_t frac_us = 0;
    if (*p == '.') {
        p++;
        int64_t scale = 100000;
        if (*p < '0' || *p > '9')
            return KILN_EINVAL;
        while (*p >= '0' && *p <= '9') {
            frac_us += (*p - '0') * scale;
            scale /= 10;
            p++;
        }
    }
    int64_t offset_s = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om;
        if (sscanf(p + 1, "%2d:%2d", &oh, &om) != 2)
            return KILN_EINVAL;
        offset_s = (int64_t)(oh * 3600 + om * 60) * (*p == '-' ? -1 : 1);
        p += 6;
    } else {
        return KILN_EINVAL;
    }
    if (*p)
        return KILN_EINVAL;
    struct tm tm = {0};
    tm.tm_year = Y - 1900;
    tm.tm_mon = M - 1;
    tm.tm_mday = D;
    tm.tm_hour = h;
    tm.tm_min = m;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);
    *out_us = ((int64_t)t - offset_s) * 1000000 + frac_us;
    return 0;
}

bool kiln_duration_parse(const char *s, int64_t *seconds)
{
    if (!s || !isdigit((unsigned char)*s))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno)
        return false;
    int64_t unit;
    if (!*end || !strcmp(end, "s"))
        unit = 1;
    else if (!strcmp(end, "m"))
        unit = 60;
    else if (!strcmp(end, "h"))
        unit = 3600;
    else if (!strcmp(end, "d"))
        unit = 86400;
    else
        return false;
    const int64_t max = 100LL * 366 * 86400;
    if (v <= 0 || v > max / unit)
        return false;
    *seconds = (int64_t)v * unit;
    return true;
}

bool kiln_ident_ok(const char *s)
{
    if (!s || !s[0])
        return false;
    size_t n = 0;
    for (const char *p = s; *p; p++, n++) {
        char ch = *p;
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (!alnum && (p == s || (ch != '.' && ch != '_' && ch != '-')))
            return false;
    }
    return n <= 63;
}

int kiln_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = c < del ? (c < ins ? c : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

size_t kiln_strlcpy(char *dst, const char *src, size_t n)
{
    size_t len = strlen(src);
    if (n) {
        size_t c = len < n - 1 ? len : n - 1;
        memcpy(dst, src, c);
        dst[c] = '\0';
    }
    return len;
}

uint64_t kiln_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

bool kiln_names_init(kiln_names_t *x, const char *const *names, int stride, int most)
{
    *x = (kiln_names_t){.names = names, .stride = stride, .cap = 16};
    while (x->cap < 2 * (size_t)KILN_MAX(most, 0))
        x->cap *= 2;
    if (!(x->slot = malloc(x->cap * sizeof(*x->slot))))
        return false;
    for (size_t k = 0; k < x->cap; k++)
        x->slot[k] = -1;
    return true;
}

int kiln_names_find(const kiln_names_t *x, const char *const *key, size_t *at)
{
    uint64_t h = KILN_FNV1A_START;
    for (int s = 0; s < x->stride; s++) /* each with its NUL, so that ("ab", "c") is not ("a", "bc") */
        h = kiln_fnv1a(h, key[s], strlen(key[s]) + 1);
    size_t k = h & (x->cap - 1);
    for (; x->slot[k] >= 0; k = (k + 1) & (x->cap - 1)) {
        const char *const *have = &x->names[(size_t)x->slot[k] * (size_t)x->stride];
        int s = 0;
        while (s < x->stride && !strcmp(have[s], key[s]))
            s++;
        if (s == x->stride)
            return x->slot[k];
    }
    if (at)
        *at = k;
    return -1;
}

void kiln_names_add_all(kiln_names_t *x, int n)
{
    for (size_t at; x->n < n; x->n++)
        if (kiln_names_find(x, &x->names[(size_t)x->n * (size_t)x->stride], &at) < 0)
            x->slot[at] = x->n;
}

void kiln_names_free(kiln_names_t *x)
{
    free(x->slot);
    x->slot = NULL;
}

int kiln_file_read(const char *path, char **out, size_t *out_len, kiln_err_t *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kiln_err_set(err, errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, NULL,
                            "could not open file \"%s\": %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 65536) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory reading \"%s\"", path);
            }
            buf = nb;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0)
            break;
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        fclose(f);
        return kiln_err_set(err, KILN_EIO, NULL, "could not read file \"%s\": %s", path, strerror(e));
    }
    fclose(f);
    buf[len] = '\0';
    *out = buf;
    if (out_len)
        *out_len = len;
    return 0;
}

int kiln_file_write_atomic(const char *path, const void *data, size_t len, kiln_err_t *err)
{
    return kiln_file_write_atomic_mode(path, data, len, 0644, err);
}

int kiln_file_write_atomic_mode(const char *path, const void *data, size_t len, unsigned mode,
                                kiln_err_t *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    /* a leftover of a crashed writer could carry another mode: start from a fresh file */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not create \"%s\": %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return kiln_err_set(err, KILN_EIO, NULL, "could not write \"%s\": %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return kiln_err_set(err, KILN_EIO, NULL, "could not flush \"%s\": %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return kiln_err_set(err, KILN_EIO, NULL, "could not rename \"%s\" to \"%s\": %s", tmp, path, strerror(e));
    }
    char dir[4096];
    kiln_strlcpy(dir, path, sizeof(dir));
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int kiln_mkdirs(const char *path, kiln_err_t *err)
{
    return kiln_mkdirs_mode(path, 0755, err);
}

int kiln_mkdirs_mode(const char *path, unsigned mode, kiln_err_t *err)
{
    char buf[4096];
    if (kiln_strlcpy(buf, path, sizeof(buf)) >= sizeof(buf))
        return kiln_err_set(err, KILN_EINVAL, NULL, "path too long: \"%s\"", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST)
                return kiln_err_set(err, KILN_EIO, NULL, "could not create directory \"%s\": %s", buf,
                                    strerror(errno));
            *p = c;
            if (c == '\0')
                break;
        }
    }
    return 0;
}

