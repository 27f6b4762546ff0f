/* arena.c - bump allocator for request-, tick- and heartbeat-scoped memory.
 * Blocks are chained; big allocations get a block of their own. */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <assert.h>

struct arena_block {
    arena_block_t *prev;
    size_t size;  /* usable bytes in data */
    size_t used;
    _Alignas(16) unsigned char data[];
};

static arena_block_t *arena_block_new(size_t size, arena_block_t *prev)
{
    arena_block_t *b = malloc(sizeof(*b) + size);
    if (!b) {
        fprintf(stderr, "arena: out of memory allocating %zu bytes\n", size);
        abort();
    }
    b->prev = prev;
    b->size = size;
    b->used = 0;
    return b;
}

void arena_init(arena_t *a, size_t block_size)
{
    a->head = NULL;
    a->block_size = block_size ? block_size : 16 * 1024;
}

void arena_deinit(arena_t *a)
{
    arena_block_t *b = a->head;
    while (b) {
        arena_block_t *p = b->prev;
        free(b);
        b = p;
    }
    a->head = NULL;
}

void arena_reset(arena_t *a)
{
    if (!a->head)
        return;
    arena_block_t *b = a->head;
    while (b->prev) {
        arena_block_t *p = b->prev;
        free(b);
        b = p;
    }
    b->used = 0;
    a->head = b;
}

void *arena_alloc(arena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    arena_block_t *b = a->head;
    if (!b || b->size - b->used < n) {
        if (n > a->block_size / 2 && b) {
            /* Large allocation: own block, slotted behind the current one so the current
             * block keeps serving small requests. */
            arena_block_t *big = arena_block_new(n, b->prev);
            b->prev = big;
            big->used = n;
            memset(big->data, 0, n);
            return big->data;
        }
        b = arena_block_new(n > a->block_size ? n : a->block_size, b);
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *arena_strndup(arena_t *a, const char *s, size_t n)
{
    if (!s)
        return NULL;
    size_t len = strnlen(s, n);
    char *d = arena_alloc(a, len + 1);
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *arena_strdup(arena_t *a, const char *s)
{
    return s ? arena_strndup(a, s, strlen(s)) : NULL;
}

char *arena_sprintf(arena_t *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    assert(n >= 0);
    char *d = arena_alloc(a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(d, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return d;
}
