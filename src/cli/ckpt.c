/*
 * ckpt.c - `adtrain ckpt`: distributed checkpoints from the command line. `export` joins one
 * into a single safetensors file (for PyTorch, or for `adtrain train --init/--resume` in one
 * process); `info` describes one and checks every file against its size and crc32c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "cli.h"

#define ckpt_fail(...) cli_fail("ckpt", __VA_ARGS__)

static void ckpt_usage(FILE *f) {
    fprintf(f, "usage: adtrain ckpt export DIR -o FILE.safetensors [--params-only]\n"
               "       adtrain ckpt info DIR\n"
               "\n"
               "DIR is a distributed checkpoint: a directory with manifest.json and one safetensors file per\n"
               "rank that held state (docs/formats.md, \"Distributed checkpoints\").\n"
               "\n"
               "  export   writes every tensor whole into one safetensors file, with the checkpoint's metadata:\n"
               "           PyTorch reads it (safetensors.torch.load_file), and so do adtrain train --init and\n"
               "           --resume. --params-only leaves the optimizer state (opt.*) out.\n"
               "  info     prints the step, world size, metadata, tensors and files, and checks every file\n"
               "           against the size and crc32c the manifest records.\n"
               "\n"
               "exit status: 0 done, 1 failure writing the file, 2 bad flag or damaged checkpoint\n");
}

static int open_dir(const char *dir, adt_dckpt **c) {
    if (adt_dckpt_open(c, dir)) return ckpt_fail(2, "%s", adt_error_message());
    return 0;
}

static int cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    int with_state = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) return ckpt_fail(2, "%s: missing value, expected the output file", a);
            out = argv[++i];
        } else if (!strncmp(a, "--output=", 9)) {
            out = a + 9;
        } else if (!strcmp(a, "--params-only")) {
            with_state = 0;
        } else if (a[0] == '-') {
            return ckpt_fail(2, "export: unknown flag '%s' (see adtrain ckpt --help)", a);
        } else if (dir) {
            return ckpt_fail(2, "export: unexpected argument '%s', expected one checkpoint directory", a);
        } else {
            dir = a;
        }
    }
    if (!dir || !out)
        return ckpt_fail(2, "export: expected a checkpoint directory and -o FILE.safetensors (see adtrain ckpt --help)");
    adt_dckpt *c;
    int rc = open_dir(dir, &c);
    if (rc) return rc;
    int err = adt_dckpt_export(c, out, with_state);
    if (err) { /* a file that does not match the manifest is bad input; anything else failed writing */
        rc = ckpt_fail(err == ADT_ERR_FORMAT ? 2 : 1, "%s", adt_error_message());
    } else {
        int n = 0;
        for (int i = 0; i < adt_dckpt_tensor_count(c); i++)
            n += with_state || strncmp(adt_dckpt_tensor_get(c, i)->name, "opt.", 4);
        printf("wrote %s: %d tensors of step %lld from %d files\n", out, n, (long long)adt_dckpt_step(c),
               adt_dckpt_file_count(c));
    }
    adt_dckpt_close(c);
    return rc;
}

static int cmd_info(int argc, char **argv) {
    if (argc != 1 || argv[0][0] == '-')
        return ckpt_fail(2, "info: expected one checkpoint directory%s%s%s", argc ? ", got '" : "", argc ? argv[0] : "",
                         argc ? "'" : "");
    adt_dckpt *c;
    int rc = open_dir(argv[0], &c);
    if (rc) return rc;
    uint64_t bytes = 0;
    int nt = adt_dckpt_tensor_count(c), nf = adt_dckpt_file_count(c);
    for (int i = 0; i < nf; i++) bytes += adt_dckpt_file_get(c, i)->bytes;
    printf("checkpoint %s: step %lld, world of %d, %d files, %llu bytes\n", argv[0], (long long)adt_dckpt_step(c),
           adt_dckpt_world(c), nf, (unsigned long long)bytes);
    for (int i = 0; i < adt_dckpt_metadata_count(c); i++) {
        const char *k, *v;
        adt_dckpt_metadata_get(c, i, &k, &v);
        printf("  %s = %.100s%s\n", k, v, strlen(v) > 100 ? "..." : "");
    }
    int *slices = calloc((size_t)nt + 1, sizeof *slices);
    for (int i = 0; i < nf; i++)
        for (int k = 0; k < adt_dckpt_file_get(c, i)->n_slices; k++) slices[adt_dckpt_file_get(c, i)->slices[k].tensor]++;
    printf("%d tensors:\n", nt);
    for (int i = 0; i < nt; i++) {
        const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, i);
        adt_shape s = {.ndim = t->ndim};
        for (int d = 0; d < t->ndim; d++) s.dim[d] = t->shape[d];
        char sh[96];
        printf("  %-40s %s %-16s in %d slice%s\n", t->name, adt_st_dtype_name(t->dtype), adt_shape_str(&s, sh, sizeof sh),
               slices[i], slices[i] == 1 ? "" : "s");
    }
    free(slices);
    printf("%d files:\n", nf);
    for (int i = 0; i < nf; i++) {
        const adt_dckpt_file *f = adt_dckpt_file_get(c, i);
        printf("  %s  rank %d, %llu bytes, crc32c %08x, %d slices\n", f->name, f->rank, (unsigned long long)f->bytes,
               f->crc32c, f->n_slices);
    }
    if (adt_dckpt_verify(c)) rc = ckpt_fail(2, "%s", adt_error_message());
    else printf("verified: every file matches its size, crc32c and slices\n");
    adt_dckpt_close(c);
    return rc;
}

int cli_ckpt(int argc, char **argv) {
    if (argc < 2) {
        ckpt_usage(stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
        ckpt_usage(stdout);
        return 0;
    }
    if (!strcmp(sub, "export")) return cmd_export(argc - 2, argv + 2);
    if (!strcmp(sub, "info")) return cmd_info(argc - 2, argv + 2);
    return ckpt_fail(2, "unknown subcommand '%s', expected 'export' or 'info' (see adtrain ckpt --help)", sub);
}
