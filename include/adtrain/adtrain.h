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
#include "adtrain/gemm.h"
#include "adtrain/exec.h"
#include "adtrain/dist.h"
#include "adtrain/models.h"
#include "adtrain/data.h"
#include "adtrain/safetensors.h"
#include "adtrain/ckpt.h"
#include "adtrain/agent.h"
#include "adtrain/ledger.h"
#include "adtrain/elastic.h"

#endif
