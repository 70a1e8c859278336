/*
 * adtrain/adtrain.h - the whole public API of adtrain in one include.
 */
#ifndef ADTRAIN_ADTRAIN_H
#define ADTRAIN_ADTRAIN_H

#include "adtrain/base.h"
#include "adtrain/tensor.h"
#include "adtrain/comm.h"
#include "adtrain/graph.h"
#include "adtrain/ops.h"
#include "adtrain/exec.h"
#include "adtrain/models.h"

#endif
