/*
 * comm_shm.h - what the MPI backend (comm_mpi.c) uses of the shared-memory all-reduce,
 * reduce-scatter and all-gather (comm_shm.c).
 */
#ifndef ADTRAIN_COMM_SHM_H
#define ADTRAIN_COMM_SHM_H

#include <mpi.h>

#include "comm_internal.h"

/* Shared-memory all-reduce, reduce-scatter and all-gather for the MPI backend (comm_shm.c). comm_shm_setup is collective over
 * comm (made with it, under the watchdog); *out stays NULL where the ranks cannot share memory
 * (another node, ADT_COMM_SHM=0, fewer than 2 ranks): MPI's path then. An eligible operation
 * (comm_shm_eligible) runs as a shm_op of comm_shm_op_size bytes (the request's memory);
 * a reduce-scatter's and an all-gather's counts and offsets (cnt, dsp: NULL for an all-reduce)
 * are read until it is done, as MPI reads a v-collective's. */
typedef struct comm_shm comm_shm;
typedef struct shm_op shm_op;
void comm_shm_setup(MPI_Comm comm, comm_shm **out);
void comm_shm_free(comm_shm *s);
int comm_shm_eligible(const comm_shm *s, const comm_op *op);
size_t comm_shm_op_size(const comm_shm *s);
void comm_shm_start(comm_shm *s, shm_op *o, const comm_op *op, const int *cnt, const int *dsp);
int comm_shm_test(shm_op *o, int *done, char *why);
/* Advances every shared-memory operation in flight (any MPI test calls it). */
void comm_shm_progress(void);

#endif
