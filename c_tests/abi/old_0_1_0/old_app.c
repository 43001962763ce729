/*
 * A program built against the 0.1.0 header of commit ff447d3 (kvtier.h here,
 * a verbatim copy: tier_stats_t 160 bytes, tier_job_result_t 40, no size
 * arguments), linked the way it was then: DT_NEEDED libkvtier.so.0. Against a
 * library of that ABI it stores a block and reads stats with guard bytes
 * after each struct; against today's library (soname libkvtier.so.1) the
 * loader must refuse to start it, before any call could write past those
 * structs (old_binary.cmake checks which happened).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define GUARD 0x5A

struct guarded_stats {
    tier_stats_t stats;
    uint8_t guard[64];
};
struct guarded_results {
    tier_job_result_t r[2];
    uint8_t guard[64];
};

static int intact(const uint8_t *g, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (g[i] != GUARD) {
            return 0;
        }
    }
    return 1;
}

int main(void) {
    static uint8_t primary[4 * 4096] __attribute__((aligned(4096)));
    struct guarded_stats st;
    struct guarded_results res;
    uint8_t key[16] = "old-0.1.0-key";
    int64_t row = 0;
    size_t n = 0;
    tier_t *tier = NULL;

    printf("old_app: built against kvtier %s, running with library %s\n", KVTIER_VERSION_STRING,
           tier_version());
    if (tier_new(NULL, primary, sizeof primary, 4096, &tier) != TIER_OK) {
        return 2;
    }
    memset(&res, GUARD, sizeof res);
    memset(&st, GUARD, sizeof st);
    if (tier_submit_store(tier, 1, key, sizeof key, &row, 1) != TIER_OK || tier_drain(tier) != TIER_OK ||
        tier_poll_finished(tier, res.r, 2, &n) != TIER_OK || tier_stats(tier, &st.stats) != TIER_OK) {
        return 3;
    }
    tier_free(tier);
    if (!intact(res.guard, sizeof res.guard) || !intact((const uint8_t *)&res.r[1], sizeof res.r[1]) ||
        !intact(st.guard, sizeof st.guard)) {
        printf("old_app: guard bytes overwritten\n");
        return 4;
    }
    printf("old_app: guard bytes intact, %zu result, %llu store\n", n,
           (unsigned long long)st.stats.stores_ok);
    return 0;
}
