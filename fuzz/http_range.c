/* http_range.c - fuzz target: the Range header of an artifact download (http_range_parse)
 * against a file size. Input: 8 bytes of size (any int64 >= 0), then the header's text (a C
 * string, as libmicrohttpd hands headers over). A satisfiable range must lie inside the file. */
#include "api/http_int.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint64_t u;
    memcpy(&u, data, 8);
    int64_t file_size = (int64_t)(u >> 1);
    char *h = fuzz_text(data + 8, size - 8);
    int64_t first = -7, last = -7;
    int rc = http_range_parse(h, file_size, &first, &last);
    FUZZ_CHECK(rc == -1 || rc == 0 || rc == 1);
    if (rc == 1)
        FUZZ_CHECK(0 <= first && first <= last && last < file_size);
    else
        FUZZ_CHECK(first == -7 && last == -7);
    free(h);
    return 0;
}
