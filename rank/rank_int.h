/* rank_int.h - what rank/'s files share and nothing outside rank/ includes: a growable array of
 * heap strings (an environment, an argument list). */
#ifndef KILN_RANK_INT_H
#define KILN_RANK_INT_H

#include <stdbool.h>
#include <stddef.h>

/* NULL-terminated once anything is in it (v[n] == NULL); oom: a push failed, the array is short.
 * Caller's storage, zero-initialised; free with rank_envp_free(v). */
typedef struct rank_strv {
    char **v;
    size_t n, cap;
    bool oom;
} rank_strv_t;

/* Appends s, taking ownership of it (freed when it cannot be kept; NULL sets oom). */
void rank_strv_push(rank_strv_t *b, char *s);
/* Appends "name=" followed by fmt's text, of any length (out of memory: b's oom flag is set). */
void rank_strv_pushf(rank_strv_t *b, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* KILN_RANK_INT_H */
