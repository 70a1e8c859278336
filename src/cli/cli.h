/*
 * cli.h - the subcommands of the `adtrain` command.
 */
#ifndef ADTRAIN_CLI_H
#define ADTRAIN_CLI_H

#define ADT_VERSION "0.1.0"

int cli_train(int argc, char **argv);
/* Prints "adtrain <command>: <message>" to stderr and returns `code`, so that a subcommand can
 * `return cli_fail("train", 2, "...")`. */
int cli_fail(const char *command, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int cli_graph(int argc, char **argv);

/* Distributed runs: every rank makes the same checks, and only rank 0 speaks. cli_quiet is set on
 * the other ranks (no banner, progress or notices); their error lines name the rank. */
extern int cli_quiet;
void cli_set_rank(int rank, int nranks);
/* While on, cli_fail keeps its first message instead of printing it, so that ranks can first
 * agree on who failed and then print one message (cli_print_deferred). */
void cli_defer_errors(int on);
void cli_print_deferred(void);

#endif
