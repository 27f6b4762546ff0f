/* artifact.c - what the agent, kilnd and the CLI agree on about artifacts: which names exist
 * (the same rule where a name is read from a directory, refused in a request, and made into a
 * path) and SHA-256 over bytes, files and streams (libsodium's crypto_hash_sha256). */
#include "base/base.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(sizeof(crypto_hash_sha256_state) <= sizeof(((kiln_sha256_t *)0)->state),
               "kiln_sha256_t too small for libsodium's state");

bool kiln_artifact_name_ok(const char *name, const char *field, kiln_err_t *err)
{
    static const char hint[] = "artifact names are 1 to 128 characters of A-Z a-z 0-9 . _ -, starting with a "
                               "letter or digit (the files at the top of a job's output directory)";
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > KILN_ARTIFACT_NAME_MAX) {
        kiln_err_set(err, KILN_EINVAL, field, "%s must have 1 to %d characters (got %zu)", field,
                     KILN_ARTIFACT_NAME_MAX, n);
        kiln_err_hint(err, "%s", hint);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (alnum || (i > 0 && (ch == '.' || ch == '_' || ch == '-')))
            continue;
        if (ch == '/')
            kiln_err_set(err, KILN_EINVAL, field, "%s may not contain '/' (an artifact is one file, not a path)",
                         field);
        else if (i == 0)
            kiln_err_set(err, KILN_EINVAL, field, "%s must start with a letter or digit", field);
        else
            kiln_err_set(err, KILN_EINVAL, field, "%s has a character artifact names may not hold (byte %zu)",
                         field, i);
        kiln_err_hint(err, "%s", hint);
        return false;
    }
    return true;
}

bool kiln_artifact_path_ok(const char *path, const char *field, kiln_err_t *err)
{
    static const char hint[] = "a checkpoint file's path is up to 16 names joined by '/', relative to the checkpoint "
                               "directory; each name is 1 to 128 characters of A-Z a-z 0-9 . _ -, starting with a "
                               "letter or digit";
    size_t n = path ? strlen(path) : 0;
    if (n == 0 || n > KILN_ARTIFACT_PATH_MAX) {
        kiln_err_set(err, KILN_EINVAL, field, "%s must have 1 to %d characters (got %zu)", field,
                     KILN_ARTIFACT_PATH_MAX, n);
        kiln_err_hint(err, "%s", hint);
        return false;
    }
    int depth = 0;
    for (const char *p = path;; depth++) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        char name[KILN_ARTIFACT_NAME_MAX + 2];
        if (depth == KILN_ARTIFACT_PATH_DEPTH) {
            kiln_err_set(err, KILN_EINVAL, field, "%s has more than %d names", field, KILN_ARTIFACT_PATH_DEPTH);
            kiln_err_hint(err, "%s", hint);
            return false;
        }
        if (len == 0 || len > KILN_ARTIFACT_NAME_MAX) {
            if (len)
                kiln_err_set(err, KILN_EINVAL, field, "%s has a name longer than %d characters (at byte %zu)", field,
                             KILN_ARTIFACT_NAME_MAX, (size_t)(p - path));
            else
                kiln_err_set(err, KILN_EINVAL, field, "%s has an empty name at byte %zu (a leading, trailing or "
                             "doubled '/')", field, (size_t)(p - path));
            kiln_err_hint(err, "%s", hint);
            return false;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        if (!kiln_artifact_name_ok(name, field, NULL)) {
            kiln_err_set(err, KILN_EINVAL, field, "%s has a name that is not allowed at byte %zu (\".\", \"..\", a "
                         "hidden name or a character names may not hold)", field, (size_t)(p - path));
            kiln_err_hint(err, "%s", hint);
            return false;
        }
        if (!slash)
            return true;
        p = slash + 1;
    }
}

bool kiln_sha256_hex_ok(const char *s)
{
    if (!s || strlen(s) != 64)
        return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static void sha256_hex_of(const unsigned char digest[crypto_hash_sha256_BYTES], char out[KILN_SHA256_HEX])
{
    static const char hexd[] = "0123456789abcdef";
    for (size_t i = 0; i < crypto_hash_sha256_BYTES; i++) {
        out[2 * i] = hexd[digest[i] >> 4];
        out[2 * i + 1] = hexd[digest[i] & 15];
    }
    out[64] = '\0';
}

void kiln_sha256_hex(const void *data, size_t len, char out[KILN_SHA256_HEX])
{
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(d, data, len);
    sha256_hex_of(d, out);
}

void kiln_sha256_init(kiln_sha256_t *h)
{
    crypto_hash_sha256_init((crypto_hash_sha256_state *)(void *)h->state);
}

void kiln_sha256_update(kiln_sha256_t *h, const void *data, size_t len)
{
    crypto_hash_sha256_update((crypto_hash_sha256_state *)(void *)h->state, data, len);
}

void kiln_sha256_final(kiln_sha256_t *h, char out[KILN_SHA256_HEX])
{
    unsigned char d[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final((crypto_hash_sha256_state *)(void *)h->state, d);
    sha256_hex_of(d, out);
}

int kiln_sha256_fd(int fd, int64_t *size, char out[KILN_SHA256_HEX], kiln_err_t *err)
{
    enum { PIECE = 1 << 20 };
    unsigned char *buf = malloc(PIECE);
    if (!buf)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    kiln_sha256_t h;
    kiln_sha256_init(&h);
    int64_t off = 0;
    for (;;) {
        ssize_t n = pread(fd, buf, PIECE, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return kiln_err_set(err, KILN_EIO, NULL, "could not read a file to checksum it: %s", strerror(e));
        }
        if (n == 0)
            break;
        kiln_sha256_update(&h, buf, (size_t)n);
        off += n;
    }
    free(buf);
    kiln_sha256_final(&h, out);
    if (size)
        *size = off;
    return 0;
}
