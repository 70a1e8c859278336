/*
 * train_log.h - reading what `adtrain train --log` wrote (step losses, validation lines) and
 * counting lines in captured output, for the tests that compare runs. Include after check.h.
 */
#ifndef ADTRAIN_TESTS_TRAIN_LOG_H
#define ADTRAIN_TESTS_TRAIN_LOG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Step losses and validation lines (val_loss, val_acc) of a --log file. */
typedef struct log_lines {
    int n, n_eval;
    double loss[64], val_loss[16], val_acc[16];
} log_lines;

static inline int read_log(const char *path, log_lines *l) {
    memset(l, 0, sizeof *l);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *vl = strstr(line, "\"val_loss\":"), *va = strstr(line, "\"val_acc\":"), *lo = strstr(line, "\"loss\":");
        if (vl && l->n_eval < 16) {
            l->val_loss[l->n_eval] = atof(vl + 11);
            l->val_acc[l->n_eval++] = va ? atof(va + 10) : -1;
        } else if (lo && l->n < 64) {
            l->loss[l->n++] = atof(lo + 7);
        }
    }
    fclose(f);
    return 0;
}

static inline int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

#endif
