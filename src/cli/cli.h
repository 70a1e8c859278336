/*
 * cli.h - the subcommands of the `adtrain` command.
 */
#ifndef ADTRAIN_CLI_H
#define ADTRAIN_CLI_H

#define ADT_VERSION "0.1.0"

int cli_train(int argc, char **argv);
int cli_graph(int argc, char **argv);

#endif
