/*
 * test_dist_algebra.c - the nd-SBP algebra by itself: meshes, blocks (partition, nesting order,
 * bounds), the nd-SBP text form, n-D signature enumeration and its shape check, localisation of
 * attributes, boxing costs against the closed forms, known shortest paths, and the nested-split
 * rule. tests/test_dist_vmesh.c runs the same pieces end to end against the serial ops.
 */
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "dist_check.h"

static adt_mesh mesh(int nd, int a, int b, int c) {
    adt_mesh m;
    int dims[3] = {a, b, c};
    adt_mesh_init(&m, nd, dims);
    return m;
}

static adt_ndsbp nd(const char *s, int mesh_ndim, int rank) {
    adt_ndsbp x;
    if (adt_ndsbp_parse(s, mesh_ndim, rank, &x)) fprintf(stderr, "parse '%s': %s\n", s, adt_error_message());
    return x;
}

static void test_mesh(void) {
    adt_mesh m;
    CHECK(adt_mesh_init(&m, 0, (int[]){1}) == ADT_ERR_ARG, "0 axes accepted");
    CHECK(strstr(adt_error_message(), "0 axes"), "%s", adt_error_message());
    CHECK(adt_mesh_init(&m, 2, (int[]){2, 0}) == ADT_ERR_ARG, "axis of size 0 accepted");
    CHECK(strstr(adt_error_message(), "axis 1 has size 0"), "%s", adt_error_message());
    CHECK(adt_mesh_init(&m, 4, (int[]){1, 1, 1, 1}) == ADT_ERR_ARG, "4 axes accepted");
    m = mesh(3, 2, 3, 4);
    CHECK(m.nranks == 24, "nranks %d", m.nranks);
    for (int i = 0; i < m.nranks; i++) {
        int c[3];
        adt_mesh_coord(&m, i, c);
        CHECK(c[0] == i / 12 && c[1] == i / 4 % 3 && c[2] == i % 4, "coordinate of %d is (%d,%d,%d)", i, c[0], c[1], c[2]);
        CHECK(adt_mesh_index(&m, c) == i, "index round trip of %d", i);
        CHECK(adt_mesh_rank(&m, c) == i, "identity ranks");
    }
    int ranks[6] = {5, 4, 3, 2, 1, 0};
    m = mesh(2, 2, 3, 0);
    m.ranks = ranks;
    CHECK(adt_mesh_rank(&m, (int[]){1, 0}) == 2, "rank table not used");
    char buf[32];
    CHECK(!strcmp(adt_mesh_str(&m, buf, sizeof buf), "(2,3)"), "%s", buf);
}

/* The nesting order by hand: (S0,S0) on (2,3) over 7 cuts [0,4) | [4,7), then each in three. */
static void test_nesting_by_hand(void) {
    adt_mesh m = mesh(2, 2, 3, 0);
    adt_ndsbp s = nd("(S0,S0)", 2, 1);
    static const int64_t want[2][3][2] = {{{0, 2}, {2, 1}, {3, 1}}, {{4, 1}, {5, 1}, {6, 1}}};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            adt_box x = adt_ndsbp_block(&s, &m, (int[]){a, b}, adt_shape_1d(7));
            CHECK(x.offset[0] == want[a][b][0] && x.shape.dim[0] == want[a][b][1], "(%d,%d): [%lld,+%lld)", a, b,
                  (long long)x.offset[0], (long long)x.shape.dim[0]);
            CHECK(x.global.dim[0] == 7, "global shape lost");
        }
    /* different tensor axes split independently; B and P leave the block whole */
    s = nd("(S1, S0)", 2, 2);
    adt_box x = adt_ndsbp_block(&s, &m, (int[]){1, 2}, adt_shape_2d(7, 5));
    CHECK(x.offset[1] == 3 && x.shape.dim[1] == 2 && x.offset[0] == 5 && x.shape.dim[0] == 2, "(S1,S0) at (1,2)");
    s = nd("P,B", 2, 2);
    x = adt_ndsbp_block(&s, &m, (int[]){1, 2}, adt_shape_2d(7, 5));
    CHECK(adt_shape_equal(&x.shape, &x.global) && x.offset[0] == 0 && x.offset[1] == 0, "(P,B) is not whole");
    /* one axis: exactly adt_block_range */
    adt_mesh m1 = mesh(1, 4, 0, 0);
    s = nd("S0", 1, 1);
    for (int i = 0; i < 4; i++) {
        int64_t st, len;
        adt_block_range(9, 4, i, &st, &len);
        x = adt_ndsbp_block(&s, &m1, (int[]){i}, adt_shape_1d(9));
        CHECK(x.offset[0] == st && x.shape.dim[0] == len, "1-D block %d", i);
    }
}

/* Every state on every mesh: each element is held by exactly prod(B and P axis sizes) ranks,
 * blocks stay inside the tensor, and adt_ndsbp_block_bounds are the true extremes. */
static void test_blocks_partition(void) {
    static const int meshes[][4] = {{1, 2}, {1, 3}, {1, 4}, {2, 2, 2}, {2, 2, 3}, {3, 2, 2, 2}, {3, 3, 1, 2}};
    adt_shape shapes[] = {adt_shape_1d(7), adt_shape_2d(7, 5), adt_shape_3d(5, 7, 6), adt_shape_1d(3)};
    int checked = 0;
    for (size_t mi = 0; mi < sizeof meshes / sizeof meshes[0]; mi++) {
        adt_mesh m;
        adt_mesh_init(&m, meshes[mi][0], &meshes[mi][1]);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            adt_shape sh = shapes[si];
            int base = sh.ndim + 2, n = 1;
            for (int a = 0; a < m.ndim; a++) n *= base;
            int64_t numel = adt_shape_numel(&sh);
            int *cover = malloc((size_t)numel * sizeof *cover);
            for (int id = 0; id < n; id++) {
                adt_ndsbp s = adt_ndsbp_all_b(m.ndim);
                int repl = 1;
                for (int a = m.ndim - 1, x = id; a >= 0; a--, x /= base) {
                    int c = x % base;
                    s.s[a] = c == 0 ? (adt_sbp){ADT_SBP_B, 0} : c == 1 ? (adt_sbp){ADT_SBP_P, 0} : (adt_sbp){ADT_SBP_S, (int8_t)(c - 2)};
                    if (c < 2) repl *= m.dim[a];
                }
                memset(cover, 0, (size_t)numel * sizeof *cover);
                adt_shape lo, hi, tlo = sh, thi = {0};
                thi.ndim = sh.ndim;
                adt_ndsbp_block_bounds(&s, &m, sh, &lo, &hi);
                int nonempty = 1;
                for (int r = 0; r < m.nranks; r++) {
                    int c[3];
                    adt_mesh_coord(&m, r, c);
                    adt_box b = adt_ndsbp_block(&s, &m, c, sh);
                    for (int d = 0; d < sh.ndim; d++) {
                        CHECK(b.offset[d] >= 0 && b.offset[d] + b.shape.dim[d] <= sh.dim[d], "block outside the tensor");
                        if (b.shape.dim[d] < tlo.dim[d]) tlo.dim[d] = b.shape.dim[d];
                        if (b.shape.dim[d] > thi.dim[d]) thi.dim[d] = b.shape.dim[d];
                        nonempty &= b.shape.dim[d] > 0;
                    }
                    for (int64_t e = 0; e < adt_shape_numel(&b.shape); e++) cover[dc_global_index(&b, e)]++;
                }
                int bad = 0;
                for (int64_t e = 0; e < numel; e++) bad += cover[e] != repl;
                char sb[64], mb[32], shb[32];
                CHECK(bad == 0, "%s on %s over %s: %d elements not held %d times", adt_ndsbp_str(&s, sb, sizeof sb),
                      adt_mesh_str(&m, mb, sizeof mb), adt_shape_str(&sh, shb, sizeof shb), bad, repl);
                CHECK(adt_shape_equal(&lo, &tlo) && adt_shape_equal(&hi, &thi), "%s on %s: bounds differ from the blocks",
                      adt_ndsbp_str(&s, sb, sizeof sb), adt_mesh_str(&m, mb, sizeof mb));
                CHECK(adt_ndsbp_fits(&s, &m, sh) == nonempty, "%s on %s over %s: fits says %d", sb, mb, shb, !nonempty);
                checked++;
            }
            free(cover);
        }
    }
    CHECK(checked > 600, "only %d states", checked);
}

static void test_parse(void) {
    static const struct {
        const char *text;
        int mesh_ndim, rank;
        const char *canon;
    } good[] = {
        {"(S0,B)", 2, 3, "(S(0),B)"},  {"S(1), P", 2, 3, "(S(1),P)"}, {" ( S-1 , S(0) , B ) ", 3, 3, "(S(2),S(0),B)"},
        {"P", 1, 1, "(P)"},          {"(S(-2))", 1, 4, "(S(2))"},    {"B,B,B", 3, 1, "(B,B,B)"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        adt_ndsbp s, back;
        char buf[64];
        int rc = adt_ndsbp_parse(good[i].text, good[i].mesh_ndim, good[i].rank, &s);
        CHECK(rc == ADT_OK, "'%s': %s", good[i].text, adt_error_message());
        CHECK(!strcmp(adt_ndsbp_str(&s, buf, sizeof buf), good[i].canon), "'%s' -> %s, expected %s", good[i].text, buf,
              good[i].canon);
        CHECK(adt_ndsbp_parse(buf, good[i].mesh_ndim, good[i].rank, &back) == ADT_OK && adt_ndsbp_equal(&s, &back),
              "round trip of %s", buf);
    }
    static const struct {
        const char *text;
        int mesh_ndim, rank;
        const char *msg;
    } bad[] = {
        {"(S0,B)", 1, 2, "expected one per mesh axis (1)"},
        {"(S3)", 1, 2, "splits axis 3 of a rank-2 tensor"},
        {"(S-3)", 1, 2, "splits axis -3"},
        {"(Q)", 1, 2, "'Q' is not B, P or S(k)"},
        {"(S0", 1, 2, "expected ')'"},
        {"S0)", 1, 2, "unexpected text"},
        {"(S0,,B)", 2, 2, "entry 1 '' is not"},
        {"(B,B,B,B)", 3, 2, "more than 3 entries"},
        {"", 1, 1, "entry 0 '' is not"},
        {"(S(0)", 1, 2, "expected ')'"},
        {"SSSSSSSSSSSSSSSSSSSS", 1, 1, "too long"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        adt_ndsbp s;
        int rc = adt_ndsbp_parse(bad[i].text, bad[i].mesh_ndim, bad[i].rank, &s);
        CHECK(rc == ADT_ERR_ARG, "'%s' accepted", bad[i].text);
        CHECK(strstr(adt_error_message(), bad[i].msg) != NULL, "'%s': message '%s' lacks '%s'", bad[i].text,
              adt_error_message(), bad[i].msg);
    }
}

static void test_nd_sigs(void) {
    adt_graph *g = adt_graph_create();
    int a = adt_input(g, "a", ADT_F32, adt_shape_2d(7, 11)), b = adt_input(g, "b", ADT_F32, adt_shape_2d(11, 2));
    int y = adt_matmul(g, a, b, 0, 0, 0);
    int node = g->values[y].producer;
    adt_sbp_sig s1[32];
    int n1 = adt_node_sbp_signatures(g, &g->nodes[node], s1, 32);
    adt_mesh m = mesh(2, 2, 3, 0);
    CHECK(adt_nd_sig_count(n1, 2) == n1 * n1, "count");
    /* decode order: axis 0 most significant */
    int choice[3];
    adt_nd_sig_choice(n1 + 2, n1, 2, choice);
    CHECK(choice[0] == 1 && choice[1] == 2, "choice (%d,%d)", choice[0], choice[1]);
    adt_nd_sig p;
    adt_nd_sig_product(s1, choice, 2, 2, 1, &p);
    CHECK(p.in[0].s[0].kind == s1[1].in[0].kind && p.out[0].s[1].kind == s1[2].out[0].kind, "product");
    /* N = 2 cannot be split over 3: every product that splits b's columns on axis 1 is refused */
    int total = adt_node_nd_sigs(g, node, &m, NULL, 0);
    adt_nd_sig *all = calloc((size_t)total, sizeof *all);
    CHECK(adt_node_nd_sigs(g, node, &m, all, total) == total, "count changed");
    CHECK(total < n1 * n1 && total > n1, "%d usable of %d", total, n1 * n1);
    adt_nd_sig allb = adt_nd_sig_all_b(2, 2, 1);
    CHECK(!memcmp(&all[0].in[0], &allb.in[0], sizeof allb.in[0]) && !memcmp(&all[0].out[0], &allb.out[0], sizeof allb.out[0]),
          "all-B is not first");
    for (int i = 0; i < total; i++) {
        CHECK(adt_nd_sig_check(g, node, &all[i], &m) == ADT_OK, "listed signature %d fails its check", i);
        CHECK(!(all[i].in[1].s[1].kind == ADT_SBP_S && all[i].in[1].s[1].axis == 1), "a split of N=2 over 3 is listed");
    }
    /* the cap: fewer written than usable, the count still the full one */
    adt_nd_sig two[2];
    CHECK(adt_node_nd_sigs(g, node, &m, two, 2) == total, "capped call changed the count");
    char buf[256];
    CHECK(!strcmp(adt_nd_sig_str(&all[0], 2, 1, buf, sizeof buf), "(B,B) (B,B) -> (B,B)"), "%s", buf);
    free(all);
    adt_graph_free(g);
}

/* A refused signature says which node, value and coordinate, and why. */
static void test_sig_check_messages(void) {
    adt_graph *g = adt_graph_create();
    int x = adt_input(g, "x", ADT_F32, adt_shape_3d(7, 11, 13));
    int y = adt_reshape(g, x, adt_shape_2d(77, 13));
    int node = g->values[y].producer;
    adt_mesh m = mesh(1, 2, 0, 0);
    adt_nd_sig s = adt_nd_sig_all_b(1, 1, 1);
    s.in[0] = nd("S0", 1, 3);
    s.out[0] = nd("S0", 1, 2);
    CHECK(adt_nd_sig_check(g, node, &s, &m) == ADT_ERR_SHAPE, "uneven merge accepted");
    const char *msg = adt_error_message();
    CHECK(strstr(msg, "reshape") && strstr(msg, "(S(0)) -> (S(0))") && strstr(msg, "coordinate (0)") && strstr(msg, "'x'") &&
              strstr(msg, "[4,11,13]"),
          "message: %s", msg);
    /* an even split of the same merge is fine */
    adt_mesh m7 = mesh(1, 7, 0, 0);
    CHECK(adt_nd_sig_check(g, node, &s, &m7) == ADT_OK, "7-way merge refused: %s", adt_error_message());
    adt_mesh m8 = mesh(1, 8, 0, 0);
    CHECK(adt_nd_sig_check(g, node, &s, &m8) == ADT_ERR_SHAPE, "an 8-way split of 7 accepted");
    CHECK(strstr(adt_error_message(), "empty block") && strstr(adt_error_message(), "input 0 ('x'"), "%s",
          adt_error_message());
    adt_graph_free(g);
}

/* The localize rules rewrite exactly the attributes that carry sizes or positions. */
static void test_localize_attrs(void) {
    adt_graph *g = adt_graph_create();
    int ids = adt_input(g, "ids", ADT_I32, adt_shape_2d(3, 4));
    int table = adt_param(g, "table", adt_shape_2d(13, 6), (adt_init){0});
    int e = adt_embedding(g, ids, table);
    int x = adt_input(g, "x", ADT_F32, adt_shape_3d(5, 9, 4));
    int sl = adt_slice(g, x, 1, 2, 6);
    int r = adt_reduce_sum(g, x, 1, 1);
    adt_attrs ea = {.i = {1, 1, 9}};
    int ex = adt_graph_add_node(g, ADT_OP_EXPAND, (int[]){r}, 1, &ea);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    adt_mesh m = mesh(2, 3, 2, 0);
    adt_local_node ln;
    /* vocabulary split: row0 is the first row of the table block */
    adt_nd_sig s = adt_nd_sig_all_b(2, 2, 1);
    s.in[1] = nd("(S0,B)", 2, 2);
    s.out[0] = nd("(P,B)", 2, 3);
    for (int c0 = 0; c0 < 3; c0++) {
        adt_dist_localize(g, g->values[e].producer, &s, &m, (int[]){c0, 1}, &ln);
        int64_t st, len;
        adt_block_range(13, 3, c0, &st, &len);
        CHECK(ln.a.i[0] == st && ln.in[1].shape.dim[0] == len, "embedding row0 %lld at %d, expected %lld", (long long)ln.a.i[0],
              c0, (long long)st);
        CHECK(ln.out_partial[0] == 1u && ln.in_partial[1] == 0, "partial masks");
    }
    /* slice on an axis split elsewhere keeps its start; expand sizes follow the output block */
    s = adt_nd_sig_all_b(2, 1, 1);
    s.in[0] = nd("(S0,S2)", 2, 3);
    s.out[0] = nd("(S0,S2)", 2, 3);
    adt_dist_localize(g, g->values[sl].producer, &s, &m, (int[]){2, 1}, &ln);
    CHECK(ln.a.i[1] == 2 && ln.a.i[2] == 6, "slice start/len %lld/%lld", (long long)ln.a.i[1], (long long)ln.a.i[2]);
    s.in[0] = nd("(S0,B)", 2, 2);
    s.out[0] = nd("(S0,B)", 2, 3);
    adt_dist_localize(g, ex, &s, &m, (int[]){2, 0}, &ln);
    CHECK(ln.a.i[2] == 9 && ln.out[0].shape.dim[0] == 1, "expand size %lld", (long long)ln.a.i[2]);
    /* a local node whose inputs do not match the blocks is refused with the expected shape */
    adt_graph *lg = adt_graph_create();
    int lx = adt_input(lg, "x", ADT_F32, adt_shape_3d(5, 9, 4));
    CHECK(adt_dist_add_local_node(lg, g, &ln, (int[]){lx}) < 0, "mismatched local input accepted");
    CHECK(strstr(adt_graph_error_message(lg), "expected the block [1,4]"), "%s", adt_graph_error_message(lg));
    adt_graph_free(lg);
    adt_graph_free(g);
}

static void test_boxing_costs(void) {
    /* the table of dist.h against numbers worked out by hand: n = 4, G = 1000 bytes */
    CHECK(adt_boxing_bytes(ADT_BOXING_ALL_REDUCE, 4, 1000) == 1500, "all-reduce bytes");
    CHECK(adt_boxing_bytes(ADT_BOXING_REDUCE_SCATTER, 4, 1000) == 750, "reduce-scatter bytes");
    CHECK(adt_boxing_bytes(ADT_BOXING_ALL_GATHER, 4, 1000) == 750, "all-gather bytes");
    CHECK(adt_boxing_bytes(ADT_BOXING_ALL_TO_ALL, 4, 1000) == 187.5, "all-to-all bytes");
    for (int k = ADT_BOXING_SLICE; k <= ADT_BOXING_ZERO_FILL; k++)
        CHECK(adt_boxing_bytes(k, 4, 1000) == 0 && adt_boxing_time(k, 4, 1000, 1, 1, 0.25) == 0.25, "%s is not local",
              adt_boxing_kind_name(k));
    CHECK_CLOSE(adt_boxing_time(ADT_BOXING_ALL_REDUCE, 4, 1000, 1e-5, 1e-9, 0), 6e-5 + 1.5e-6, 1e-12, 0);
    CHECK_CLOSE(adt_boxing_time(ADT_BOXING_ALL_TO_ALL, 4, 1000, 1e-5, 1e-9, 0), 3e-5 + 1.875e-7, 1e-12, 0);
    CHECK(adt_boxing_time(ADT_BOXING_ALL_GATHER, 1, 1000, 1, 1, 0) == 0, "a group of one moves nothing");
    /* kinds */
    adt_sbp B = {ADT_SBP_B, 0}, P = {ADT_SBP_P, 0}, S0 = {ADT_SBP_S, 0}, S1 = {ADT_SBP_S, 1};
    CHECK(adt_boxing_kind_of(P, B) == ADT_BOXING_ALL_REDUCE && adt_boxing_kind_of(P, S1) == ADT_BOXING_REDUCE_SCATTER &&
              adt_boxing_kind_of(S0, B) == ADT_BOXING_ALL_GATHER && adt_boxing_kind_of(S0, S1) == ADT_BOXING_ALL_TO_ALL &&
              adt_boxing_kind_of(B, S0) == ADT_BOXING_SLICE && adt_boxing_kind_of(B, P) == ADT_BOXING_KEEP_ONE &&
              adt_boxing_kind_of(S1, P) == ADT_BOXING_ZERO_FILL && adt_boxing_kind_of(P, P) == -1 &&
              adt_boxing_kind_of(S1, S1) == -1,
          "kind table");
    /* G: the block every other axis cuts, at its largest: (S0,B) on (2,3) over [7,5] f32, step
     * on axis 1 -> ceil(7/2) x 5 x 4 bytes; on axis 0 -> the whole tensor */
    adt_mesh m = mesh(2, 2, 3, 0);
    adt_ndsbp s = nd("(S0,B)", 2, 2);
    CHECK(adt_boxing_group_bytes(&s, 1, &m, adt_shape_2d(7, 5), 4) == 80, "G on axis 1");
    CHECK(adt_boxing_group_bytes(&s, 0, &m, adt_shape_2d(7, 5), 4) == 140, "G on axis 0");
    s = nd("(P,S1)", 2, 2);
    CHECK(adt_boxing_group_bytes(&s, 0, &m, adt_shape_2d(7, 5), 4) == 7 * 2 * 4, "G of a P step under an inner split");
}

static void kinds_of(const adt_boxing_prog *p, int *k) {
    for (int i = 0; i < p->n_steps; i++) k[i] = p->step[i].kind * 10 + p->step[i].mesh_axis;
}

static void test_boxing_known_paths(void) {
    adt_mesh m = mesh(2, 2, 2, 0);
    adt_boxing_prog p;
    char buf[1024];
    int k[ADT_BOXING_MAX_STEPS];
    /* hierarchical all-reduce: reduce-scatter inner, all-reduce outer on half the tensor,
     * all-gather inner: 1 + 2 + 1 messages like two plain all-reduces, but 1.5 T bytes
     * against 2 T */
    adt_comm_cost bw = {{1e-9, 1e-9, 1e-9}, {1e-9, 1e-9, 1e-9}, 1e-15};
    adt_ndsbp pp = nd("(P,P)", 2, 1), bb = nd("(B,B)", 2, 1);
    CHECK(adt_boxing_plan(&m, adt_shape_1d(1 << 20), ADT_F32, &pp, &bb, &bw, &p) == ADT_OK, "%s", adt_error_message());
    kinds_of(&p, k);
    CHECK(p.n_steps == 3 && k[0] == ADT_BOXING_REDUCE_SCATTER * 10 + 1 && k[1] == ADT_BOXING_ALL_REDUCE * 10 + 0 &&
              k[2] == ADT_BOXING_ALL_GATHER * 10 + 1,
          "hierarchical all-reduce expected:\n%s", adt_boxing_prog_str(&p, buf, sizeof buf));
    double T = 4.0 * (1 << 20);
    CHECK_CLOSE(p.time, 4e-9 + 1.5 * T * 1e-9, 1e-9, 0);
    /* a slow outer axis: the same path, the outer step priced with the outer link */
    adt_comm_cost skew = {{1e-5, 1e-6, 0}, {1e-8, 1e-10, 0}, 0};
    adt_boxing_plan(&m, adt_shape_1d(1 << 20), ADT_F32, &pp, &bb, &skew, &p);
    CHECK(p.n_steps == 3 && p.step[1].mesh_axis == 0, "skewed:\n%s", adt_boxing_prog_str(&p, buf, sizeof buf));
    CHECK_CLOSE(p.time, 2e-6 + 2 * 0.5 * T * 1e-10 + 2e-5 + 0.5 * T * 1e-8, 1e-9, 0);
    /* one axis: P -> B is one all-reduce priced by the formula */
    adt_mesh m4 = mesh(1, 4, 0, 0);
    adt_ndsbp p1 = nd("P", 1, 2), b1 = nd("B", 1, 2), s0 = nd("S0", 1, 2), s1 = nd("S1", 1, 2);
    adt_boxing_plan(&m4, adt_shape_2d(8, 8), ADT_F32, &p1, &b1, &bw, &p);
    CHECK(p.n_steps == 1 && p.step[0].kind == ADT_BOXING_ALL_REDUCE && p.step[0].bytes == 1.5 * 256, "P->B:\n%s",
          adt_boxing_prog_str(&p, buf, sizeof buf));
    CHECK_CLOSE(p.time, 6e-9 + 384e-9, 1e-12, 0);
    adt_boxing_plan(&m4, adt_shape_2d(8, 8), ADT_F32, &s0, &s1, &bw, &p);
    CHECK(p.n_steps == 1 && p.step[0].kind == ADT_BOXING_ALL_TO_ALL && p.step[0].from_axis == 0 && p.step[0].to_axis == 1,
          "S0->S1:\n%s", adt_boxing_prog_str(&p, buf, sizeof buf));
    adt_boxing_plan(&m4, adt_shape_2d(8, 8), ADT_F32, &s1, &s1, &bw, &p);
    CHECK(p.n_steps == 0 && p.time == 0, "identity has steps");
    /* nested: (S0,S0) -> (B,S0) may not gather the outer axis first */
    adt_ndsbp ss = nd("(S0,S0)", 2, 1), bs = nd("(B,S0)", 2, 1);
    adt_boxing_plan(&m, adt_shape_1d(64), ADT_F32, &ss, &bs, &bw, &p);
    CHECK(p.n_steps == 3 && p.step[0].kind == ADT_BOXING_ALL_GATHER && p.step[0].mesh_axis == 1 &&
              p.step[1].kind == ADT_BOXING_ALL_GATHER && p.step[1].mesh_axis == 0 && p.step[2].kind == ADT_BOXING_SLICE,
          "nested gather order:\n%s", adt_boxing_prog_str(&p, buf, sizeof buf));
    /* bad states */
    adt_ndsbp bad = nd("S1", 1, 2);
    CHECK(adt_boxing_plan(&m4, adt_shape_1d(8), ADT_F32, &bad, &b1, &bw, &p) == ADT_ERR_ARG, "split of a missing axis planned");
    CHECK(strstr(adt_error_message(), "does not fit a rank-1 tensor"), "%s", adt_error_message());
    CHECK(adt_boxing_plan(&m, adt_shape_1d(8), ADT_F32, &b1, &b1, &bw, &p) == ADT_ERR_ARG, "1-axis state on a 2-axis mesh");
}

/* Why outer gathers under an inner split of the same axis are excluded: the group's blocks are
 * not the target block. */
static void test_boxing_nested_rule(void) {
    adt_mesh m = mesh(2, 2, 2, 0);
    adt_ndsbp ss = nd("(S0,S0)", 2, 1), bs = nd("(B,S0)", 2, 1), s1 = nd("(S0,S1)", 2, 2);
    adt_sbp B = {ADT_SBP_B, 0}, S0 = {ADT_SBP_S, 0}, P = {ADT_SBP_P, 0};
    CHECK(!adt_boxing_step_valid(&ss, 0, B), "outer gather under an inner split of the same axis allowed");
    CHECK(adt_boxing_step_valid(&ss, 1, B), "inner gather refused");
    CHECK(adt_boxing_step_valid(&s1, 0, B), "outer gather under an inner split of another axis refused");
    adt_ndsbp bss = nd("(B,S0)", 2, 1);
    CHECK(!adt_boxing_step_valid(&bss, 0, S0), "outer slice under an inner split of the same axis allowed");
    CHECK(adt_boxing_step_valid(&bss, 0, P), "outer keep-one refused");
    /* the naive gather over axis 0 at c1 = 1 collects blocks (0,1) and (1,1) of [7] */
    adt_shape sh = adt_shape_1d(7);
    adt_box a = adt_ndsbp_block(&ss, &m, (int[]){0, 1}, sh), b = adt_ndsbp_block(&ss, &m, (int[]){1, 1}, sh);
    adt_box want = adt_ndsbp_block(&bs, &m, (int[]){0, 1}, sh);
    int contiguous = a.offset[0] + a.shape.dim[0] == b.offset[0];
    CHECK(!contiguous || a.offset[0] != want.offset[0] || a.shape.dim[0] + b.shape.dim[0] != want.shape.dim[0],
          "the naive gather would have been right");
    /* the executor refuses such a step */
    adt_boxing_prog p = {.global = sh, .dtype = ADT_F32, .n_steps = 1};
    p.step[0] = (adt_boxing_step){.mesh_axis = 0, .kind = ADT_BOXING_ALL_GATHER, .from = ss, .to = bs};
    void *bufs[4];
    for (int r = 0; r < 4; r++) bufs[r] = calloc(8, 4);
    CHECK(adt_boxing_run_virtual(&p, &m, bufs) == ADT_ERR_ARG, "invalid step run");
    CHECK(strstr(adt_error_message(), "not a valid single-axis step"), "%s", adt_error_message());
    /* and sums of integers */
    adt_ndsbp pb = nd("(P,B)", 2, 1), bb = nd("(B,B)", 2, 1);
    p.step[0] = (adt_boxing_step){.mesh_axis = 0, .kind = ADT_BOXING_ALL_REDUCE, .from = pb, .to = bb};
    p.dtype = ADT_I32;
    CHECK(adt_boxing_run_virtual(&p, &m, bufs) == ADT_ERR_ARG, "integer all-reduce run");
    CHECK(strstr(adt_error_message(), "sums need f32"), "%s", adt_error_message());
    /* nor does the planner route integers through P, nor accept P ends for them */
    adt_boxing_prog q;
    adt_ndsbp s0b = nd("(S0,B)", 2, 2), bs1 = nd("(B,S1)", 2, 2);
    adt_comm_cost cc = {{1e-6, 1e-6}, {1e-9, 1e-9}, 0};
    CHECK(adt_boxing_plan(&m, adt_shape_2d(8, 8), ADT_I32, &s0b, &bs1, &cc, &q) == ADT_OK, "%s", adt_error_message());
    for (int i = 0; i < q.n_steps; i++) CHECK(!adt_ndsbp_partial_mask(&q.step[i].to), "an i32 program passes through P");
    CHECK(adt_boxing_plan(&m, sh, ADT_I32, &pb, &bb, &cc, &q) == ADT_ERR_ARG && strstr(adt_error_message(), "partial sums"),
          "%s", adt_error_message());
    /* a program avoids states with empty blocks when it can: [5] on (2,3) from (S0,B) to (B,S0)
     * may not pass (S0,S0), whose block at (1,2) is empty */
    adt_mesh m23 = mesh(2, 2, 3, 0);
    adt_ndsbp from5 = nd("(S0,B)", 2, 1), to5 = nd("(B,S0)", 2, 1);
    CHECK(adt_boxing_plan(&m23, adt_shape_1d(5), ADT_F32, &from5, &to5, &cc, &q) == ADT_OK, "%s", adt_error_message());
    for (int i = 0; i < q.n_steps; i++) CHECK(adt_ndsbp_fits(&q.step[i].to, &m23, adt_shape_1d(5)), "a step into an empty block");
    for (int r = 0; r < 4; r++) free(bufs[r]);
}

int main(void) {
    RUN(test_mesh);
    RUN(test_nesting_by_hand);
    RUN(test_blocks_partition);
    RUN(test_parse);
    RUN(test_nd_sigs);
    RUN(test_sig_check_messages);
    RUN(test_localize_attrs);
    RUN(test_boxing_costs);
    RUN(test_boxing_known_paths);
    RUN(test_boxing_nested_rule);
    return check_finish();
}
