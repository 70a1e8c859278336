/*
 * http.c - the HTTP client plumbing of the control plane (libcurl): requests to the master with
 * the job token, TCP keepalive, deadlines, and replies turned into adt_status.
 */
#include "elastic/http_internal.h"

#include <cJSON.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "adtrain/base.h"

int eh_parse_hostport(const char *s, char *host, size_t cap, int *port, const char *what) {
    const char *colon = s ? strrchr(s, ':') : NULL;
    if (!s || !colon || colon == s)
        return adt_error(ADT_ERR_ARG, "%s '%s': expected HOST:PORT", what, s ? s : "(null)");
    size_t hl = (size_t)(colon - s);
    if (hl >= cap) return adt_error(ADT_ERR_ARG, "%s '%s': host name longer than %zu bytes", what, s, cap - 1);
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || p < 0 || p > 65535)
        return adt_error(ADT_ERR_ARG, "%s '%s': port '%s', expected 0..65535", what, s, colon + 1);
    memcpy(host, s, hl);
    host[hl] = 0;
    for (size_t i = 0; i < hl; i++)
        if ((unsigned char)host[i] <= ' ' || host[i] == '/' || host[i] == '@')
            return adt_error(ADT_ERR_ARG, "%s '%s': bad character in the host name", what, s);
    *port = (int)p;
    return ADT_OK;
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* Replies are small JSON documents; anything beyond this is not the master talking. */
#define REPLY_MAX (64u << 20)

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    eh_buf *b = ud;
    size_t n = size * nmemb;
    if (b->n + n + 1 > REPLY_MAX) return 0;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1)
            cap *= 2;
        b->p = adt_realloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, ptr, n);
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

/* Dead peers are found by keepalive probes within ~4 s even when no request is in flight. */
static int on_socket(void *ud, curl_socket_t fd, curlsocktype purpose) {
    (void)ud;
    if (purpose == CURLSOCKTYPE_IPCXN) {
        int cnt = 3;
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    }
    return CURL_SOCKOPT_OK;
}

int eh_req_setup(eh_req *r, const char *hostport, const char *token, const char *method, const char *path,
                 const char *body, long timeout_ms) {
    pthread_once(&g_once, curl_init_once);
    if (!r->e) {
        r->e = curl_easy_init();
        if (!r->e) return adt_error(ADT_ERR_NOMEM, "curl_easy_init failed");
    } else {
        curl_easy_reset(r->e);
    }
    curl_slist_free_all(r->hdrs);
    r->hdrs = NULL;
    free(r->body);
    r->body = body ? adt_strdup(body) : NULL;
    r->resp.n = 0;
    if (r->resp.p) r->resp.p[0] = 0;
    r->err[0] = 0;

    char url[1024];
    snprintf(url, sizeof url, "http://%s%s", hostport, path);
    CURL *e = r->e;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 3000 ? timeout_ms : 3000L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 1L);
    curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, on_socket);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &r->resp);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->err);
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    /* no "Expect: 100-continue" round trip before larger bodies */
    r->hdrs = curl_slist_append(r->hdrs, "Expect:");
    if (token && *token) {
        char auth[600];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        r->hdrs = curl_slist_append(r->hdrs, auth);
    }
    if (r->body) {
        r->hdrs = curl_slist_append(r->hdrs, "Content-Type: application/json");
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(r->body));
    } else if (!strcmp(method, "GET")) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdrs);
    return ADT_OK;
}

long eh_req_status(eh_req *r) {
    long code = 0;
    if (r->e) curl_easy_getinfo(r->e, CURLINFO_RESPONSE_CODE, &code);
    return code;
}

const char *eh_req_reply(const eh_req *r) { return r->resp.n ? r->resp.p : ""; }

void eh_req_free(eh_req *r) {
    if (r->e) curl_easy_cleanup(r->e);
    curl_slist_free_all(r->hdrs);
    free(r->body);
    free(r->resp.p);
    memset(r, 0, sizeof *r);
}

int eh_reply_status(long status, const char *body, const char *what) {
    if (status >= 200 && status < 300) return ADT_OK;
    char msg[512];
    snprintf(msg, sizeof msg, "%.200s", body ? body : "");
    cJSON *j = body ? cJSON_Parse(body) : NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsString(e)) snprintf(msg, sizeof msg, "%s", e->valuestring);
    cJSON_Delete(j);
    int code = status == 409                    ? ADT_ERR_STALE
               : status == 401 || status == 403 ? ADT_ERR_ARG
               : status >= 400 && status < 500  ? ADT_ERR_ARG
                                                : ADT_ERR_STATE;
    return adt_error(code, "%s: master answered %ld: %s", what, status, msg);
}

int eh_transport_error(const eh_req *r, int cc, const char *hostport, const char *what) {
    return adt_error(ADT_ERR_IO, "%s: master %s: %s", what, hostport,
                     r->err[0] ? r->err : curl_easy_strerror((CURLcode)cc));
}
