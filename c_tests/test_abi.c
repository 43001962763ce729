/*
 * The size protocol of every struct the library writes (tier_stats_t,
 * tier_job_result_t, tier_event_t, tier_abi_info_t): a size below the first
 * ABI's is TIER_ERR_INVALID_ARG with nothing written; the exact size gets
 * every field; a larger size (a program built against a newer header) gets
 * the library's bytes at the caller's stride and nothing past them. And a
 * failed job's result says why (reason).
 */
#include "test_util.h"

#define ROWS 8
#define BLOCK 4096
#define KEY_LEN 16
#define EXTRA 24 /* what a newer header's struct might have appended */
#define GUARD 0xA5

static int all_guard(const uint8_t *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (p[i] != GUARD) {
            return 0;
        }
    }
    return 1;
}

static tier_t *small_tier(uint8_t *primary, const char *capacity, const char *events) {
    tier_t *tier = NULL;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", capacity));
    CHECK_OK(tier_config_set(cfg, "io_threads", "1"));
    CHECK_OK(tier_config_set(cfg, "events", events));
    CHECK_OK(tier_new(cfg, primary, (size_t)ROWS * BLOCK, BLOCK, &tier));
    tier_config_free(cfg);
    return tier;
}

static void submit_store(tier_t *tier, uint64_t job, uint64_t id, int64_t row) {
    uint8_t key[KEY_LEN];
    tu_key(key, KEY_LEN, id);
    CHECK_OK(tier_submit_store(tier, job, key, KEY_LEN, &row, 1));
}

static void test_abi_info_describes_this_header(void) {
    tier_abi_info_t info;
    memset(&info, 0, sizeof info);
    CHECK_OK(tier_abi_info(&info, sizeof info));
    CHECK(info.abi_version == TIER_ABI_VERSION);
    CHECK(info.abi_info_size == sizeof(tier_abi_info_t));
    CHECK(info.stats_size == sizeof(tier_stats_t));
    CHECK(info.job_result_size == sizeof(tier_job_result_t));
    CHECK(info.event_size == sizeof(tier_event_t));
    CHECK(sizeof(tier_stats_t) >= TIER_STATS_SIZE_V1);
    CHECK(sizeof(tier_job_result_t) >= TIER_JOB_RESULT_SIZE_V1);
    CHECK(sizeof(tier_event_t) >= TIER_EVENT_SIZE_V1);
    CHECK(sizeof(tier_abi_info_t) >= TIER_ABI_INFO_SIZE_V1);
}

static void test_abi_info_sizes_too_small_or_larger(void) {
    uint8_t buf[sizeof(tier_abi_info_t) + EXTRA];
    tier_abi_info_t info;
    memset(buf, GUARD, sizeof buf);
    CHECK_ERROR(tier_abi_info((tier_abi_info_t *)(void *)buf, TIER_ABI_INFO_SIZE_V1 - 1),
                TIER_ERR_INVALID_ARG, "tier_abi_info", "size");
    CHECK(all_guard(buf, sizeof buf));
    /* A size no object can have (above PTRDIFF_MAX) is refused too. */
    CHECK_ERROR(tier_abi_info((tier_abi_info_t *)(void *)buf, (size_t)PTRDIFF_MAX + 1),
                TIER_ERR_INVALID_ARG, "tier_abi_info", "address space");
    CHECK(all_guard(buf, sizeof buf));
    CHECK_ERROR(tier_abi_info(NULL, sizeof info), TIER_ERR_NULL_ARG, "tier_abi_info", "out");
    CHECK_OK(tier_abi_info((tier_abi_info_t *)(void *)buf, sizeof buf));
    memcpy(&info, buf, sizeof info);
    CHECK(info.abi_version == TIER_ABI_VERSION);
    CHECK(all_guard(buf + sizeof info, EXTRA));
}

static void test_stats_sizes_too_small_exact_and_larger(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = small_tier(primary, "64KiB", "false");
    uint8_t buf[sizeof(tier_stats_t) + EXTRA];
    tier_stats_t exact, larger;
    uint64_t id = 1;
    int64_t row = 0;

    tu_store(tier, 1, KEY_LEN, &id, &row, 1);
    memset(buf, GUARD, sizeof buf);
    CHECK_ERROR(tier_stats(tier, (tier_stats_t *)(void *)buf, TIER_STATS_SIZE_V1 - 8),
                TIER_ERR_INVALID_ARG, "tier_stats", "size");
    CHECK_ERROR(tier_stats(tier, (tier_stats_t *)(void *)buf, 0), TIER_ERR_INVALID_ARG, "tier_stats",
                "size");
    CHECK_ERROR(tier_stats(tier, (tier_stats_t *)(void *)buf, SIZE_MAX), TIER_ERR_INVALID_ARG,
                "tier_stats", "address space");
    CHECK(all_guard(buf, sizeof buf));

    memset(&exact, 0, sizeof exact);
    CHECK_OK(tier_stats(tier, &exact, sizeof exact));
    CHECK(exact.stores_ok == 1 && exact.num_blocks == 1 && exact.block_bytes == BLOCK);

    CHECK_OK(tier_stats(tier, (tier_stats_t *)(void *)buf, sizeof buf));
    memcpy(&larger, buf, sizeof larger);
    CHECK(memcmp(&larger, &exact, sizeof exact) == 0);
    CHECK(all_guard(buf + sizeof(tier_stats_t), EXTRA));
    tier_free(tier);
    free(primary);
}

static void test_results_sizes_too_small_exact_and_larger(void) {
    enum { N = 3 };
    const size_t stride = sizeof(tier_job_result_t) + EXTRA;
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = small_tier(primary, "64KiB", "false");
    uint8_t buf[N * (sizeof(tier_job_result_t) + EXTRA)];
    tier_job_result_t r;
    size_t got = 99, i;
    int seen = 0;

    for (i = 0; i < N; i++) {
        submit_store(tier, 10 + i, 100 + i, (int64_t)i);
    }
    CHECK_OK(tier_drain(tier));
    memset(buf, GUARD, sizeof buf);
    CHECK_ERROR(tier_poll_finished(tier, (tier_job_result_t *)(void *)buf, TIER_JOB_RESULT_SIZE_V1 - 8,
                                   N, &got),
                TIER_ERR_INVALID_ARG, "tier_poll_finished", "size");
    CHECK(got == 99 && all_guard(buf, sizeof buf));

    /* A newer header's stride: each result at i * stride, its tail untouched. */
    CHECK_OK(tier_poll_finished(tier, (tier_job_result_t *)(void *)buf, stride, N, &got));
    CHECK(got == N);
    for (i = 0; i < N; i++) {
        memcpy(&r, buf + i * stride, sizeof r);
        CHECK(r.job_id >= 10 && r.job_id < 10 + N);
        seen |= 1 << (r.job_id - 10);
        CHECK(r.status == TIER_OK && r.reason == TIER_FAIL_NONE && r.kind == TIER_JOB_STORE);
        CHECK(r.num_blocks == 1 && r.num_done == 1 && r.bytes == BLOCK && r.reserved == 0);
        CHECK(all_guard(buf + i * stride + sizeof r, EXTRA));
    }
    CHECK(seen == 7);

    /* The exact size, as every program built with this header passes. */
    submit_store(tier, 20, 200, 4);
    CHECK_OK(tier_drain(tier));
    memset(&r, 0, sizeof r);
    CHECK_OK(tier_poll_finished(tier, &r, sizeof r, 1, &got));
    CHECK(got == 1 && r.job_id == 20 && r.status == TIER_OK);
    tier_free(tier);
    free(primary);
}

static void test_events_sizes_too_small_exact_and_larger(void) {
    enum { N = 2 };
    const size_t stride = sizeof(tier_event_t) + EXTRA;
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = small_tier(primary, "64KiB", "true");
    uint8_t buf[N * (sizeof(tier_event_t) + EXTRA)];
    tier_event_t ev;
    size_t got = 99, i;

    submit_store(tier, 1, 1, 0);
    submit_store(tier, 2, 2, 1);
    CHECK_OK(tier_drain(tier));
    memset(buf, GUARD, sizeof buf);
    CHECK_ERROR(tier_poll_events(tier, (tier_event_t *)(void *)buf, TIER_EVENT_SIZE_V1 - 1, N, &got),
                TIER_ERR_INVALID_ARG, "tier_poll_events", "size");
    CHECK(got == 99 && all_guard(buf, sizeof buf));
    CHECK_OK(tier_poll_events(tier, (tier_event_t *)(void *)buf, stride, 1, &got));
    CHECK(got == 1);
    memcpy(&ev, buf, sizeof ev);
    CHECK(ev.kind == TIER_EVENT_STORED && ev.key_len == KEY_LEN && ev.seq == 0);
    CHECK(all_guard(buf + sizeof ev, sizeof buf - sizeof ev));

    memset(&ev, 0, sizeof ev);
    CHECK_OK(tier_poll_events(tier, &ev, sizeof ev, 1, &got));
    CHECK(got == 1 && ev.kind == TIER_EVENT_STORED && ev.seq == 1 && ev.reserved == 0);
    for (i = ev.key_len; i < TIER_MAX_KEY_LEN; i++) {
        CHECK(ev.key[i] == 0);
    }
    tier_free(tier);
    free(primary);
}

static void test_failed_results_say_why(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    /* Room for two blocks: a store of three cannot fit. */
    tier_t *tier = small_tier(primary, "8KiB", "false");
    uint8_t keys[3 * KEY_LEN];
    uint64_t ids[3] = {1, 2, 3};
    int64_t rows[3] = {0, 1, 2};
    tier_job_result_t r;

    tu_keys(keys, KEY_LEN, ids, 3);
    CHECK_OK(tier_submit_store(tier, 1, keys, KEY_LEN, rows, 3));
    r = tu_finish(tier, 1);
    CHECK(r.status == TIER_ERR_NO_SPACE && r.reason == TIER_FAIL_NO_SPACE);

    r = tu_load(tier, 2, KEY_LEN, ids, rows, 1);
    CHECK(r.status == TIER_ERR_NOT_FOUND && r.reason == TIER_FAIL_NOT_FOUND && r.num_done == 0);

    tu_store(tier, 3, KEY_LEN, ids, rows, 1);
    r = tu_load(tier, 4, KEY_LEN, ids, rows + 1, 1);
    CHECK(r.status == TIER_OK && r.reason == TIER_FAIL_NONE);
    tier_free(tier);
    free(primary);
}

int main(int argc, char **argv) {
    static const struct tu_subtest subtests[] = {
        TU_SUBTEST(abi_info_describes_this_header),
        TU_SUBTEST(abi_info_sizes_too_small_or_larger),
        TU_SUBTEST(stats_sizes_too_small_exact_and_larger),
        TU_SUBTEST(results_sizes_too_small_exact_and_larger),
        TU_SUBTEST(events_sizes_too_small_exact_and_larger),
        TU_SUBTEST(failed_results_say_why),
    };
    return tu_run_subtests("test_abi", argc, argv, subtests, TU_COUNT(subtests));
}
