/*
 * http_internal.h - the HTTP client side shared by the agent, the worker client and the tools:
 * one libcurl easy handle per request kind, set up with the job token, keepalive and deadlines;
 * replies mapped onto adt_status with the master's own error message. Also HOST:PORT parsing,
 * which the master's listen address uses too.
 */
#ifndef ADTRAIN_ELASTIC_HTTP_INTERNAL_H
#define ADTRAIN_ELASTIC_HTTP_INTERNAL_H

#include <curl/curl.h>
#include <stddef.h>

/* "HOST:PORT" -> host (a name or IPv4, at most cap-1 bytes) and port 0..65535. Errors name
 * `what` (a flag) and say what was expected. */
int eh_parse_hostport(const char *s, char *host, size_t cap, int *port, const char *what);

typedef struct eh_buf {
    char *p; /* NUL-terminated when n > 0 */
    size_t n, cap;
} eh_buf;

typedef struct eh_req {
    CURL *e;                 /* kept between requests, so its connection is reused */
    struct curl_slist *hdrs;
    char *body;
    eh_buf resp;
    char err[CURL_ERROR_SIZE];
} eh_req;

/* Sets up r for one request to http://HOST:PORT`path`. body NULL = no body. The reply goes to
 * r->resp. Run it with curl_easy_perform(r->e) or a multi handle. */
int eh_req_setup(eh_req *r, const char *hostport, const char *token, const char *method, const char *path,
                 const char *body, long timeout_ms);
/* The HTTP status after a transfer (0 if none came). */
long eh_req_status(eh_req *r);
/* The reply body ("" if none). */
const char *eh_req_reply(const eh_req *r);
void eh_req_free(eh_req *r);

/* An adt_status for a completed exchange: ADT_OK for 2xx, else the master's {"error": ...}
 * prefixed with `what`: 409 -> ADT_ERR_STALE, 400/404/405/413/422 -> ADT_ERR_ARG, 401/403 ->
 * ADT_ERR_ARG (token), 503/5xx -> ADT_ERR_STATE. */
int eh_reply_status(long status, const char *body, const char *what);
/* The transport failed (curl code `cc`): ADT_ERR_IO naming the address. */
int eh_transport_error(const eh_req *r, int cc, const char *hostport, const char *what);

#endif
