/*
 * Every function of the C API and every documented error path: the status
 * code, a message that names the function and the argument, outputs left
 * untouched on failure, no result for a rejected submit, and stored data that
 * survives all of it byte for byte.
 */
#include "test_util.h"

#include <limits.h>
#include <pthread.h>

#define KEY_LEN 36
#define BLOCK 4096
#define ROWS 16
/* The blocks stored first and checked last: bad calls must not disturb them. */
#define KEPT 4

static const size_t kBlock = BLOCK;

/* ---- version, status names ---------------------------------------------- */

static void test_version_matches_header(void) {
    char expected[64];
    const char *v = tier_version();
    CHECK(v != NULL);
    CHECK(strcmp(v, KVTIER_VERSION_STRING) == 0);
    CHECK(v == tier_version());
    snprintf(expected, sizeof expected, "%d.%d.%d", KVTIER_VERSION_MAJOR, KVTIER_VERSION_MINOR,
             KVTIER_VERSION_PATCH);
    CHECK(strcmp(expected, KVTIER_VERSION_STRING) == 0);
    CHECK(TIER_MAX_KEY_LEN == 128);
}

struct status_name {
    tier_status_t code;
    const char *name;
};

static void test_status_codes_and_names_are_abi(void) {
    static const struct status_name known[] = {
        {TIER_OK, "TIER_OK"},
        {TIER_TIMEOUT, "TIER_TIMEOUT"},
        {TIER_ERR_NULL_ARG, "TIER_ERR_NULL_ARG"},
        {TIER_ERR_INVALID_ARG, "TIER_ERR_INVALID_ARG"},
        {TIER_ERR_OUT_OF_RANGE, "TIER_ERR_OUT_OF_RANGE"},
        {TIER_ERR_DUPLICATE_JOB, "TIER_ERR_DUPLICATE_JOB"},
        {TIER_ERR_NO_SPACE, "TIER_ERR_NO_SPACE"},
        {TIER_ERR_NOT_FOUND, "TIER_ERR_NOT_FOUND"},
        {TIER_ERR_IO, "TIER_ERR_IO"},
        {TIER_ERR_CORRUPT, "TIER_ERR_CORRUPT"},
        {TIER_ERR_CONFIG, "TIER_ERR_CONFIG"},
        {TIER_ERR_SHUTDOWN, "TIER_ERR_SHUTDOWN"},
        {TIER_ERR_PANIC, "TIER_ERR_PANIC"},
        {TIER_ERR_ALLOC, "TIER_ERR_ALLOC"},
    };
    static const tier_status_t unknown[] = {2, 3, -13, -100, 100, INT32_MIN, INT32_MAX};
    size_t i;
    /* The numbers are part of the ABI. */
    CHECK(TIER_OK == 0 && TIER_TIMEOUT == 1 && TIER_ERR_NULL_ARG == -1 &&
          TIER_ERR_INVALID_ARG == -2 && TIER_ERR_OUT_OF_RANGE == -3 &&
          TIER_ERR_DUPLICATE_JOB == -4 && TIER_ERR_NO_SPACE == -5 && TIER_ERR_NOT_FOUND == -6 &&
          TIER_ERR_IO == -7 && TIER_ERR_CORRUPT == -8 && TIER_ERR_CONFIG == -9 &&
          TIER_ERR_SHUTDOWN == -10 && TIER_ERR_PANIC == -11 && TIER_ERR_ALLOC == -12);
    for (i = 0; i < sizeof known / sizeof known[0]; i++) {
        const char *s = tier_status_str(known[i].code);
        CHECK(s != NULL);
        if (strcmp(s, known[i].name) != 0) {
            fprintf(stderr, "tier_status_str(%d) = \"%s\", expected \"%s\"\n", (int)known[i].code,
                    s, known[i].name);
        }
        CHECK(strcmp(s, known[i].name) == 0);
    }
    for (i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *s = tier_status_str(unknown[i]);
        CHECK(s != NULL);
        CHECK(strcmp(s, "TIER_UNKNOWN_STATUS") == 0);
    }
}

/* ---- tier_last_error ---------------------------------------------------- */

struct thread_errors {
    size_t first_len;   /* tier_last_error on a thread where nothing failed */
    char first_buf[8];  /* what it wrote to a buffer */
    char message[256];  /* the message after this thread's own failure */
};

static void *other_thread(void *arg) {
    struct thread_errors *e = (struct thread_errors *)arg;
    memset(e->first_buf, 'X', sizeof e->first_buf);
    e->first_len = tier_last_error(e->first_buf, sizeof e->first_buf);
    CHECK_STATUS(tier_drain(NULL), TIER_ERR_NULL_ARG);
    tier_last_error(e->message, sizeof e->message);
    return NULL;
}

static void test_last_error_is_per_thread_and_truncates(void) {
    char full[256];
    char buf[16];
    size_t len;
    pthread_t thread;
    struct thread_errors other;

    CHECK_ERROR(tier_config_set(NULL, "backend", "memory"), TIER_ERR_NULL_ARG, "tier_config_set",
                "cfg");
    len = tier_last_error(NULL, 0);
    CHECK(len > 0);
    CHECK(tier_last_error(NULL, 100) == len);
    CHECK(tier_last_error(full, sizeof full) == len);
    CHECK(strlen(full) == len);
    CHECK(strncmp(full, "tier_config_set: ", 17) == 0);

    /* cap 0: the length only, nothing written. */
    memset(buf, 'X', sizeof buf);
    CHECK(tier_last_error(buf, 0) == len);
    CHECK(tu_all_bytes((const uint8_t *)buf, sizeof buf, 'X'));

    /* Truncation: cap - 1 bytes and a NUL, the full length returned. */
    memset(buf, 'X', sizeof buf);
    CHECK(len > 6);
    CHECK(tier_last_error(buf, 6) == len);
    CHECK(memcmp(buf, full, 5) == 0);
    CHECK(buf[5] == '\0');
    CHECK(tu_all_bytes((const uint8_t *)buf + 6, sizeof buf - 6, 'X'));
    memset(buf, 'X', sizeof buf);
    CHECK(tier_last_error(buf, 1) == len);
    CHECK(buf[0] == '\0' && buf[1] == 'X');

    /* A successful call does not clear it. */
    {
        tier_config_t *cfg = tier_config_new();
        char again[256];
        CHECK(cfg != NULL);
        CHECK_OK(tier_config_set(cfg, "backend", "memory"));
        tier_config_free(cfg);
        CHECK(tier_last_error(again, sizeof again) == len);
        CHECK(strcmp(again, full) == 0);
    }

    /* Per thread: a fresh thread has none, and its failure does not leak here. */
    CHECK(pthread_create(&thread, NULL, other_thread, &other) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(other.first_len == 0);
    CHECK(other.first_buf[0] == '\0' && other.first_buf[1] == 'X');
    CHECK(strncmp(other.message, "tier_drain: ", 12) == 0);
    {
        char again[256];
        CHECK(tier_last_error(again, sizeof again) == len);
        CHECK(strcmp(again, full) == 0);
    }
}

/* ---- configuration ------------------------------------------------------ */

struct setting {
    const char *key;
    const char *value;
};

static void test_config_accepts_and_rejects_values(void) {
    static const struct setting good[] = {
        {"backend", "memory"},      {"capacity_bytes", "4096"}, {"capacity_bytes", "64KiB"},
        {"capacity_bytes", "1 MiB"}, {"capacity_bytes", "2GiB"}, {"capacity_bytes", "1TiB"},
        {"io_threads", "1"},        {"io_threads", "256"},      {"idle_spin_us", "0"},
        {"idle_spin_us", "1000000"}, {"prefault", "off"},      {"prefault", "Background"},
        {"prefault", "FULL"},
    };
    static const struct setting bad[] = {
        {"backend", "tape"},           {"backend", ""},
        {"capacity_bytes", "12KB"},    {"capacity_bytes", "abc"},
        {"capacity_bytes", ""},        {"capacity_bytes", "-1"},
        {"capacity_bytes", "1e9"},     {"capacity_bytes", "99999999999TiB"},
        {"capacity_bytes", "1 2"},     {"io_threads", "0"},
        {"io_threads", "257"},         {"io_threads", "x"},
        {"io_threads", "-1"},          {"io_threads", ""},
        {"idle_spin_us", "1000001"},   {"idle_spin_us", "-5"},
        {"idle_spin_us", "1.5"},       {"prefault", "on"},
        {"prefault", ""},
    };
    size_t i;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);

    for (i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (tier_config_set(cfg, good[i].key, good[i].value) != TIER_OK) {
            fprintf(stderr, "rejected %s = \"%s\"\n", good[i].key, good[i].value);
        }
        CHECK_OK(tier_config_set(cfg, good[i].key, good[i].value));
    }
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tier_status_t s = tier_config_set(cfg, bad[i].key, bad[i].value);
        if (s != TIER_ERR_CONFIG) {
            fprintf(stderr, "%s = \"%s\" gave %s\n", bad[i].key, bad[i].value, tier_status_str(s));
        }
        CHECK_ERROR(tier_config_set(cfg, bad[i].key, bad[i].value), TIER_ERR_CONFIG,
                    "tier_config_set", bad[i].key);
    }
    CHECK_ERROR(tier_config_set(cfg, "capacity", "1GiB"), TIER_ERR_CONFIG, "tier_config_set",
                "capacity");
    CHECK_ERROR(tier_config_set(cfg, "", "1"), TIER_ERR_CONFIG, "tier_config_set", "unknown");
    CHECK_ERROR(tier_config_set(cfg, "backend", "\xff\xfe"), TIER_ERR_CONFIG, "tier_config_set",
                "UTF-8");
    CHECK_ERROR(tier_config_set(cfg, "io_\xc3", "2"), TIER_ERR_CONFIG, "tier_config_set",
                "UTF-8");

    CHECK_ERROR(tier_config_set(NULL, "backend", "memory"), TIER_ERR_NULL_ARG, "tier_config_set",
                "cfg");
    CHECK_ERROR(tier_config_set(cfg, NULL, "memory"), TIER_ERR_NULL_ARG, "tier_config_set",
                "key");
    CHECK_ERROR(tier_config_set(cfg, "backend", NULL), TIER_ERR_NULL_ARG, "tier_config_set",
                "value");

    tier_config_free(cfg);
    tier_config_free(NULL);
}

/* A rejected value leaves the configuration as it was. */
static void rejected_config_value_changes_nothing(uint8_t *primary) {
    tier_t *tier = NULL;
    tier_stats_t st;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", "8KiB"));
    CHECK_OK(tier_config_set(cfg, "io_threads", "3"));
    CHECK_STATUS(tier_config_set(cfg, "capacity_bytes", "12KB"), TIER_ERR_CONFIG);
    CHECK_STATUS(tier_config_set(cfg, "capacity_bytes", "0.5"), TIER_ERR_CONFIG);
    CHECK_STATUS(tier_config_set(cfg, "io_threads", "0"), TIER_ERR_CONFIG);
    CHECK_STATUS(tier_config_set(cfg, "backend", "disk?"), TIER_ERR_CONFIG);
    CHECK_OK(tier_new(cfg, primary, ROWS * kBlock, kBlock, &tier));
    /* tier_new does not take the configuration: it can be freed before the tier... */
    tier_config_free(cfg);
    st = tu_stats(tier);
    CHECK(st.capacity_bytes == 8192);
    CHECK(st.capacity_blocks == 2);
    CHECK(st.io_threads == 3);
    tier_free(tier);
}

/* ---- tier_new, tier_free ------------------------------------------------ */

static void tier_new_checks_arguments_and_capacity(uint8_t *primary) {
    tier_t *const sentinel = (tier_t *)(uintptr_t)0x5e5e5e50u;
    tier_t *tier = sentinel;
    tier_t *second = NULL;
    tier_stats_t st;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", "64KiB"));

    CHECK_ERROR(tier_new(cfg, NULL, ROWS * kBlock, kBlock, &tier), TIER_ERR_NULL_ARG, "tier_new",
                "primary");
    CHECK(tier == sentinel);
    CHECK_ERROR(tier_new(cfg, primary, ROWS * kBlock, kBlock, NULL), TIER_ERR_NULL_ARG,
                "tier_new", "out");
    CHECK_ERROR(tier_new(cfg, primary, ROWS * kBlock, 0, &tier), TIER_ERR_INVALID_ARG, "tier_new",
                "block_bytes");
    CHECK(tier == sentinel);
    CHECK_ERROR(tier_new(cfg, primary, ROWS * kBlock, ROWS * kBlock + 1, &tier),
                TIER_ERR_INVALID_ARG, "tier_new", "block_bytes");
    CHECK(tier == sentinel);
    CHECK_ERROR(tier_new(cfg, primary, 3 * kBlock, 2 * kBlock, &tier), TIER_ERR_INVALID_ARG,
                "tier_new", "primary_len");
    CHECK(tier == sentinel);
    CHECK_ERROR(tier_new(cfg, primary, ROWS * kBlock - 1, kBlock, &tier), TIER_ERR_INVALID_ARG,
                "tier_new", "primary_len");
    CHECK(tier == sentinel);
    CHECK_ERROR(tier_new(cfg, primary, 0, kBlock, &tier), TIER_ERR_INVALID_ARG, "tier_new", "");
    CHECK(tier == sentinel);
    /* Larger than any address space. */
    CHECK_ERROR(tier_new(cfg, primary, SIZE_MAX / kBlock * kBlock, kBlock, &tier),
                TIER_ERR_INVALID_ARG, "tier_new", "primary_len");
    CHECK(tier == sentinel);

    /* Capacity below one block. */
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", "4095"));
    CHECK_ERROR(tier_new(cfg, primary, ROWS * kBlock, kBlock, &tier), TIER_ERR_CONFIG, "tier_new",
                "capacity_bytes");
    CHECK(tier == sentinel);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", "0"));
    CHECK_ERROR(tier_new(cfg, primary, ROWS * kBlock, kBlock, &tier), TIER_ERR_CONFIG, "tier_new",
                "capacity_bytes");
    CHECK(tier == sentinel);

    /* Exactly one block is enough; capacity is rounded down to whole blocks. */
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", "12287"));
    CHECK_OK(tier_new(cfg, primary, ROWS * kBlock, kBlock, &tier));
    CHECK(tier != sentinel && tier != NULL);
    /* ...and reused for another tier. */
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", "4096"));
    CHECK_OK(tier_new(cfg, primary, ROWS * kBlock, kBlock, &second));
    CHECK(second != NULL && second != tier);
    st = tu_stats(tier);
    CHECK(st.capacity_blocks == 2 && st.capacity_bytes == 8192);
    st = tu_stats(second);
    CHECK(st.capacity_blocks == 1 && st.capacity_bytes == 4096);
    tier_free(second);
    tier_free(tier);

    /* NULL configuration: the defaults (memory backend, 1 GiB). A single row is fine. */
    tier = NULL;
    CHECK_OK(tier_new(NULL, primary, kBlock, kBlock, &tier));
    st = tu_stats(tier);
    CHECK(st.capacity_bytes == (uint64_t)1 << 30);
    CHECK(st.block_bytes == kBlock);
    CHECK(st.io_threads >= 1);
    tier_free(tier);

    tier_config_free(cfg);
    tier_free(NULL);
}

/* ---- NULL pointers, (NULL, 0) ------------------------------------------- */

static void expect_no_results(tier_t *tier) {
    tier_job_result_t r[4];
    CHECK(tu_drain_poll(tier, r, 4) == 0);
}

static void null_args_rejected_without_effect(tier_t *tier, uint8_t *primary) {
    (void)primary;
    uint8_t keys[2 * KEY_LEN];
    uint8_t states[2] = {0xAB, 0xAB};
    int64_t rows[2] = {8, 9};
    uint64_t ids[2] = {0, 1};
    tier_job_result_t res[2];
    tier_job_result_t untouched;
    size_t n = 777;
    tier_stats_t st;
    tu_keys(keys, KEY_LEN, ids, 2);
    memset(&untouched, 0xCD, sizeof untouched);

    CHECK_ERROR(tier_lookup(NULL, keys, KEY_LEN, 2, states), TIER_ERR_NULL_ARG, "tier_lookup",
                "tier");
    CHECK_ERROR(tier_lookup(tier, NULL, KEY_LEN, 2, states), TIER_ERR_NULL_ARG, "tier_lookup",
                "keys");
    CHECK(states[0] == 0xAB && states[1] == 0xAB);
    CHECK_ERROR(tier_lookup(tier, keys, KEY_LEN, 2, NULL), TIER_ERR_NULL_ARG, "tier_lookup",
                "out_states");
    CHECK_OK(tier_lookup(tier, NULL, KEY_LEN, 0, NULL));
    CHECK_OK(tier_lookup(tier, keys, KEY_LEN, 0, states));
    CHECK(states[0] == 0xAB && states[1] == 0xAB);

    CHECK_ERROR(tier_touch(NULL, keys, KEY_LEN, 2), TIER_ERR_NULL_ARG, "tier_touch", "tier");
    CHECK_ERROR(tier_touch(tier, NULL, KEY_LEN, 2), TIER_ERR_NULL_ARG, "tier_touch", "keys");
    CHECK_OK(tier_touch(tier, NULL, KEY_LEN, 0));

    CHECK_ERROR(tier_submit_store(NULL, 10, keys, KEY_LEN, rows, 2), TIER_ERR_NULL_ARG,
                "tier_submit_store", "tier");
    CHECK_ERROR(tier_submit_store(tier, 10, NULL, KEY_LEN, rows, 2), TIER_ERR_NULL_ARG,
                "tier_submit_store", "keys");
    CHECK_ERROR(tier_submit_store(tier, 10, keys, KEY_LEN, NULL, 2), TIER_ERR_NULL_ARG,
                "tier_submit_store", "block_ids");
    CHECK_ERROR(tier_submit_load(NULL, 10, keys, KEY_LEN, rows, 2), TIER_ERR_NULL_ARG,
                "tier_submit_load", "tier");
    CHECK_ERROR(tier_submit_load(tier, 10, NULL, KEY_LEN, rows, 2), TIER_ERR_NULL_ARG,
                "tier_submit_load", "keys");
    CHECK_ERROR(tier_submit_load(tier, 10, keys, KEY_LEN, NULL, 2), TIER_ERR_NULL_ARG,
                "tier_submit_load", "block_ids");
    expect_no_results(tier);

    /* (NULL, 0): empty jobs, accepted and reported as successes. */
    CHECK_OK(tier_submit_store(tier, 11, NULL, KEY_LEN, NULL, 0));
    CHECK_OK(tier_submit_load(tier, 12, NULL, KEY_LEN, NULL, 0));
    CHECK_OK(tier_drain(tier));
    st = tu_stats(tier);
    CHECK(st.results_queued == 2);

    /* Failed polls consume nothing and write nothing. */
    CHECK_ERROR(tier_poll_finished(NULL, res, sizeof(tier_job_result_t),
                                   2, &n), TIER_ERR_NULL_ARG, "tier_poll_finished",
                "tier");
    CHECK_ERROR(tier_poll_finished(tier, NULL, sizeof(tier_job_result_t),
                                   2, &n), TIER_ERR_NULL_ARG, "tier_poll_finished",
                "out");
    CHECK(n == 777);
    res[0] = untouched;
    CHECK_ERROR(tier_poll_finished(tier, res, sizeof(tier_job_result_t),
                                   2, NULL), TIER_ERR_NULL_ARG, "tier_poll_finished",
                "out_n");
    CHECK(memcmp(&res[0], &untouched, sizeof untouched) == 0);
    CHECK_ERROR(tier_poll_finished(tier, res, sizeof(tier_job_result_t),
                                   0, &n), TIER_ERR_INVALID_ARG, "tier_poll_finished",
                "cap");
    CHECK(n == 777);
    CHECK(memcmp(&res[0], &untouched, sizeof untouched) == 0);
    st = tu_stats(tier);
    CHECK(st.results_queued == 2);

    CHECK_OK(tier_poll_finished(tier, res, sizeof(tier_job_result_t), 2, &n));
    CHECK(n == 2);
    CHECK(res[0].job_id == 11 && res[0].status == TIER_OK && res[0].kind == TIER_JOB_STORE);
    CHECK(res[0].num_blocks == 0 && res[0].num_done == 0 && res[0].bytes == 0);
    CHECK(res[1].job_id == 12 && res[1].status == TIER_OK && res[1].kind == TIER_JOB_LOAD);
    CHECK(res[1].num_blocks == 0 && res[1].num_done == 0 && res[1].bytes == 0);

    CHECK_ERROR(tier_wait(NULL, 0), TIER_ERR_NULL_ARG, "tier_wait", "tier");
    CHECK_ERROR(tier_drain(NULL), TIER_ERR_NULL_ARG, "tier_drain", "tier");
    CHECK_ERROR(tier_clear(NULL), TIER_ERR_NULL_ARG, "tier_clear", "tier");
    memset(&st, 0xCD, sizeof st);
    CHECK_ERROR(tier_stats(NULL, &st,
                           sizeof(tier_stats_t)), TIER_ERR_NULL_ARG, "tier_stats", "tier");
    CHECK(tu_all_bytes((const uint8_t *)&st, sizeof st, 0xCD));
    CHECK_ERROR(tier_stats(tier, NULL,
                           sizeof(tier_stats_t)), TIER_ERR_NULL_ARG, "tier_stats", "out");
    expect_no_results(tier);
}

/* ---- key lengths, block ids --------------------------------------------- */

static void key_len_limits_enforced(tier_t *tier, uint8_t *primary) {
    static const size_t bad_lens[] = {0, TIER_MAX_KEY_LEN + 1, 1000};
    uint8_t keys[2 * 1000];
    uint8_t states[2] = {0xAB, 0xAB};
    int64_t rows[2] = {8, 9};
    size_t i;
    memset(keys, 7, sizeof keys);

    for (i = 0; i < sizeof bad_lens / sizeof bad_lens[0]; i++) {
        size_t len = bad_lens[i];
        CHECK_ERROR(tier_lookup(tier, keys, len, 2, states), TIER_ERR_INVALID_ARG, "tier_lookup",
                    "key_len");
        CHECK(states[0] == 0xAB && states[1] == 0xAB);
        CHECK_ERROR(tier_touch(tier, keys, len, 2), TIER_ERR_INVALID_ARG, "tier_touch",
                    "key_len");
        CHECK_ERROR(tier_submit_store(tier, 20, keys, len, rows, 2), TIER_ERR_INVALID_ARG,
                    "tier_submit_store", "key_len");
        CHECK_ERROR(tier_submit_load(tier, 20, keys, len, rows, 2), TIER_ERR_INVALID_ARG,
                    "tier_submit_load", "key_len");
    }
    CHECK_ERROR(tier_lookup(tier, NULL, 0, 0, NULL), TIER_ERR_INVALID_ARG, "tier_lookup",
                "key_len");

    /* A count no result could report (num_blocks is 32-bit), or whose key bytes
     * overflow size_t: rejected before anything is read. */
    {
        const size_t huge = (size_t)UINT32_MAX + 1;
        CHECK_ERROR(tier_lookup(tier, keys, 1, huge, states), TIER_ERR_INVALID_ARG,
                    "tier_lookup", "n");
        CHECK(states[0] == 0xAB && states[1] == 0xAB);
        CHECK_ERROR(tier_touch(tier, keys, 1, huge), TIER_ERR_INVALID_ARG, "tier_touch", "n");
        CHECK_ERROR(tier_submit_store(tier, 23, keys, 1, rows, huge), TIER_ERR_INVALID_ARG,
                    "tier_submit_store", "n");
        CHECK_ERROR(tier_submit_load(tier, 23, keys, 2, rows, SIZE_MAX), TIER_ERR_INVALID_ARG,
                    "tier_submit_load", "n");
    }
    expect_no_results(tier);

    /* The limits themselves work: 1-byte and 128-byte keys round-trip. */
    {
        static const size_t lens[] = {1, TIER_MAX_KEY_LEN};
        for (i = 0; i < 2; i++) {
            uint64_t id = 900 + i;
            int64_t src = 12;
            int64_t dst = 13;
            tier_job_result_t r;
            tu_fill(primary + (size_t)src * kBlock, kBlock, id);
            tu_store(tier, 21, lens[i], &id, &src, 1);
            CHECK(tu_state(tier, lens[i], id) == TIER_HIT);
            memset(primary + (size_t)dst * kBlock, 0, kBlock);
            r = tu_load(tier, 22, lens[i], &id, &dst, 1);
            CHECK_STATUS(r.status, TIER_OK);
            CHECK(tu_mismatch(primary + (size_t)dst * kBlock, kBlock, id) == -1);
        }
    }
}

static void out_of_range_block_ids_rejected(tier_t *tier, uint8_t *primary) {
    (void)primary;
    static const int64_t bad_ids[] = {-1, ROWS, ROWS + 1, INT64_MAX, INT64_MIN};
    uint8_t keys[2 * KEY_LEN];
    uint64_t ids[2] = {30, 31};
    size_t i;
    tu_keys(keys, KEY_LEN, ids, 2);

    for (i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
        int64_t rows[2];
        rows[0] = 8;
        rows[1] = bad_ids[i];
        CHECK_ERROR(tier_submit_store(tier, 40, keys, KEY_LEN, rows, 2), TIER_ERR_OUT_OF_RANGE,
                    "tier_submit_store", "block_ids");
        CHECK_ERROR(tier_submit_store(tier, 40, keys, KEY_LEN, rows + 1, 1), TIER_ERR_OUT_OF_RANGE,
                    "tier_submit_store", "block_ids");
        CHECK_ERROR(tier_submit_load(tier, 41, keys, KEY_LEN, rows, 2), TIER_ERR_OUT_OF_RANGE,
                    "tier_submit_load", "block_ids");
        CHECK_ERROR(tier_submit_load(tier, 41, keys, KEY_LEN, rows + 1, 1), TIER_ERR_OUT_OF_RANGE,
                    "tier_submit_load", "block_ids");
    }
    /* Rejected as a whole: no result, nothing stored, and the job ids stay free. */
    expect_no_results(tier);
    CHECK(tu_state(tier, KEY_LEN, 30) == TIER_MISS);
    CHECK(tu_state(tier, KEY_LEN, 31) == TIER_MISS);
    {
        int64_t last = ROWS - 1;
        uint64_t id = 30;
        tier_job_result_t r = tu_store(tier, 40, KEY_LEN, &id, &last, 1);
        CHECK(r.bytes == kBlock);
        r = tu_load(tier, 41, KEY_LEN, &id, &last, 1);
        CHECK_STATUS(r.status, TIER_OK);
    }
}

/* ---- job ids ------------------------------------------------------------ */

static void duplicate_job_id_rejected_until_polled(tier_t *tier, uint8_t *primary) {
    (void)primary;
    uint8_t key[KEY_LEN];
    const uint64_t id = 50;
    int64_t row = 14;
    tier_job_result_t r;
    size_t n = 0;
    tu_key(key, KEY_LEN, id);

    CHECK_OK(tier_submit_store(tier, 7, key, KEY_LEN, &row, 1));
    CHECK_OK(tier_drain(tier));
    /* Completed but not polled: still taken. */
    CHECK_ERROR(tier_submit_load(tier, 7, key, KEY_LEN, &row, 1), TIER_ERR_DUPLICATE_JOB,
                "tier_submit_load", "job_id");
    CHECK_ERROR(tier_submit_store(tier, 7, key, KEY_LEN, &row, 1), TIER_ERR_DUPLICATE_JOB,
                "tier_submit_store", "job_id");
    CHECK_ERROR(tier_submit_store(tier, 7, NULL, KEY_LEN, NULL, 0), TIER_ERR_DUPLICATE_JOB,
                "tier_submit_store", "job_id");
    CHECK_OK(tier_poll_finished(tier, &r, sizeof(tier_job_result_t), 1, &n));
    CHECK(n == 1 && r.job_id == 7 && r.status == TIER_OK && r.kind == TIER_JOB_STORE);
    /* The rejected duplicates produced nothing. */
    expect_no_results(tier);

    /* Polled: reusable, for either kind. */
    r = tu_load(tier, 7, KEY_LEN, &id, &row, 1);
    CHECK_STATUS(r.status, TIER_OK);

    /* Job id 0 and UINT64_MAX are ordinary ids. */
    CHECK_OK(tier_submit_store(tier, 0, NULL, KEY_LEN, NULL, 0));
    CHECK_OK(tier_submit_store(tier, UINT64_MAX, NULL, KEY_LEN, NULL, 0));
    CHECK_STATUS(tier_submit_load(tier, UINT64_MAX, NULL, KEY_LEN, NULL, 0),
                 TIER_ERR_DUPLICATE_JOB);
    {
        tier_job_result_t two[2];
        CHECK(tu_drain_poll(tier, two, 2) == 2);
        CHECK(two[0].job_id == 0 && two[1].job_id == UINT64_MAX);
    }
}

/* ---- poll and wait ------------------------------------------------------ */

static void poll_is_oldest_first_and_wait_times_out(tier_t *tier, uint8_t *primary) {
    (void)primary;
    tier_job_result_t res[3];
    tier_job_result_t untouched;
    size_t n = 777;
    uint64_t start, waited_ms;
    uint64_t i;
    memset(&untouched, 0xCD, sizeof untouched);

    /* Nothing ready: success with 0 results, the array left alone. */
    res[0] = untouched;
    CHECK_OK(tier_poll_finished(tier, res, sizeof(tier_job_result_t), 3, &n));
    CHECK(n == 0);
    CHECK(memcmp(&res[0], &untouched, sizeof untouched) == 0);

    /* Nothing in flight: tier_wait times out (a positive status, not an error). */
    CHECK(TIER_TIMEOUT > 0);
    CHECK_STATUS(tier_wait(tier, 0), TIER_TIMEOUT);
    start = tu_now_ns();
    CHECK_STATUS(tier_wait(tier, 60), TIER_TIMEOUT);
    waited_ms = (tu_now_ns() - start) / 1000000u;
    CHECK(waited_ms >= 50);
    CHECK(waited_ms < 60 + 2000 * tu_time_scale());

    /* A result ready: tier_wait returns at once and does not consume it. */
    CHECK_OK(tier_submit_load(tier, 60, NULL, KEY_LEN, NULL, 0));
    start = tu_now_ns();
    CHECK_OK(tier_wait(tier, 10000));
    CHECK_OK(tier_wait(tier, 0));
    CHECK((tu_now_ns() - start) / 1000000u < 5000);
    CHECK_OK(tier_poll_finished(tier, res, sizeof(tier_job_result_t), 3, &n));
    CHECK(n == 1 && res[0].job_id == 60);
    CHECK_STATUS(tier_wait(tier, 0), TIER_TIMEOUT);

    /* cap smaller than what is queued: oldest first, across calls. */
    for (i = 0; i < 5; i++) {
        CHECK_OK(tier_submit_store(tier, 70 + i, NULL, KEY_LEN, NULL, 0));
    }
    CHECK_OK(tier_drain(tier));
    CHECK_OK(tier_poll_finished(tier, res, sizeof(tier_job_result_t), 2, &n));
    CHECK(n == 2 && res[0].job_id == 70 && res[1].job_id == 71);
    CHECK_OK(tier_poll_finished(tier, res, sizeof(tier_job_result_t), 2, &n));
    CHECK(n == 2 && res[0].job_id == 72 && res[1].job_id == 73);
    res[1] = untouched;
    CHECK_OK(tier_poll_finished(tier, res, sizeof(tier_job_result_t), 2, &n));
    CHECK(n == 1 && res[0].job_id == 74);
    CHECK(memcmp(&res[1], &untouched, sizeof untouched) == 0);
    CHECK_OK(tier_poll_finished(tier, res, sizeof(tier_job_result_t), 2, &n));
    CHECK(n == 0);
}

/* ---- stats -------------------------------------------------------------- */

static void stats_count_every_operation(uint8_t *primary) {
    tier_t *tier = tu_new_tier(primary, ROWS * kBlock, kBlock, "64KiB", 2);
    tier_stats_t st = tu_stats(tier);
    uint64_t ids[4] = {100, 101, 102, 103};
    int64_t src[4] = {0, 1, 2, 3};
    int64_t dst[4] = {8, 9, 10, 11};
    uint8_t keys[6 * KEY_LEN];
    uint8_t states[6];
    uint64_t probe[6] = {100, 101, 102, 103, 104, 105};
    tier_job_result_t r;
    size_t i;

    CHECK(st.capacity_bytes == 65536 && st.capacity_blocks == 16 && st.block_bytes == kBlock);
    CHECK(st.io_threads == 2);
    CHECK(st.used_bytes == 0 && st.num_blocks == 0);
    CHECK(st.lookups == 0 && st.hits == 0 && st.misses == 0 && st.lookups_pending == 0);
    CHECK(st.evictions == 0 && st.stores_ok == 0 && st.stores_failed == 0);
    CHECK(st.loads_ok == 0 && st.loads_failed == 0);
    CHECK(st.bytes_stored == 0 && st.bytes_loaded == 0);
    CHECK(st.jobs_in_flight == 0 && st.results_queued == 0);

    for (i = 0; i < 4; i++) {
        tu_fill(primary + (size_t)src[i] * kBlock, kBlock, ids[i]);
    }
    r = tu_store(tier, 1, KEY_LEN, ids, src, 4);
    CHECK(r.bytes == 4 * kBlock);
    st = tu_stats(tier);
    CHECK(st.num_blocks == 4 && st.used_bytes == 4 * kBlock);
    CHECK(st.stores_ok == 1 && st.stores_failed == 0 && st.bytes_stored == 4 * kBlock);
    CHECK(st.metadata_bytes > 0);
    CHECK(st.jobs_in_flight == 0 && st.results_queued == 0);

    tu_keys(keys, KEY_LEN, probe, 6);
    CHECK_OK(tier_lookup(tier, keys, KEY_LEN, 6, states));
    CHECK(states[0] == TIER_HIT && states[1] == TIER_HIT && states[2] == TIER_HIT &&
          states[3] == TIER_HIT && states[4] == TIER_MISS && states[5] == TIER_MISS);
    st = tu_stats(tier);
    CHECK(st.lookups == 6 && st.hits == 4 && st.misses == 2 && st.lookups_pending == 0);

    r = tu_load(tier, 2, KEY_LEN, ids, dst, 2);
    CHECK_STATUS(r.status, TIER_OK);
    CHECK(r.num_done == 2 && r.bytes == 2 * kBlock);
    r = tu_load(tier, 3, KEY_LEN, probe + 4, dst, 1);
    CHECK_STATUS(r.status, TIER_ERR_NOT_FOUND);
    CHECK(r.num_done == 0 && r.bytes == 0);
    st = tu_stats(tier);
    CHECK(st.loads_ok == 1 && st.loads_failed == 1 && st.bytes_loaded == 2 * kBlock);
    /* Loads and lookups change no stored state. */
    CHECK(st.num_blocks == 4 && st.used_bytes == 4 * kBlock && st.evictions == 0);

    /* A result waiting to be polled. */
    CHECK_OK(tier_submit_store(tier, 4, NULL, KEY_LEN, NULL, 0));
    CHECK_OK(tier_drain(tier));
    st = tu_stats(tier);
    CHECK(st.results_queued == 1 && st.jobs_in_flight == 0);
    r = tu_finish(tier, 4);
    st = tu_stats(tier);
    CHECK(st.results_queued == 0 && st.stores_ok == 2);

    CHECK_OK(tier_clear(tier));
    st = tu_stats(tier);
    CHECK(st.num_blocks == 0 && st.used_bytes == 0);
    CHECK(st.capacity_bytes == 65536 && st.stores_ok == 2 && st.bytes_stored == 4 * kBlock);
    tier_free(tier);
}

/* ---- the subtests ------------------------------------------------------- */

/* Runs body with rows of its own. */
static void with_rows(void (*body)(uint8_t *primary)) {
    uint8_t *primary = tu_alloc_rows(ROWS, kBlock);
    body(primary);
    free(primary);
}

/*
 * Bad input never disturbs stored data: runs body against a tier holding KEPT
 * blocks (their source rows overwritten once stored), then loads those blocks
 * back and compares every byte.
 */
static void with_kept_blocks(void (*body)(tier_t *tier, uint8_t *primary)) {
    uint8_t *primary = tu_alloc_rows(ROWS, kBlock);
    tier_t *tier = tu_new_tier(primary, ROWS * kBlock, kBlock, "64KiB", 2);
    uint64_t kept[KEPT];
    int64_t src[KEPT];
    int64_t dst[KEPT];
    tier_job_result_t r;
    size_t i;

    for (i = 0; i < KEPT; i++) {
        kept[i] = 5000 + i;
        src[i] = (int64_t)i;
        dst[i] = (int64_t)(ROWS - KEPT + i);
        tu_fill(primary + i * kBlock, kBlock, kept[i]);
    }
    tu_store(tier, 1000, KEY_LEN, kept, src, KEPT);
    /* The source rows may change once the store is polled. */
    memset(primary, 0xEE, KEPT * kBlock);

    body(tier, primary);

    memset(primary + (ROWS - KEPT) * kBlock, 0, KEPT * kBlock);
    r = tu_load(tier, 1001, KEY_LEN, kept, dst, KEPT);
    CHECK_STATUS(r.status, TIER_OK);
    CHECK(r.num_done == KEPT && r.bytes == KEPT * kBlock);
    for (i = 0; i < KEPT; i++) {
        CHECK(tu_mismatch(primary + (size_t)dst[i] * kBlock, kBlock, kept[i]) == -1);
    }
    tier_free(tier);
    free(primary);
}

static void test_rejected_config_value_changes_nothing(void) {
    with_rows(rejected_config_value_changes_nothing);
}
static void test_tier_new_checks_arguments_and_capacity(void) {
    with_rows(tier_new_checks_arguments_and_capacity);
}
static void test_stats_count_every_operation(void) {
    with_rows(stats_count_every_operation);
}
static void test_null_args_rejected_without_effect(void) {
    with_kept_blocks(null_args_rejected_without_effect);
}
static void test_key_len_limits_enforced(void) {
    with_kept_blocks(key_len_limits_enforced);
}
static void test_out_of_range_block_ids_rejected(void) {
    with_kept_blocks(out_of_range_block_ids_rejected);
}
static void test_duplicate_job_id_rejected_until_polled(void) {
    with_kept_blocks(duplicate_job_id_rejected_until_polled);
}
static void test_poll_is_oldest_first_and_wait_times_out(void) {
    with_kept_blocks(poll_is_oldest_first_and_wait_times_out);
}

/* tier_config_keys lists every key tier_config_set accepts, ended by NULL;
 * tier_config_get reads a value back in the library's spelling, truncates
 * like tier_last_error, and refuses unknown keys and NULLs. */
static void test_config_keys_and_values_read_back(void) {
    size_t n = 0;
    const char *const *keys = tier_config_keys(&n);
    CHECK(keys != NULL && n >= 20 && keys[n] == NULL);
    CHECK(tier_config_keys(NULL) == keys);
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    for (size_t i = 0; i < n; i++) {
        size_t len = 12345;
        CHECK(keys[i] != NULL && keys[i][0] != '\0');
        CHECK_OK(tier_config_get(cfg, keys[i], NULL, 0, &len));
        CHECK(len != 12345);
    }
    CHECK(strcmp(keys[0], "backend") == 0);
    CHECK_OK(tier_config_set(cfg, "backend", " Valkey "));
    CHECK_OK(tier_config_set(cfg, "sharing", " shared"));
    char buf[16];
    size_t len = 0;
    CHECK_OK(tier_config_get(cfg, "backend", buf, sizeof buf, &len));
    CHECK(len == 5 && strcmp(buf, "redis") == 0);
    CHECK_OK(tier_config_get(cfg, "sharing", buf, sizeof buf, &len));
    CHECK(len == 6 && strcmp(buf, "shared") == 0);
    memset(buf, 'X', sizeof buf);
    CHECK_OK(tier_config_get(cfg, "backend", buf, 3, &len));
    CHECK(len == 5 && strcmp(buf, "re") == 0 && buf[3] == 'X');
    len = 777;
    CHECK_ERROR(tier_config_get(cfg, "no_such_key", buf, sizeof buf, &len), TIER_ERR_CONFIG,
                "tier_config_get", "no_such_key");
    CHECK(len == 777);
    CHECK_ERROR(tier_config_get(cfg, "backend", buf, sizeof buf, NULL), TIER_ERR_NULL_ARG,
                "tier_config_get", "out_len");
    CHECK_ERROR(tier_config_get(NULL, "backend", buf, sizeof buf, &len), TIER_ERR_NULL_ARG,
                "tier_config_get", "cfg");
    tier_config_free(cfg);
}

int main(int argc, char **argv) {
    static const struct tu_subtest subtests[] = {
        TU_SUBTEST(version_matches_header),
        TU_SUBTEST(status_codes_and_names_are_abi),
        TU_SUBTEST(last_error_is_per_thread_and_truncates),
        TU_SUBTEST(config_accepts_and_rejects_values),
        TU_SUBTEST(config_keys_and_values_read_back),
        TU_SUBTEST(rejected_config_value_changes_nothing),
        TU_SUBTEST(tier_new_checks_arguments_and_capacity),
        TU_SUBTEST(stats_count_every_operation),
        TU_SUBTEST(null_args_rejected_without_effect),
        TU_SUBTEST(key_len_limits_enforced),
        TU_SUBTEST(out_of_range_block_ids_rejected),
        TU_SUBTEST(duplicate_job_id_rejected_until_polled),
        TU_SUBTEST(poll_is_oldest_first_and_wait_times_out),
    };
    return tu_run_subtests("test_api", argc, argv, subtests, TU_COUNT(subtests));
}
