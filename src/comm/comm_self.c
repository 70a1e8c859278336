/*
 * comm_self.c - the one-rank backend: no MPI, the results of a 1-rank MPI world.
 *
 * With one rank every sum is the rank's own data and every block is its own block, so the
 * collectives are copies (or nothing, in place). Messages to itself follow MPI's matching rule
 * (same tag, in order of posting): a send meets the oldest pending recv with its tag or is
 * queued as a copy; a recv takes the oldest queued message with its tag or waits for a send.
 * A recv that waits when nothing else can happen in this thread can never complete: the front
 * end reports that at once instead of waiting out the timeout.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct self_msg {
    int tag;
    int64_t n;
    comm_elem elem;
    void *data;
    struct self_msg *next;
} self_msg;

typedef struct self_state {
    self_msg *queue;         /* sent, not yet received, oldest first */
    adt_comm_req **pending;  /* recvs posted, not yet matched, oldest first */
    int n_pending, cap_pending;
} self_state;

/* Per request: nonzero while a recv waits for its send. */
typedef struct self_req {
    int waiting;
    int status;
    char why[COMM_WHY];
} self_req;

int comm_self_init(adt_comm *w) {
    w->be = &comm_self_backend;
    w->bs = adt_calloc(1, sizeof(self_state));
    w->rank = 0;
    w->size = 1;
    return ADT_OK;
}

/* A message of n elements arrives at a recv of r->op.n: MPI's rules, made strict. */
static int deliver(adt_comm_req *r, const void *data, int64_t n, comm_elem elem, char *why) {
    if (elem != r->op.elem || n != r->op.n) {
        snprintf(why, COMM_WHY, "the message has %lld %s, the recv expected %lld %s", (long long)n,
                 comm_elem_name(elem), (long long)r->op.n, comm_elem_name(r->op.elem));
        return ADT_ERR_COMM;
    }
    if (n) memcpy(r->op.recv, data, (size_t)n * comm_elem_size(elem));
    return ADT_OK;
}

static int self_send(self_state *s, const comm_op *op) {
    for (int i = 0; i < s->n_pending; i++) {
        adt_comm_req *rr = s->pending[i];
        if (rr->op.tag != op->tag) continue;
        self_req *q = rr->be;
        q->status = deliver(rr, op->send, op->n, op->elem, q->why);
        q->waiting = 0;
        memmove(s->pending + i, s->pending + i + 1, (size_t)(s->n_pending - i - 1) * sizeof *s->pending);
        s->n_pending--;
        return ADT_OK;
    }
    self_msg *m = adt_calloc(1, sizeof *m);
    size_t bytes = (size_t)op->n * comm_elem_size(op->elem);
    m->tag = op->tag;
    m->n = op->n;
    m->elem = op->elem;
    m->data = adt_malloc(bytes);
    if (bytes) memcpy(m->data, op->send, bytes);
    self_msg **tail = &s->queue;
    while (*tail) tail = &(*tail)->next;
    *tail = m;
    return ADT_OK;
}

static int self_recv(self_state *s, adt_comm_req *r, self_req *q) {
    for (self_msg **pm = &s->queue; *pm; pm = &(*pm)->next) {
        self_msg *m = *pm;
        if (m->tag != r->op.tag) continue;
        q->status = deliver(r, m->data, m->n, m->elem, q->why);
        *pm = m->next;
        free(m->data);
        free(m);
        return ADT_OK;
    }
    if (s->n_pending == s->cap_pending) {
        s->cap_pending = s->cap_pending ? 2 * s->cap_pending : 8;
        s->pending = adt_realloc(s->pending, (size_t)s->cap_pending * sizeof *s->pending);
    }
    s->pending[s->n_pending++] = r;
    q->waiting = 1;
    return ADT_OK;
}

static size_t self_req_size(const adt_comm *c, const comm_op *op) {
    (void)c, (void)op;
    return sizeof(self_req);
}

static int self_start(adt_comm *c, adt_comm_req *r, char *why) {
    self_state *s = c->bs;
    const comm_op *op = &r->op;
    size_t es = comm_elem_size(op->elem);
    self_req *q = r->be;
    q->waiting = 0;
    q->status = ADT_OK;
    q->why[0] = 0;
    switch (op->kind) {
    case OP_ALLREDUCE: /* the sum over one rank is its own buffer */
    case OP_BCAST:     /* the root is this rank */
    case OP_BARRIER: return ADT_OK;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER:
        if (op->counts[0]) memmove(op->recv, op->send, (size_t)op->counts[0] * es);
        return ADT_OK;
    case OP_ALLTOALL:
        if (op->counts[0] != op->rcounts[0]) {
            snprintf(why, COMM_WHY, "rank 0 sends %lld elements to itself but expects %lld",
                     (long long)op->counts[0], (long long)op->rcounts[0]);
            return ADT_ERR_ARG;
        }
        if (op->counts[0]) memmove(op->recv, op->send, (size_t)op->counts[0] * es);
        return ADT_OK;
    case OP_SEND: return self_send(s, op);
    case OP_RECV: return self_recv(s, r, q);
    }
    return ADT_OK;
}

static int self_test(adt_comm_req *r, int *done, char *why) {
    self_req *q = r->be;
    *done = !q->waiting;
    if (*done && q->status) snprintf(why, COMM_WHY, "%s", q->why);
    return *done ? q->status : ADT_OK;
}

static int self_stuck(const adt_comm_req *r) { return ((const self_req *)r->be)->waiting; }

/* A waiting recv leaves the pending list; anything else is finished already. */
static int self_cancel(adt_comm_req *r) {
    self_req *q = r->be;
    if (q->waiting && r->comm) {
        self_state *s = r->comm->bs;
        for (int i = 0; i < s->n_pending; i++)
            if (s->pending[i] == r) {
                memmove(s->pending + i, s->pending + i + 1, (size_t)(s->n_pending - i - 1) * sizeof *s->pending);
                s->n_pending--;
                break;
            }
        q->waiting = 0;
    }
    return 1;
}

static int self_split(adt_comm *c, int color, int key, int new_rank, int new_size, void **bs,
                      char *why) {
    (void)c, (void)key, (void)why;
    ADT_ASSERT(color < 0 || (new_rank == 0 && new_size == 1));
    *bs = color < 0 ? NULL : adt_calloc(1, sizeof(self_state));
    return ADT_OK;
}

static void self_free(adt_comm *c) {
    self_state *s = c->bs;
    if (!s) return;
    while (s->queue) {
        self_msg *m = s->queue;
        s->queue = m->next;
        free(m->data);
        free(m);
    }
    free(s->pending);
    free(s);
    c->bs = NULL;
}

static void self_abort(adt_comm *c, int code) {
    (void)c;
    fflush(stdout);
    exit(code);
}

const comm_backend comm_self_backend = {
    .name = "self",
    .kind = ADT_COMM_SELF,
    .req_size = self_req_size,
    .start = self_start,
    .test = self_test,
    .stuck = self_stuck,
    .cancel = self_cancel,
    .split = self_split,
    .free = self_free,
    .abort = self_abort,
};
