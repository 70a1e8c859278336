/*
 * optim.c - the servers' per-row optimizers: SGD, Adagrad and Adam with lazy moments.
 *
 * SGD and Adam call the executor's own update kernels (src/ops/k_optim.c, weight decay 0), so a
 * row updated here gets the bits a dense parameter would get from the training graph. Adagrad has
 * no graph op; it follows PyTorch's dense _single_tensor_adagrad (lr_decay 0, weight decay 0,
 * initial accumulator 0): s.addcmul_(g, g); std = s.sqrt().add_(eps); w.addcdiv_(g, std, -lr).
 */
#include <math.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ps.h"
#include "ops/kernels.h"

int adt_ps_optim_states(adt_ps_optim_kind k) { return k == ADT_PS_ADAM ? 2 : k == ADT_PS_ADAGRAD ? 1 : 0; }

int adt_ps_optim_parse(const char *s, const char *what, adt_ps_optim_kind *out) {
    if (s && !strcmp(s, "sgd")) return *out = ADT_PS_SGD, ADT_OK;
    if (s && !strcmp(s, "adagrad")) return *out = ADT_PS_ADAGRAD, ADT_OK;
    if (s && !strcmp(s, "adam")) return *out = ADT_PS_ADAM, ADT_OK;
    return adt_error(ADT_ERR_ARG, "%s: '%s', expected a sparse optimizer: sgd, adagrad or adam", what,
                     s ? s : "(null)");
}

static void adagrad(float *w, float *s, const float *g, int64_t n, float lr, float eps) {
    const float neg_lr = -lr;
    for (int64_t i = 0; i < n; i++) {
        s[i] = s[i] + g[i] * g[i];
        w[i] = w[i] + (neg_lr * g[i]) / (sqrtf(s[i]) + eps);
    }
}

void adt_ps_optim_apply(const adt_ps_optim *o, float *w, float *state, const float *g, int64_t n, int64_t step) {
    switch (o->kind) {
    case ADT_PS_SGD: adt_k_sgd_update(w, NULL, g, n, o->lr, 0.0f, 0.0f, step); break;
    case ADT_PS_ADAGRAD: adagrad(w, state, g, n, o->lr, o->eps); break;
    case ADT_PS_ADAM: adt_k_adamw_update(w, state, state + n, g, n, o->lr, o->beta1, o->beta2, o->eps, 0.0f, step); break;
    }
}
