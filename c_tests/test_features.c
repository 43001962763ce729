/*
 * tier_features (KVTIER_1.1) through the C API: the bits of memory, a
 * persistent arena, plain, shared and sealed disk tiers, each EXTENTS bit
 * matching what an extent store then does; NULL arguments refused with a
 * clear status. And tier_stats_t.probes_in_flight: a shared tier's probe
 * counts while queued or running and returns to 0 once its answer is in,
 * while lookups_pending (cumulative) keeps counting.
 */
#include "test_util.h"
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_LEN 32
#define BLOCK 8192
#define ROWS 4

#define ALL_BITS \
    (TIER_FEATURE_EXTENTS | TIER_FEATURE_SHARED | TIER_FEATURE_SEALED | TIER_FEATURE_PERSISTENT)

static const char SEAL_KEY[] = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_tree(const char *dir) { CHECK(nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0); }

/* A tier over primary configured by `pairs` (key, value, ..., NULL). */
static tier_t *new_tier(uint8_t *primary, const char *const *pairs) {
    tier_t *tier = NULL;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", "64KiB"));
    CHECK_OK(tier_config_set(cfg, "io_threads", "1"));
    for (; pairs[0] != NULL; pairs += 2) {
        CHECK_OK(tier_config_set(cfg, pairs[0], pairs[1]));
    }
    CHECK_OK(tier_new(cfg, primary, ROWS * BLOCK, BLOCK, &tier));
    tier_config_free(cfg);
    return tier;
}

/* The tier's features; its EXTENTS bit must be what an extent store finds. */
static uint64_t features_of(const char *const *pairs) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = new_tier(primary, pairs);
    uint64_t features = ~(uint64_t)0;
    uint8_t key[KEY_LEN];
    const uint64_t offset = 3, length = 100;
    tier_status_t st;

    CHECK_OK(tier_features(tier, &features));
    CHECK((features & ~(uint64_t)ALL_BITS) == 0);
    tu_key(key, KEY_LEN, 1);
    tu_fill(primary, BLOCK, 1);
    st = tier_submit_store_extents(tier, 1, key, KEY_LEN, &offset, &length, 1, NULL, 0);
    if (features & TIER_FEATURE_EXTENTS) {
        tier_job_result_t r;
        CHECK_OK(st);
        r = tu_finish(tier, 1);
        CHECK_STATUS(r.status, TIER_OK);
    } else {
        CHECK_STATUS(st, TIER_ERR_INVALID_ARG);
    }
    tier_free(tier);
    free(primary);
    return features;
}

static void test_each_backend_says_what_it_can_do(void) {
    char disk[] = "/tmp/kvtier_features_XXXXXX";
    char shm[] = "/dev/shm/kvtier_features_XXXXXX";
    char arena[sizeof shm + 16];
    char dirs[4][sizeof disk + 16];
    int i;

    CHECK(mkdtemp(disk) != NULL);
    CHECK(mkdtemp(shm) != NULL);
    snprintf(arena, sizeof arena, "%s/arena", shm);
    for (i = 0; i < 4; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/%d", disk, i);
    }
    {
        const char *memory[] = {NULL};
        const char *persist[] = {"persist_path", arena, "namespace", "n", NULL};
        const char *plain[] = {"backend", "disk", "path", dirs[0], NULL};
        const char *shared[] = {"backend", "disk", "path", dirs[1], "shared", "true", "namespace", "n",
                                NULL};
        const char *sealed[] = {"backend", "disk", "path", dirs[2], "seal_key", SEAL_KEY, NULL};
        const char *shared_sealed[] = {"backend",  "disk", "path",     dirs[3], "shared", "true",
                                       "namespace", "n",   "seal_key", SEAL_KEY, NULL};
        CHECK(features_of(memory) == TIER_FEATURE_EXTENTS);
        CHECK(features_of(persist) == (TIER_FEATURE_EXTENTS | TIER_FEATURE_PERSISTENT));
        CHECK(features_of(plain) == (TIER_FEATURE_EXTENTS | TIER_FEATURE_PERSISTENT));
        CHECK(features_of(shared) ==
              (TIER_FEATURE_EXTENTS | TIER_FEATURE_SHARED | TIER_FEATURE_PERSISTENT));
        CHECK(features_of(sealed) == (TIER_FEATURE_SEALED | TIER_FEATURE_PERSISTENT));
        CHECK(features_of(shared_sealed) ==
              (TIER_FEATURE_SHARED | TIER_FEATURE_SEALED | TIER_FEATURE_PERSISTENT));
    }
    remove_tree(disk);
    remove_tree(shm);
}

static void test_null_arguments_are_refused(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    const char *memory[] = {NULL};
    tier_t *tier = new_tier(primary, memory);
    uint64_t features = 0xFEEDu;

    CHECK_ERROR(tier_features(NULL, &features), TIER_ERR_NULL_ARG, "tier_features", "tier");
    CHECK(features == 0xFEEDu);
    CHECK_ERROR(tier_features(tier, NULL), TIER_ERR_NULL_ARG, "tier_features", "out_features");
    CHECK_OK(tier_features(tier, &features));
    CHECK(features == TIER_FEATURE_EXTENTS);
    tier_free(tier);
    free(primary);
}

static void test_probes_in_flight_returns_to_zero(void) {
    char dir[] = "/tmp/kvtier_probes_XXXXXX";
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    const uint64_t deadline = tu_now_ns() + (uint64_t)(10e9 * tu_time_scale());
    tier_stats_t s;
    tier_t *tier;

    CHECK(mkdtemp(dir) != NULL);
    {
        /* A "not in storage" answer is remembered for a minute: the key
         * stays a MISS for the rest of the test. */
        const char *shared[] = {"backend", "disk",         "path",  dir, "shared", "true",
                                "namespace", "n", "probe_ttl_ms", "60000", NULL};
        tier = new_tier(primary, shared);
    }
    s = tu_stats(tier);
    CHECK(s.probes_in_flight == 0);
    CHECK(tu_state(tier, KEY_LEN, 7) == TIER_PENDING);
    while ((s = tu_stats(tier)).probes_in_flight != 0) {
        CHECK(tu_now_ns() < deadline);
        tu_sleep_ms(1);
    }
    CHECK(s.lookups_pending == 1);
    CHECK(tu_state(tier, KEY_LEN, 7) == TIER_MISS);
    s = tu_stats(tier);
    CHECK(s.probes_in_flight == 0 && s.lookups_pending == 1 && s.misses == 1);
    tier_free(tier);
    free(primary);
    remove_tree(dir);
}

int main(int argc, char **argv) {
    static const struct tu_subtest subtests[] = {
        TU_SUBTEST(each_backend_says_what_it_can_do),
        TU_SUBTEST(null_arguments_are_refused),
        TU_SUBTEST(probes_in_flight_returns_to_zero),
    };
    return tu_run_subtests("test_features", argc, argv, subtests, TU_COUNT(subtests));
}
