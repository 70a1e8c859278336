/*
 * rng.c - counter-based random numbers and crc32c.
 *
 * A draw is mix(key ^ mix(counter)): stateless, so element g of any tensor can be drawn by any
 * rank that owns it. splitmix64's finaliser passes BigCrush as a counter-mode generator.
 */
#include "adtrain/base.h"

#include <math.h>
#include <pthread.h>

uint64_t adt_rng_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint32_t adt_rng_u32(uint64_t key, uint64_t counter) {
    return (uint32_t)(adt_rng_mix64(key ^ adt_rng_mix64(counter)) >> 32);
}

float adt_rng_uniform(uint64_t key, uint64_t counter) {
    return (float)(adt_rng_u32(key, counter) >> 8) * (1.0f / 16777216.0f);
}

float adt_rng_normal(uint64_t key, uint64_t counter) {
    /* Box-Muller on two independent draws of the same counter (distinct sub-keys). */
    uint64_t r1 = adt_rng_mix64(key ^ adt_rng_mix64(2 * counter));
    uint64_t r2 = adt_rng_mix64(key ^ adt_rng_mix64(2 * counter + 1));
    double u1 = ((double)(r1 >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0, 1] */
    double u2 = (double)(r2 >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t adt_rng_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then mixed with the seed */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return adt_rng_mix64(h ^ adt_rng_mix64(seed));
}

/* Slicing-by-8 tables (t[0] is the classic byte table), built once: several ranks of one process
 * may checksum their checkpoint files at the same time. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

uint32_t adt_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) { /* eight bytes per round, little-endian word order */
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][lo >> 8 & 0xff] ^ crc_table[5][lo >> 16 & 0xff] ^
              crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
              crc_table[0][p[7]];
    }
    for (; n; n--, p++) crc = crc_table[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
    return ~crc;
}
