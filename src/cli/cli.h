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
int cli_ckpt(int argc, char **argv);

#endif
