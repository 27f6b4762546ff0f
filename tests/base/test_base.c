/* test_base.c - the base module: status table, rich errors, arenas, flags, time parsing, atomic files. */
#include "base/api_names.h"
#include "base/base.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

Test(status, table_maps_every_code)
{
    cr_assert_str_eq(kiln_status_code(KILN_EINVAL), "invalid_argument");
    cr_assert_eq(kiln_status_http(KILN_EINVAL), 400);
    cr_assert_eq(kiln_status_grpc(KILN_EINVAL), 3);
    cr_assert_eq(kiln_status_http(KILN_ENOTFOUND), 404);
    cr_assert_eq(kiln_status_grpc(KILN_ENOTFOUND), 5);
    cr_assert_eq(kiln_status_http(KILN_OK), 200);
    cr_assert_eq(kiln_status_http(-999), 500);
    cr_assert_str_eq(kiln_strerror(-999), "unknown error");
}

Test(status, err_set_names_field)
{
    kiln_err_t e;
    int rc = kiln_err_set(&e, KILN_EINVAL, "model.n_head", "must divide n_embd (%d)", 384);
    cr_assert_eq(rc, KILN_EINVAL);
    cr_assert_str_eq(e.field, "model.n_head");
    cr_assert_str_eq(e.message, "must divide n_embd (384)");
    kiln_err_hint(&e, "try %d", 6);
    cr_assert_str_eq(e.hint, "try 6");
    cr_assert_eq(kiln_err_set(NULL, KILN_EIO, NULL, "x"), KILN_EIO);
}

Test(arena, allocations_are_aligned_zeroed_and_survive_growth)
{
    arena_t a;
    arena_init(&a, 256);
    char *first = arena_strdup(&a, "hello");
    for (int i = 0; i < 1000; i++) {
        unsigned char *p = arena_alloc(&a, (size_t)(i % 97) + 1);
        cr_assert_eq(((uintptr_t)p) % 16, 0);
        for (int k = 0; k < (i % 97) + 1; k++)
            cr_assert_eq(p[k], 0);
        memset(p, 0xab, (size_t)(i % 97) + 1);
    }
    void *big = arena_alloc(&a, 100000);
    memset(big, 1, 100000);
    cr_assert_str_eq(first, "hello");
    cr_assert_str_eq(arena_sprintf(&a, "%s-%d", "job", 7), "job-7");
    arena_reset(&a);
    cr_assert_str_eq(arena_strdup(&a, "again"), "again");
    arena_deinit(&a);
}

Test(config, flags_env_and_defaults)
{
    const char *url = NULL, *addr = "127.0.0.1:8080";
    int64_t slots = 1;
    bool verbose = false;
    double rate = 1.5;
    config_flag_t flags[] = {
        {"database-url", "KILN_TEST_DBURL", CONFIG_STR, &url, CONFIG_ANY, "db"},
        {"http-addr", "KILN_TEST_HTTP", CONFIG_STR, &addr, CONFIG_ANY, "addr"},
        {"slots", "KILN_TEST_SLOTS", CONFIG_INT, &slots, CONFIG_RANGE(1, 64), "slots"},
        {"verbose", NULL, CONFIG_BOOL, &verbose, CONFIG_ANY, "v"},
        {"rate", NULL, CONFIG_DOUBLE, &rate, CONFIG_ANY, "r"},
    };
    setenv("KILN_TEST_SLOTS", "4", 1);
    setenv("KILN_TEST_DBURL", "from-env", 1);
    char *argv[] = {"prog", "--database-url=x", "--verbose", "pos", "--rate", "2.5", NULL};
    int npos = 0;
    kiln_err_t err;
    cr_assert_eq(config_parse(6, argv, flags, 5, NULL, &npos, &err), 0, "%s", err.message);
    cr_assert_str_eq(url, "x");
    cr_assert_str_eq(addr, "127.0.0.1:8080");
    cr_assert_eq(slots, 4);
    cr_assert(verbose);
    cr_assert_float_eq(rate, 2.5, 1e-12);
    cr_assert_eq(npos, 1);
    cr_assert_str_eq(argv[0], "pos");

    char *bad[] = {"prog", "--slots", "many", NULL};
    cr_assert_eq(config_parse(3, bad, flags, 5, NULL, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "expected an integer"));
    char *unknown[] = {"prog", "--nope", NULL};
    cr_assert_eq(config_parse(2, unknown, flags, 5, NULL, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "unknown option"));
}

Test(config, ranges_and_choices_are_checked_naming_where_the_value_came_from)
{
    int64_t slots = 8;
    double rate = 1.5;
    const char *level = "info";
    config_flag_t flags[] = {
        {"slots", "KILN_TEST_SLOTS2", CONFIG_INT, &slots, CONFIG_RANGE(1, 64), "slots"},
        {"rate", NULL, CONFIG_DOUBLE, &rate, CONFIG_RANGE(0, 10), "r"},
        {"log-level", "KILN_TEST_LEVEL", CONFIG_STR, &level, CONFIG_ONE_OF(LOG_LEVEL_CHOICES), "level"},
    };
    kiln_err_t err;
    char *over[] = {"prog", "--slots=65", NULL};
    cr_assert_eq(config_parse(2, over, flags, 3, NULL, NULL, &err), KILN_EINVAL);
    cr_assert_str_eq(err.message, "invalid value \"65\" for --slots: it must be 1 to 64");
    cr_assert_str_eq(err.field, "slots");
    char *under[] = {"prog", "--rate", "-0.5", NULL};
    cr_assert_eq(config_parse(3, under, flags, 3, NULL, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "--rate"), "%s", err.message);
    char *nan[] = {"prog", "--rate=nan", NULL};
    cr_assert_eq(config_parse(2, nan, flags, 3, NULL, NULL, &err), KILN_EINVAL);
    char *none[] = {"prog", NULL};
    setenv("KILN_TEST_LEVEL", "loud", 1);
    cr_assert_eq(config_parse(1, none, flags, 3, NULL, NULL, &err), KILN_EINVAL);
    cr_assert_str_eq(err.message, "invalid value \"loud\" for KILN_TEST_LEVEL: expected one of debug|info|warn|error");
    setenv("KILN_TEST_LEVEL", "warn", 1);
    setenv("KILN_TEST_SLOTS2", "0", 1);
    cr_assert_eq(config_parse(1, none, flags, 3, NULL, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "KILN_TEST_SLOTS2"), "%s", err.message);
    setenv("KILN_TEST_SLOTS2", "64", 1);
    cr_assert_eq(config_parse(1, none, flags, 3, NULL, NULL, &err), 0, "%s", err.message);
    cr_assert_eq(slots, 64);
    cr_assert_str_eq(level, "warn");
    unsetenv("KILN_TEST_SLOTS2");
    unsetenv("KILN_TEST_LEVEL");

    /* the table as --print-settings writes it */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    config_print_settings(f, flags, 3);
    fclose(f);
    cr_assert_str_eq(text, "slots\tKILN_TEST_SLOTS2\tint\t1\t64\t-\t64\t0\tslots\n"
                           "rate\t-\tnumber\t0\t10\t-\t1.5\t0\tr\n"
                           "log-level\tKILN_TEST_LEVEL\tstr\t-\t-\tdebug|info|warn|error\twarn\t0\tlevel\n");
    free(text);
}

Test(config, list_flags_repeat_and_split_the_environment)
{
    config_list_t roots = {0}, origins = {0};
    config_flag_t flags[] = {
        {"data-root", "KILN_TEST_ROOTS", CONFIG_LIST, &roots, CONFIG_ANY, "roots"},
        {"cors-origin", "KILN_TEST_ORIGINS", CONFIG_LIST, &origins, CONFIG_ANY, "origins"},
    };
    setenv("KILN_TEST_ROOTS", "/ignored", 1);
    setenv("KILN_TEST_ORIGINS", "https://a.example,https://b.example:8443", 1);
    char *argv[] = {"prog", "--data-root", "/data", "--data-root=/mnt/shared", NULL};
    kiln_err_t err;
    cr_assert_eq(config_parse(4, argv, flags, 2, NULL, NULL, &err), 0, "%s", err.message);
    cr_assert_eq(roots.n, 2, "a flag given on the command line ignores the environment");
    cr_assert_str_eq(roots.v[0], "/data");
    cr_assert_str_eq(roots.v[1], "/mnt/shared");
    cr_assert_eq(origins.n, 2);
    cr_assert_str_eq(origins.v[0], "https://a.example");
    cr_assert_str_eq(origins.v[1], "https://b.example:8443");
    char *empty[] = {"prog", "--data-root=", NULL};
    config_list_t r2 = {0};
    flags[0].value = &r2;
    cr_assert_eq(config_parse(2, empty, flags, 1, NULL, NULL, &err), KILN_EINVAL);
}

Test(time, format_and_parse_round_trip)
{
    int64_t us = 1795000000123000LL;
    char buf[40];
    kiln_time_format(us, buf, sizeof(buf));
    int64_t back = 0;
    cr_assert_eq(kiln_time_parse(buf, &back), 0);
    cr_assert_eq(back, us);
    cr_assert_eq(kiln_time_parse("2026-11-21T06:00:00+01:00", &back), 0);
    int64_t utc = 0;
    cr_assert_eq(kiln_time_parse("2026-11-21T05:00:00Z", &utc), 0);
    cr_assert_eq(back, utc);
    cr_assert_eq(kiln_time_parse("1700000000", &back), 0);
    cr_assert_eq(back, 1700000000LL * 1000000);
    cr_assert_eq(kiln_time_parse("yesterday", &back), KILN_EINVAL);
    cr_assert_eq(kiln_time_parse("2026-13-01T00:00:00Z", &back), KILN_EINVAL);
    /* days a month does not have are no time, not the next month's first days */
    cr_assert_eq(kiln_time_parse("2026-02-30T00:00:00Z", &back), KILN_EINVAL);
    cr_assert_eq(kiln_time_parse("2026-04-31T00:00:00Z", &back), KILN_EINVAL);
    cr_assert_eq(kiln_time_parse("2026-02-29T00:00:00Z", &back), KILN_EINVAL);
    cr_assert_eq(kiln_time_parse("2100-02-29T00:00:00Z", &back), KILN_EINVAL);
    cr_assert_eq(kiln_time_parse("2028-02-29T00:00:00Z", &back), 0);
    cr_assert_eq(kiln_time_parse("2000-02-29T00:00:00Z", &back), 0);
    cr_assert_eq(kiln_time_parse("2026-12-31T23:59:59Z", &back), 0);
}

Test(file, atomic_write_then_read)
{
    char dir[] = "/tmp/kiln-base-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/a/b/c.txt", dir);
    char sub[256];
    snprintf(sub, sizeof(sub), "%s/a/b", dir);
    kiln_err_t err;
    cr_assert_eq(kiln_mkdirs(sub, &err), 0);
    cr_assert_eq(kiln_file_write_atomic(path, "data", 4, &err), 0);
    char *out = NULL;
    size_t len = 0;
    cr_assert_eq(kiln_file_read(path, &out, &len, &err), 0);
    cr_assert_eq(len, 4);
    cr_assert_str_eq(out, "data");
    free(out);
    snprintf(path, sizeof(path), "%s/missing", dir);
    cr_assert_eq(kiln_file_read(path, &out, &len, &err), KILN_ENOTFOUND);
    cr_assert(strstr(err.message, "could not open"));
}

Test(file, private_files_and_directories)
{
    char dir[] = "/tmp/kiln-base-XXXXXX";
    cr_assert(mkdtemp(dir));
    umask(0);
    char sub[256], path[300];
    snprintf(sub, sizeof(sub), "%s/p/q", dir);
    kiln_err_t err;
    cr_assert_eq(kiln_mkdirs_mode(sub, 0700, &err), 0);
    struct stat st;
    cr_assert_eq(stat(sub, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0700);
    snprintf(path, sizeof(path), "%s/p", dir);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0700);
    /* A leftover temporary file of the same pid, readable by all, does not lend its mode. */
    snprintf(path, sizeof(path), "%s/secret.tmp.%d", sub, (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fclose(f);
    chmod(path, 0666);
    snprintf(path, sizeof(path), "%s/secret", sub);
    cr_assert_eq(kiln_file_write_atomic_mode(path, "s3cret", 6, 0600, &err), 0);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
    /* The default stays 0644 (before the umask). */
    cr_assert_eq(kiln_file_write_atomic(path, "x", 1, &err), 0);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0644);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Artifact names: what may become a file name in kilnd's store and a URL segment. */
Test(base, artifact_names)
{
    const char *good[] = {"model_llmc.bin", "partition_plan.json", "samples.txt", "A", "9.tar.gz", "x-y_z.1"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert(kiln_artifact_name_ok(good[i], "name", NULL), "%s", good[i]);
    char long_name[200];
    memset(long_name, 'b', 129);
    long_name[129] = '\0';
    const char *bad[] = {"", ".", "..", "../x", "a/b", "/abs", ".hidden", "-x", "_x", "a b", "a\\b", "a:b", "caf\xc3\xa9",
                         "x\n", long_name};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_err_t err;
        cr_assert_not(kiln_artifact_name_ok(bad[i], "files[3].name", &err), "\"%s\"", bad[i]);
        cr_assert_str_eq(err.field, "files[3].name");
        cr_assert(err.hint[0]);
    }
    long_name[128] = '\0';
    cr_assert(kiln_artifact_name_ok(long_name, "name", NULL), "128 characters are allowed");
}

/* Checkpoint paths: relative, every name an artifact name, bounded in length and depth. */
Test(base, artifact_paths)
{
    const char *good[] = {"state.json", "checkpoint-500/model.safetensors", "a/b/c/d.pt", "x-1/y_2/z.3"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert(kiln_artifact_path_ok(good[i], "name", NULL), "%s", good[i]);
    char deep[64] = "", long_path[600];
    for (int i = 0; i < 17; i++)
        strcat(deep, i ? "/a" : "a");
    memset(long_path, 'b', 513);
    long_path[513] = '\0';
    for (int i = 100; i < 513; i += 100)
        long_path[i] = '/';
    const char *bad[] = {"", "/abs", "a/", "a//b", "./a", "a/./b", "a/../b", "..", "../x", "a/.hidden", "a/-x",
                         "a\\b/c", "a/b c", deep, long_path};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_err_t err;
        cr_assert_not(kiln_artifact_path_ok(bad[i], "files[2].name", &err), "\"%s\"", bad[i]);
        cr_assert_str_eq(err.field, "files[2].name");
        cr_assert(err.hint[0]);
    }
    deep[strlen(deep) - 2] = '\0';
    cr_assert(kiln_artifact_path_ok(deep, "name", NULL), "16 names are allowed");
}

/* SHA-256 against the published test vectors (FIPS 180-2), whole and in pieces and from a file. */
Test(base, sha256_vectors)
{
    char out[KILN_SHA256_HEX];
    kiln_sha256_hex("", 0, out);
    cr_assert_str_eq(out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    kiln_sha256_hex("abc", 3, out);
    cr_assert_str_eq(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    kiln_sha256_t h;
    kiln_sha256_init(&h);
    const char *msg = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    size_t len = strlen(msg);
    for (size_t i = 0; i < len; i += 5)
        kiln_sha256_update(&h, msg + i, len - i < 5 ? len - i : 5);
    kiln_sha256_final(&h, out);
    cr_assert_str_eq(out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    cr_assert(kiln_sha256_hex_ok(out));
    cr_assert_not(kiln_sha256_hex_ok("248D6A61D20638B8E5C026930C3E6039A33CE45964FF2167F6ECEDD419DB06C1"));
    cr_assert_not(kiln_sha256_hex_ok("abc"));
    char path[] = "/tmp/kiln-sha-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    /* a million 'a's: more than one of kiln_sha256_fd's reads */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    cr_assert_eq(write(fd, a, 1000000), 1000000);
    int64_t size = 0;
    kiln_err_t err;
    cr_assert_eq(kiln_sha256_fd(fd, &size, out, &err), 0);
    cr_assert_eq(size, 1000000);
    cr_assert_str_eq(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    close(fd);
    unlink(path);
    free(a);
}

Test(text, utf8_check_finds_the_first_bad_byte)
{
    cr_assert_eq(kiln_utf8_check("plain", 5), 5);
    cr_assert_eq(kiln_utf8_check("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xa5", 14), 14);
    cr_assert_eq(kiln_utf8_check("\xff\xfe", 2), 0);
    cr_assert_eq(kiln_utf8_check("ab\xc0\x80", 4), 2, "the overlong NUL is not text");
    cr_assert_eq(kiln_utf8_check("ab\0cd", 5), 2, "an embedded NUL is found");
    cr_assert_eq(kiln_utf8_check("x\xed\xa0\x80", 4), 1, "a surrogate is not UTF-8");
    cr_assert_eq(kiln_utf8_check("x\xe2\x82", 3), 1, "a sequence cut short");
    cr_assert_eq(kiln_utf8_check("\xf4\x90\x80\x80", 4), 0, "past U+10FFFF");
    cr_assert_eq(kiln_utf8_check("tab\there\n", 9), 9);
}

/* What can rewrite a terminal: C0 (tab and newline too), DEL, C1 (8-bit CSI, OSC), bidirectional
 * overrides and isolates; nothing else, however close. */
Test(text, control_characters_are_those_a_terminal_acts_on)
{
#define T(text, at) {text, sizeof(text) - 1, at}
    static const struct {
        const char *s;
        size_t len, at;
    } cases[] = {
        T("plain name", 10),
        T("caf\xc3\xa9 \xe2\x82\xac", 9),
        T("a\x1b[31mred", 1),
        T("\x1b]52;c;ZXZpbA==\x07", 0),
        T("tab\there", 3),
        T("new\nline", 3),
        T("over\rwrite", 4),
        T("del\x7f", 3),
        T("c1 \xc2\x9b" "31m", 3),
        T("nbsp\xc2\xa0ok", 8),
        T("rlo \xe2\x80\xae" "gpj.exe", 4),
        T("lri \xe2\x81\xa6x", 4),
        T("\xe2\x80\xa9 and \xe2\x80\xaf", 11),
        T("\xe2\x81\xaa", 3),
        T("nul\0x", 3),
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_assert_eq(kiln_text_control_at(cases[i].s, cases[i].len), cases[i].at, "case %zu: %zu", i,
                     kiln_text_control_at(cases[i].s, cases[i].len));
    cr_assert_eq(kiln_text_control((const unsigned char *)"\xc2", 1), 0, "a C1 cut short is none");
    cr_assert_eq(kiln_text_control((const unsigned char *)"\xe2\x80\xae", 3), 3);
    cr_assert_eq(kiln_text_control((const unsigned char *)"\xc2\x85", 2), 2);
}

/* A daemon's log line that quotes others' text (a job's malformed metric record, an agent's
 * reason) stays one line, and no escape sequence in it reaches whoever reads the log. */
Test(text, a_log_line_is_one_line_and_escapes_control_characters)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    int saved = dup(STDERR_FILENO);
    cr_assert_eq(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
    log_write(LOG_ERROR, "record \"%s\" refused", "x\x1b]0;owned\x07\nFAKE kiln: all good\r\xe2\x80\xae\xff caf\xc3\xa9");
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(p[1]);
    char buf[512] = "";
    ssize_t n = read(p[0], buf, sizeof(buf) - 1);
    close(p[0]);
    cr_assert_gt(n, 0);
    buf[n] = '\0';
    cr_assert(strstr(buf, "record \"x\\u001b]0;owned\\u0007\\u000aFAKE kiln: all good\\u000d\\u202e\\xff caf\xc3\xa9\" refused\n"),
              "%s", buf);
    cr_assert_eq(strchr(buf, '\n'), buf + n - 1, "one line: %s", buf);
}

/* Formatted text cut by a precision or by its buffer keeps whole characters (a reason or an error
 * message the database and JSON take), and leaves out a stray byte it was given. */
Test(text, text_fmt_never_cuts_a_character)
{
    char out[8];
    cr_assert_eq(kiln_text_fmt(out, sizeof out, "ab%s", "\xc3\xa9\xc3\xa9\xc3\xa9"), 6, "the last é does not fit");
    cr_assert_str_eq(out, "ab\xc3\xa9\xc3\xa9");
    cr_assert_eq(kiln_text_fmt(out, sizeof out, "a%s", "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac"), 7);
    cr_assert_str_eq(out, "a\xe2\x82\xac\xe2\x82\xac");
    cr_assert_eq(kiln_text_fmt(out, sizeof out, "\"%.3s\"", "x\xc3\xa9\xc3\xa9"), 5, "the precision cuts the second");
    cr_assert_str_eq(out, "\"x\xc3\xa9\"");
    cr_assert_eq(kiln_text_fmt(out, sizeof out, "a\xff" "b"), 2);
    cr_assert_str_eq(out, "ab");
    cr_assert_eq(kiln_text_fmt(out, sizeof out, "%s", "1234567890"), 7);
    cr_assert_str_eq(out, "1234567");
    kiln_err_t e;
    kiln_err_set(&e, KILN_ENOTFOUND, "id", "tuning job \"%.8s\" not found", "x\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");
    cr_assert_str_eq(e.message, "tuning job \"x\xc3\xa9\xc3\xa9\xc3\xa9\" not found");
}

Test(text, utf8_copy_keeps_text_kilnd_accepts)
{
    char out[16];
    cr_assert_eq(kiln_utf8_copy(out, sizeof out, "caf\xc3\xa9", 5), 5);
    cr_assert_str_eq(out, "caf\xc3\xa9");
    cr_assert_eq(kiln_utf8_copy(out, sizeof out, "a\xff" "b\0c", 5), 7, "bad bytes become U+FFFD, NUL '?'");
    cr_assert_str_eq(out, "a\xef\xbf\xbd" "b?c");
    cr_assert_eq(kiln_utf8_check(out, strlen(out)), strlen(out));
    /* a line cut by a byte limit: the copy stops before the sequence that does not fit */
    char small[6];
    cr_assert_eq(kiln_utf8_copy(small, sizeof small, "abcd\xe2\x82\xac", 7), 4);
    cr_assert_str_eq(small, "abcd");
    cr_assert_eq(kiln_utf8_copy(small, sizeof small, "ab\xe2\x82", 4), 5, "a sequence cut short in the input");
    cr_assert_eq(kiln_utf8_check(small, strlen(small)), strlen(small));
}

/* The one escaping of others' text, in its three uses: a terminal (no flags), bad input quoted in
 * an error (kiln_text_quote: '"' and '\\' too, REST's %00 as the NUL it is, cut with "..."), and
 * gRPC metadata (printable ASCII only). */
Test(text, escaping_for_a_terminal_a_message_and_grpc_metadata)
{
    char out[128];
    static const char mixed[] = "a\"b\\c\x1b\xc2\x9b caf\xc3\xa9 \xf0\x9f\x98\x80 \xff\xc0\x80";
    kiln_text_escape(out, sizeof out, mixed, sizeof mixed - 1, 0);
    cr_assert_str_eq(out, "a\"b\\c\\u001b\\u009b caf\xc3\xa9 \xf0\x9f\x98\x80 \\xff\\xc0\\x80");
    kiln_text_escape(out, sizeof out, mixed, sizeof mixed - 1, KILN_TEXT_ASCII);
    cr_assert_str_eq(out, "a\"b\\c\\u001b\\u009b caf\\u00e9 \\U0001f600 \\xff\\xc0\\x80");
    cr_assert_str_eq(kiln_text_quote(out, sizeof out, mixed, sizeof mixed - 1, 40),
                     "a\\\"b\\\\c\\u001b\\u009b caf\xc3\xa9 \xf0\x9f\x98\x80 \\xff\\u0000");
    /* a NUL as gRPC carries it reads as REST's %00 does */
    cr_assert_str_eq(kiln_text_quote(out, sizeof out, "q\0x", 3, 40), "q\\u0000x");
    /* cut at max_chars characters, never inside one, or where the buffer ends */
    cr_assert_str_eq(kiln_text_quote(out, sizeof out, "\xc3\xa9\xc3\xa9\xc3\xa9", 6, 2), "\xc3\xa9\xc3\xa9...");
    cr_assert_str_eq(kiln_text_quote(out, sizeof out, "abc", 3, 3), "abc");
    char small[8];
    cr_assert_str_eq(kiln_text_quote(small, sizeof small, "abcdefgh", 8, 40), "abcd...");
    cr_assert_str_eq(kiln_text_quote(small, sizeof small, "ab\x1b", 3, 40), "ab...");
}

Test(text, integers_are_digits_only)
{
    int64_t v = 0;
    cr_assert_eq(kiln_parse_int64("42", &v), 0);
    cr_assert_eq(v, 42);
    cr_assert_eq(kiln_parse_int64("-7", &v), 0);
    cr_assert_eq(v, -7);
    cr_assert_eq(kiln_parse_int64("9223372036854775807", &v), 0);
    cr_assert_eq(v, INT64_MAX);
    cr_assert_eq(kiln_parse_int64("-9223372036854775808", &v), 0);
    cr_assert_eq(v, INT64_MIN);
    const char *bad[] = {"", "+5", " 5", "5 ", "5x", "0x10", "1e3", "1.0", "-", "9223372036854775808",
                         "-9223372036854775809", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(kiln_parse_int64(bad[i], &v), KILN_EINVAL, "\"%s\" was accepted", bad[i]);
}

Test(text, times_refuse_what_is_not_a_time)
{
    int64_t us = 0;
    cr_assert_eq(kiln_time_parse("1795000000.5", &us), 0);
    cr_assert_eq(us, 1795000000500000LL);
    const char *bad[] = {"nan", "inf", "-1", "1e999", "0x10", "99999999999999", " 1", "1."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(kiln_time_parse(bad[i], &us), KILN_EINVAL, "\"%s\" was accepted", bad[i]);
}

Test(names, an_index_finds_each_key_once_and_keeps_the_strings_of_a_pair_apart)
{
    /* 300 names, one of them twice: the first is the one found */
    static char buf[300][16];
    const char *names[301];
    for (int i = 0; i < 300; i++) {
        snprintf(buf[i], sizeof buf[i], "q%d", i);
        names[i] = buf[i];
    }
    names[300] = "q7";
    kiln_names_t x;
    cr_assert(kiln_names_init(&x, names, 1, 301));
    kiln_names_add_all(&x, 301);
    for (int i = 0; i < 300; i++)
        cr_assert_eq(kiln_names_find(&x, &names[i], NULL), i, "%s", names[i]);
    const char *absent = "q300";
    size_t at = (size_t)-1;
    cr_assert_eq(kiln_names_find(&x, &absent, &at), -1);
    cr_assert_lt(at, x.cap, "a free slot is named");
    kiln_names_free(&x);
    /* pairs: ("ab", "c") and ("a", "bc") are different keys */
    const char *pairs[] = {"ab", "c", "a", "bc"};
    cr_assert(kiln_names_init(&x, pairs, 2, 2));
    kiln_names_add_all(&x, 2);
    cr_assert_eq(kiln_names_find(&x, (const char *[]){"a", "bc"}, NULL), 1);
    cr_assert_eq(kiln_names_find(&x, (const char *[]){"ab", "c"}, NULL), 0);
    cr_assert_eq(kiln_names_find(&x, (const char *[]){"abc", ""}, NULL), -1);
    kiln_names_free(&x);
}

/* api_names.h's lists as help text: a list's values joined by "|", and its first (a policy's
 * default), string literals a value added to the list extends */
Test(base, api_name_lists_make_help_literals)
{
#define THREE_(FIRST, NEXT) FIRST(A, "alpha") NEXT(B, "beta") NEXT(C, "gamma")
    static const char choices[] = "--x " KILN_NAME_CHOICES(THREE_) "\n";
    cr_assert_str_eq(choices, "--x alpha|beta|gamma\n");
    cr_assert_str_eq(KILN_NAME_DEFAULT(THREE_), "alpha");
#undef THREE_
    cr_assert_str_eq(KILN_NAME_CHOICES(KILN_WITHIN_QUEUE_POLICIES), "lower_priority|never");
    cr_assert_str_eq(KILN_NAME_CHOICES(KILN_RECLAIM_WITHIN_COHORT_POLICIES), "any|lower_priority|never");
    cr_assert_str_eq(KILN_NAME_DEFAULT(KILN_RECLAIM_WITHIN_COHORT_POLICIES), "any");
    cr_assert_str_eq(KILN_NAME_CHOICES(KILN_PROJECT_ROLES), "viewer|editor|admin");
}
