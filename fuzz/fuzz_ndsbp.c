/*
 * fuzz_ndsbp.c - libFuzzer target for the nd-SBP text form, and for boxing between any two
 * states it accepts.
 *
 * Input: byte 0 picks the mesh (1..3 axes of 1..4), byte 1 the tensor (rank 1..4, sizes
 * 1..5), the rest is text "FROM|TO". Each side must parse or fail with a message naming the
 * text; a state that parses prints back to text that parses to the same state. When both parse,
 * the cheapest program between them must exist, be a chain of valid steps, and run in memory
 * (the result is compared with the target layout by tests/test_dist_vmesh.c; here it must
 * simply not crash or leak).
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/dist.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_ASSERT(cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) adt_abort(__FILE__, __LINE__, "fuzz invariant failed: %s", #cond);        \
    } while (0)

static int parse_checked(const char *text, int mesh_ndim, int rank, adt_ndsbp *s) {
    if (adt_ndsbp_parse(text, mesh_ndim, rank, s) != ADT_OK) {
        FUZZ_ASSERT(strncmp(adt_error_message(), "nd-SBP", 6) == 0);
        return -1;
    }
    FUZZ_ASSERT(s->ndim == mesh_ndim);
    for (int a = 0; a < s->ndim; a++)
        FUZZ_ASSERT(s->s[a].kind != ADT_SBP_S || (s->s[a].axis >= 0 && s->s[a].axis < rank));
    char buf[64];
    adt_ndsbp back;
    FUZZ_ASSERT(adt_ndsbp_parse(adt_ndsbp_str(s, buf, sizeof buf), mesh_ndim, rank, &back) == ADT_OK);
    FUZZ_ASSERT(adt_ndsbp_equal(s, &back));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 256) return 0;
    adt_error_clear();
    int mesh_ndim = 1 + data[0] % 3, dims[3];
    for (int a = 0; a < 3; a++) dims[a] = 1 + (data[0] >> (2 + 2 * a)) % 4;
    int rank = 1 + data[1] % 4;
    adt_shape shape = {0};
    shape.ndim = rank;
    for (int d = 0; d < rank; d++) shape.dim[d] = 1 + (data[1] >> 2) % 5 + d;
    char *text = malloc(size - 1);
    memcpy(text, data + 2, size - 2);
    text[size - 2] = 0;
    char *bar = strchr(text, '|');
    adt_ndsbp from, to;
    int ok_from = parse_checked(text, mesh_ndim, rank, &from) == 0; /* the whole text first */
    if (bar) {
        *bar = 0;
        ok_from = parse_checked(text, mesh_ndim, rank, &from) == 0;
        int ok_to = parse_checked(bar + 1, mesh_ndim, rank, &to) == 0;
        if (ok_from && ok_to) {
            adt_mesh m;
            FUZZ_ASSERT(adt_mesh_init(&m, mesh_ndim, dims) == ADT_OK);
            adt_comm_cost cc = {{1e-6, 2e-6, 3e-6}, {1e-9, 1e-10, 1e-11}, 1e-12};
            adt_boxing_prog p;
            FUZZ_ASSERT(adt_boxing_plan(&m, shape, ADT_F32, &from, &to, &cc, &p) == ADT_OK);
            for (int i = 0; i < p.n_steps; i++)
                FUZZ_ASSERT(adt_boxing_step_valid(&p.step[i].from, p.step[i].mesh_axis,
                                                  p.step[i].to.s[p.step[i].mesh_axis]));
            void **bufs = calloc((size_t)m.nranks, sizeof *bufs);
            for (int r = 0; r < m.nranks; r++) {
                int c[ADT_MAX_MESH_DIMS];
                adt_mesh_coord(&m, r, c);
                adt_box b = adt_ndsbp_block(&from, &m, c, shape);
                bufs[r] = calloc((size_t)adt_shape_numel(&b.shape) + 1, 4);
            }
            FUZZ_ASSERT(adt_boxing_run_virtual(&p, &m, bufs) == ADT_OK);
            for (int r = 0; r < m.nranks; r++) free(bufs[r]);
            free(bufs);
        }
    }
    free(text);
    return 0;
}
