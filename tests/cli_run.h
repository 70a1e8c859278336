/*
 * cli_run.h - running the `adtrain` binary from a test: the binary is $ADT_BIN, else
 * $BUILD/adtrain (the Makefile's test target sets BUILD), else build/adtrain; tests run from the
 * repository root.
 */
#ifndef ADTRAIN_TESTS_CLI_RUN_H
#define ADTRAIN_TESTS_CLI_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char g_bin[512];

static inline int write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    if (!fp) return -1;
    fputs(text, fp);
    return fclose(fp);
}

static inline int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* Runs `adtrain <args>` with stdout and stderr captured into out; returns the exit status, or
 * -1 if it did not exit normally. */
static inline int run_adtrain(const char *args, char *out, size_t n) {
    size_t len = strlen(g_bin) + strlen(args) + 16;
    char *cmd = malloc(len);
    snprintf(cmd, len, "'%s' %s 2>&1", g_bin, args);
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p) return -1;
    size_t k = 0, got;
    while (k + 1 < n && (got = fread(out + k, 1, n - 1 - k, p)) > 0) k += got;
    out[k] = 0;
    char sink[4096]; /* drain what did not fit so the child never blocks on a full pipe */
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Reads the "loss" of every step line of a JSONL log (eval lines have val_loss instead). */
static inline int read_losses(const char *path, double *loss, int cap, int *n_eval) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    *n_eval = 0;
    while (fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\":");
        if (strstr(line, "\"val_loss\":")) (*n_eval)++;
        else if (l && n < cap) loss[n++] = atof(l + 7);
    }
    fclose(f);
    return n;
}

static inline void cli_find_binary(void) {
    const char *bin = getenv("ADT_BIN"), *build = getenv("BUILD");
    if (bin && *bin) snprintf(g_bin, sizeof g_bin, "%s", bin);
    else snprintf(g_bin, sizeof g_bin, "%s/adtrain", build && *build ? build : "build");
}

#endif
