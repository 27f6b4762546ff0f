/* fuzz.h - what every fuzz target shares: the libFuzzer entry points' declarations, a quiet and
 * repeatable process (LLVMFuzzerInitialize: logging off, jansson's hash seed fixed so object
 * order is the same in every run), FUZZ_CHECK and a NUL-terminated copy of the input. Included
 * once by each fuzz/<target>.c, which defines LLVMFuzzerTestOneInput. */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A property every input must keep: when it does not, the target aborts (a crash to libFuzzer,
 * which saves the input). */
#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz: check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* libFuzzer calls this once before the first input; every target includes this header once
 * (one translation unit per binary), so it is defined here. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    log_set_level((log_level_t)(LOG_ERROR + 1)); /* above every level: nothing is logged */
    json_object_seed(1);
    return 0;
}

/* A heap copy of data[0..size) with a NUL after it (embedded NULs stay). Caller frees. */
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    FUZZ_CHECK(s);
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif /* KILN_FUZZ_H */
