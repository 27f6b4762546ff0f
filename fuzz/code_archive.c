/* code_archive.c - fuzz target: a code archive as `POST /v1/code` receives it and an agent
 * extracts it (code/archive.c). Input: one byte, then the archive: when the byte is even, the rest
 * is a tar that the target gzips first (so mutations reach the tar headers rather than break the
 * gzip stream's checksum), else the bytes as sent. code_archive_check refuses with a
 * message naming what is wrong, or accepts within the limits; an archive it accepts extracts
 * (code_archive_extract_fd, from a memfd) with the same counts into a fresh directory, and
 * nothing appears beside that directory. The only target that writes files: a private
 * temporary directory, emptied after each input. */
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "code/code.h"
#include "fuzz/fuzz.h"

static char g_dir[64];

static void remove_dir(void)
{
    rmdir(g_dir);
}

/* Entries in g_dir (the extraction's parent). */
static int entries_beside(void)
{
    DIR *d = opendir(g_dir);
    FUZZ_CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* data[0..size) gzip'd into a malloc'd buffer (*out, *out_len). */
static void gzip(const uint8_t *data, size_t size, uint8_t **out, size_t *out_len)
{
    z_stream z = {0};
    FUZZ_CHECK(deflateInit2(&z, 1, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t cap = deflateBound(&z, size) + 64;
    *out = malloc(cap);
    FUZZ_CHECK(*out);
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)size;
    z.next_out = *out;
    z.avail_out = (uInt)cap;
    FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
}

static int one(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        return one(data + 1, size - 1);
    uint8_t *gz = NULL;
    size_t gz_len = 0;
    gzip(data + 1, size - 1, &gz, &gz_len);
    one(gz, gz_len);
    free(gz);
    return 0;
}

static int one(const uint8_t *data, size_t size)
{
    code_limits_t lim = {.max_entries = 200, .max_file_bytes = 256 * 1024, .max_total_bytes = 1024 * 1024};
    code_stats_t st = {0};
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = code_archive_check(data, size, &lim, &st, &err);
    FUZZ_CHECK(rc == 0 || rc == KILN_EINVAL || rc == KILN_ENOMEM);
    if (rc) {
        FUZZ_CHECK(err.message[0]);
        return 0;
    }
    FUZZ_CHECK(st.files >= 1 && st.files <= st.entries && st.entries <= lim.max_entries);
    FUZZ_CHECK(st.bytes >= 0 && st.bytes <= lim.max_total_bytes);

    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/kiln-fuzz-code.XXXXXX");
        FUZZ_CHECK(mkdtemp(g_dir));
        atexit(remove_dir);
    }
    int fd = memfd_create("archive", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(write(fd, data, size) == (ssize_t)size && lseek(fd, 0, SEEK_SET) == 0);
    char dest[96];
    snprintf(dest, sizeof dest, "%s/x", g_dir);
    code_stats_t xs = {0};
    rc = code_archive_extract_fd(fd, dest, &lim, &xs, &err);
    close(fd);
    if (rc)
        fprintf(stderr, "fuzz: an archive the check accepts does not extract: %s\n", err.message);
    FUZZ_CHECK(rc == 0);
    FUZZ_CHECK(xs.entries == st.entries && xs.files == st.files && xs.bytes == st.bytes);
    FUZZ_CHECK(entries_beside() == 1);
    FUZZ_CHECK(code_tree_remove(dest) == 0 && entries_beside() == 0);
    return 0;
}
