/*
 * cli.h - the subcommands of the `adtrain` command.
 */
#ifndef ADTRAIN_CLI_H
#define ADTRAIN_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "adtrain/models.h"

#define ADT_VERSION "0.1.0"

int cli_train(int argc, char **argv);
/* Prints "adtrain <command>: <message>" to stderr and returns `code`, so that a subcommand can
 * `return cli_fail("train", 2, "...")`. */
int cli_fail(const char *command, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int cli_graph(int argc, char **argv);
int cli_plan(int argc, char **argv);
/* The flag loop of a subcommand: "--flag value" or "--flag=value", each handed to apply(opts,
 * flag, value); -h/--help prints usage to stdout. Returns 0 to go on, -1 after --help, else the
 * exit code (2 for a bad or unknown flag, with the message printed). */
int cli_parse_flags(const char *command, int argc, char **argv, void (*usage)(FILE *),
                    int (*apply)(void *opts, const char *flag, const char *value), void *opts);
/* The --model config (path NULL: the built-in gpt-tiny) and a label for summaries; exit code 2
 * with the message when it does not load. */
int cli_load_model(const char *command, const char *path, adt_model_cfg *m, char *label, size_t n);
/* An integer flag value in [lo, hi], else exit code 2 with a message naming the flag. */
int cli_parse_long(const char *command, const char *flag, const char *v, long lo, long hi, long *out);

/* Distributed runs: every rank makes the same checks, and only rank 0 speaks. cli_quiet is set on
 * the other ranks (no banner, progress or notices); their error lines name the rank. */
extern int cli_quiet;
void cli_set_rank(int rank, int nranks);
/* While on, cli_fail keeps its first message instead of printing it, so that ranks can first
 * agree on who failed and then print one message (cli_print_deferred). */
void cli_defer_errors(int on);
void cli_print_deferred(void);

#endif
