/*
 * fuzz_flash.c - libFuzzer target for the flash checkpoint reader (src/ckpt/flash.c): a file in
 * shared memory that a killed writer, a damaged page or another program may have left in any
 * state.
 *
 * The input is the file (capacity 1 KiB per slot, layout id 7, so that inputs can be whole
 * files). Opening it must either keep it (a header of this capacity and layout) or reset it;
 * finding a state must return only a slot whose header and payload verify - its payload then
 * lies inside the slot and hashes to what the header says - and never crash or read outside the
 * mapping. A state written afterwards must load back.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

#define CAP 1024u

static char path[256];
static void remove_file(void) { unlink(path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/adt_fuzz_flash_%d", (int)getpid());
        atexit(remove_file);
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    adt_flash *fl;
    if (adt_flash_open(&fl, path, CAP, 7) != ADT_OK) return 0;
    adt_flash_view v;
    for (int64_t want = -1; want < 3; want++)
        if (adt_flash_find(fl, want, &v) == ADT_OK) {
            FUZZ_ASSERT(v.bytes <= CAP && (v.slot == 0 || v.slot == 1) && v.seq > 0);
            FUZZ_ASSERT(want < 0 || v.step == want);
            volatile uint8_t sink = 0;
            for (uint64_t i = 0; i < v.bytes; i++) sink ^= ((const uint8_t *)v.data)[i];
            (void)sink;
        }
    /* whatever it held, a new state goes in and is the newest */
    int slot;
    uint8_t *p = adt_flash_begin(fl, &slot);
    memset(p, 0x5a, 100);
    FUZZ_ASSERT(adt_flash_end(fl, slot, 1, 1000, 100) == ADT_OK);
    FUZZ_ASSERT(adt_flash_find(fl, -1, &v) == ADT_OK && v.step == 1000 && v.bytes == 100);
    adt_flash_close(fl);
    return 0;
}
