/*
 * watchdog.c - bounds the few MPI calls that have no non-blocking form.
 *
 * MPI_Comm_split, MPI_Comm_dup, MPI_Init and MPI_Finalize block until their peers arrive, and
 * MPI gives no way to abandon them. A helper thread watches the one call in progress: if it has
 * not returned when its deadline passes, the thread prints what was stuck and ends the process
 * with ADT_COMM_EXIT_STUCK, so a dead or stuck peer becomes a clear fatal error that the launcher
 * (mpiexec, adtrain's agent) sees, never an endless hang. The thread never calls MPI.
 */
#include "comm_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cv;
static pthread_t wd_thread;
static int wd_running, wd_quit, wd_armed;
static double wd_deadline, wd_timeout;
static char wd_what[256];

static void *watch_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&wd_mu);
    while (!wd_quit) {
        if (!wd_armed) {
            pthread_cond_wait(&wd_cv, &wd_mu);
            continue;
        }
        double now = adt_now_s();
        if (now >= wd_deadline) {
            fflush(stdout);
            fprintf(stderr,
                    "adtrain: fatal: %s did not return within %.1f s (ADT_COMM_TIMEOUT): a peer is "
                    "missing or stuck; exiting with status %d\n",
                    wd_what, wd_timeout, ADT_COMM_EXIT_STUCK);
            _exit(ADT_COMM_EXIT_STUCK);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double wait = wd_deadline - now + 1e-3;
        ts.tv_sec += (time_t)wait;
        ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&wd_cv, &wd_mu, &ts);
    }
    pthread_mutex_unlock(&wd_mu);
    return NULL;
}

void comm_watch_begin(const char *what, double timeout_s) {
    pthread_mutex_lock(&wd_mu);
    if (!wd_running) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&wd_cv, &ca);
        pthread_condattr_destroy(&ca);
        wd_quit = 0;
        if (pthread_create(&wd_thread, NULL, watch_main, NULL) == 0) wd_running = 1;
        else adt_log(ADT_LOG_WARN, "comm: could not start the watchdog thread; %s is unbounded", what);
    }
    snprintf(wd_what, sizeof wd_what, "%s", what);
    wd_timeout = timeout_s;
    wd_deadline = adt_now_s() + timeout_s;
    wd_armed = 1;
    pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_mu);
}

void comm_watch_end(void) {
    pthread_mutex_lock(&wd_mu);
    wd_armed = 0;
    if (wd_running) pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_mu);
}

void comm_watch_stop(void) {
    pthread_mutex_lock(&wd_mu);
    int running = wd_running;
    wd_quit = 1;
    wd_armed = 0;
    if (running) pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_mu);
    if (!running) return;
    pthread_join(wd_thread, NULL);
    pthread_cond_destroy(&wd_cv);
    wd_running = 0;
}
