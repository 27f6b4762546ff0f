/* host.c - what kiln-agent learns of its machine and keeps on it: the data roots (resolved), the
 * worker credential file, the GPUs, and the address ranks rendezvous on. No thread, no agent_t. */
#include "agent/agent_int.h"
#include "rank/rank.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- data roots and the credential file ----------------------------------------------------- */

int agent_data_roots_resolve(const char *const *roots, size_t n, char **out, size_t max, size_t *n_out,
                              kiln_err_t *err)
{
    *n_out = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const char *r = roots[i] ? roots[i] : "";
        char real[PATH_MAX];
        struct stat st;
        if (!r[0] || !realpath(r, real) || stat(real, &st) != 0) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "data root \"%s\" does not exist", r);
            goto fail;
        }
        if (!S_ISDIR(st.st_mode)) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "data root \"%s\" is not a directory", r);
            goto fail;
        }
        if (strchr(real, ',')) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "data root \"%s\" has a comma in its path, which "
                              RANK_ENV_DATA_ROOTS " cannot carry", r);
            goto fail;
        }
        bool dup = false;
        for (size_t k = 0; k < *n_out && !dup; k++)
            dup = !strcmp(out[k], real);
        if (dup)
            continue;
        if (*n_out >= max) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "more than %zu data roots", max);
            goto fail;
        }
        if (!(out[*n_out] = strdup(real))) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto fail;
        }
        (*n_out)++;
    }
    return 0;
fail:
    for (size_t k = 0; k < *n_out; k++) {
        free(out[k]);
        out[k] = NULL;
    }
    *n_out = 0;
    return rc;
}

int agent_credential_save(const char *work_dir, const char *worker_id, const char *credential,
                           kiln_err_t *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", work_dir, AGENT_CREDENTIAL_FILE);
    size_t len = strlen(worker_id) + strlen(credential) + 32;
    char *text = malloc(len);
    if (!text)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int n = snprintf(text, len, "worker_id %s\ncredential %s\n", worker_id, credential);
    int rc = kiln_file_write_atomic_mode(path, text, (size_t)n, 0600, err);
    memset(text, 0, len);
    free(text);
    return rc;
}

int agent_credential_load(const char *work_dir, char *worker_id, size_t idn, char *credential,
                           size_t credn, kiln_err_t *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", work_dir, AGENT_CREDENTIAL_FILE);
    char *text = NULL;
    size_t len = 0;
    worker_id[0] = credential[0] = '\0';
    int rc = kiln_file_read(path, &text, &len, err);
    if (rc)
        return rc;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "worker_id ", 10) && strlen(line + 10) < idn)
            kiln_strlcpy(worker_id, line + 10, idn);
        else if (!strncmp(line, "credential ", 11) && strlen(line + 11) < credn)
            kiln_strlcpy(credential, line + 11, credn);
    }
    memset(text, 0, len);
    free(text);
    if (!worker_id[0] || !credential[0]) {
        worker_id[0] = credential[0] = '\0';
        return kiln_err_set(err, KILN_EFORMAT, NULL, "%s is not a kiln-agent credential file", path);
    }
    return 0;
}

/* ---- the machine ------------------------------------------------------------------------- */

int agent_gpu_detect(char **names, int max)
{
    int count = 0;
    static const char *libs[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(libs) && count == 0; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (!h)
            continue;
        int (*get_count)(int *) = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
        int c = 0; /* left untouched when there is no device */
        if (get_count && get_count(&c) == 0 && c > 0)
            count = c;
        dlclose(h);
        break;
    }
    int listed = 0;
    FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (p) {
        char line[512];
        while (fgets(line, sizeof(line), p)) {
            if (strncmp(line, "GPU ", 4) != 0)
                continue;
            char *name = strchr(line, ':');
            if (!name)
                continue;
            name++;
            while (*name == ' ')
                name++;
            char *uuid = strstr(name, " (UUID");
            if (uuid)
                *uuid = '\0';
            name[strcspn(name, "\n")] = '\0';
            if (names && listed < max)
                names[listed] = strdup(name);
            listed++;
        }
        pclose(p);
    }
    if (count == 0)
        count = listed;
    if (names)
        for (int i = listed; i < KILN_MIN(count, max); i++)
            names[i] = strdup("GPU");
    return count;
}

void agent_pick_address(const char *server, char *buf, size_t n)
{
    char host[256];
    const char *s = server ? server : "";
    if (!strncmp(s, "dns:///", 7))
        s += 7;
    else if (!strncmp(s, "ipv4:", 5))
        s += 5;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        size_t len = end ? (size_t)(end - s - 1) : strlen(s + 1);
        snprintf(host, sizeof(host), "%.*s", (int)KILN_MIN(len, sizeof(host) - 1), s + 1);
    } else {
        const char *colon = strrchr(s, ':');
        size_t len = colon ? (size_t)(colon - s) : strlen(s);
        snprintf(host, sizeof(host), "%.*s", (int)KILN_MIN(len, sizeof(host) - 1), s);
    }
    kiln_strlcpy(buf, "127.0.0.1", n);
    if (!host[0] || !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1"))
        return;
    /* The local address the kernel would use to reach the server: connect a UDP socket. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(host, "9", &hints, &res) != 0 || !res)
        return;
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            char tmp[INET6_ADDRSTRLEN];
            const void *src = ss.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                                                      : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
            if (inet_ntop(ss.ss_family, src, tmp, sizeof(tmp)))
                kiln_strlcpy(buf, tmp, n);
        }
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
}

