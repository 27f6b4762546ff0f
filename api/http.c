/* http.c - kilnd's REST front end: a libmicrohttpd daemon that decodes requests, calls service/
 * and encodes its jansson replies. Not the business logic (service/) nor the gRPC side. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

struct api_http {
    struct MHD_Daemon *daemon;
    svc_t *svc;
};

static enum MHD_Result http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version,
                                       const char *upload_data, size_t *upload_data_size,
                                       void **con_cls)
{
    static int first;
    (void)cls; (void)url; (void)method; (void)version; (void)upload_data;
    if (*con_cls == NULL) {
        *con_cls = &first;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    static const char body[] = "{\"code\":\"not_found\",\"message\":\"not found\"}";
    struct MHD_Response *r = MHD_create_response_from_buffer(sizeof body - 1, (void *)body,
                                                             MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(conn, 404, r);
    MHD_destroy_response(r);
    return ret;
}

int api_http_start(svc_t *svc, const char *addr, api_http_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon)
        return kiln_err_set(err, KILN_EINVAL, "http-addr", "bad listen address \"%s\"", addr ? addr : "");
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    char host[64];
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof host) hl = sizeof host - 1;
    memcpy(host, addr, hl);
    host[hl] = 0;
    if (hl == 0) strcpy(host, "0.0.0.0");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return kiln_err_set(err, KILN_EINVAL, "http-addr", "bad listen address \"%s\"", addr);
    api_http_t *h = calloc(1, sizeof *h);
    if (!h) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    h->svc = svc;
    h->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                                 MHD_ALLOW_SUSPEND_RESUME, 0, NULL, NULL, http_on_request, h,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
    if (!h->daemon) {
        free(h);
        return kiln_err_set(err, KILN_EIO, "http-addr", "could not listen on %s", addr);
    }
    *out = h;
    return 0;
}

void api_http_stop(api_http_t *h)
{
    if (!h) return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
