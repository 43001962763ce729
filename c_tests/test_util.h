/*
 * Shared helpers of the C tests. Include it first: it selects the POSIX/GNU
 * declarations (pthreads, mmap, dlsym) before any system header.
 *
 * Every file that includes it must be valid C11 and valid C++17 (each .c test
 * is compiled both ways), so: casts on malloc, no designated or compound
 * initializers, no VLAs.
 */
#ifndef KVTIER_TEST_UTIL_H
#define KVTIER_TEST_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"

/* ---- failing ---------------------------------------------------------- */

static inline void tu_last_error(char *buf, size_t cap) {
    size_t len = tier_last_error(buf, cap);
    if (len == 0 && cap > 0) {
        snprintf(buf, cap, "(none)");
    }
}

static inline void tu_fail(const char *file, int line, const char *what) {
    char msg[512];
    tu_last_error(msg, sizeof msg);
    fprintf(stderr, "%s:%d: CHECK failed: %s\n    this thread's tier_last_error (may be older): %s\n",
            file, line, what, msg);
    fflush(stderr);
    exit(1);
}

/* Fails the test (with file:line and this thread's tier_last_error) unless cond. */
#define CHECK(cond)                                  \
    do {                                             \
        if (!(cond)) {                               \
            tu_fail(__FILE__, __LINE__, #cond);      \
        }                                            \
    } while (0)

static inline void tu_check_status(const char *file, int line, const char *expr,
                                   tier_status_t got, tier_status_t want) {
    if (got != want) {
        char what[768];
        snprintf(what, sizeof what, "%s returned %s (%d), expected %s (%d)", expr,
                 tier_status_str(got), (int)got, tier_status_str(want), (int)want);
        tu_fail(file, line, what);
    }
}

/* Fails unless expr returns the status want. */
#define CHECK_STATUS(expr, want) tu_check_status(__FILE__, __LINE__, #expr, (expr), (want))
#define CHECK_OK(expr) CHECK_STATUS(expr, TIER_OK)

/*
 * Fails unless expr returns the error want AND this thread's tier_last_error
 * then names the failing function ("function: ...") and, after that, contains
 * detail (the offending argument), so a stale message from an earlier call is
 * unlikely to pass.
 */
static inline void tu_check_error(const char *file, int line, const char *expr,
                                  tier_status_t got, tier_status_t want,
                                  const char *function, const char *detail) {
    char msg[1024];
    char what[1024 + 512];
    size_t len;
    tu_check_status(file, line, expr, got, want);
    len = tier_last_error(msg, sizeof msg);
    if (len == 0 || len >= sizeof msg || strlen(msg) != len ||
        strncmp(msg, function, strlen(function)) != 0 || msg[strlen(function)] != ':' ||
        strstr(msg + strlen(function) + 1, detail) == NULL) {
        snprintf(what, sizeof what,
                 "%s: message \"%s\" (length %zu) should start with \"%s:\" and contain \"%s\"",
                 expr, msg, len, function, detail);
        tu_fail(file, line, what);
    }
}
#define CHECK_ERROR(expr, want, function, detail) \
    tu_check_error(__FILE__, __LINE__, #expr, (expr), (want), (function), (detail))

/* ---- environment ------------------------------------------------------ */

/* Multiplies time limits: sanitizers and valgrind slow everything down. */
static inline double tu_time_scale(void) {
    const char *s = getenv("KVTIER_TEST_TIME_SCALE");
    double x = s != NULL ? atof(s) : 1.0;
    return x >= 1.0 ? x : 1.0;
}

static inline uint64_t tu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void tu_sleep_ms(unsigned ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/*
 * Call first in main. In a -DKVTIER_EXPECT_ASAN build, fails unless the test
 * was compiled with AddressSanitizer and its runtime is loaded, so a build
 * that silently dropped the flags cannot pass as a sanitizer run.
 */
static inline void tu_start(const char *test) {
#ifdef KVTIER_EXPECT_ASAN
#ifdef __SANITIZE_ADDRESS__
    const int compiled_with_asan = 1;
#else
    const int compiled_with_asan = 0;
#endif
    void *asan_init = dlsym(RTLD_DEFAULT, "__asan_init");
    if (!compiled_with_asan || asan_init == NULL) {
        fprintf(stderr,
                "%s: expected an AddressSanitizer build, but __SANITIZE_ADDRESS__ is %s and "
                "__asan_init is %s\n",
                test, compiled_with_asan ? "defined" : "NOT defined",
                asan_init != NULL ? "loaded" : "NOT loaded");
        exit(1);
    }
    printf("%s: AddressSanitizer active (__SANITIZE_ADDRESS__ defined, __asan_init at %p)\n", test,
           asan_init);
#endif
    printf("%s: kvtier %s (header %s), built as %s\n", test, tier_version(),
           KVTIER_VERSION_STRING,
#ifdef __cplusplus
           "C++"
#else
           "C"
#endif
    );
    fflush(stdout);
}

/* ---- subtests ---------------------------------------------------------- */

/*
 * A test file with several independent checks lists them once, in main:
 *
 *     static const struct tu_subtest subtests[] = {
 *         TU_SUBTEST(lru_evicts_least_recently_used),   runs test_lru_evicts_...()
 *         ...
 *     };
 *     return tu_run_subtests("test_contract", argc, argv, subtests, TU_COUNT(subtests));
 *
 * The name says what the check proves. c_tests/CMakeLists.txt reads the
 * TU_SUBTEST(...) lines of each test source and registers every subtest as its
 * own CTest test (c_contract.<name>, asan_contract.<name>, ...), so a new
 * TU_SUBTEST line is the only thing to write (one per line, nowhere else).
 *
 * The program runs every subtest without arguments, only the named ones with
 * names, and prints the names with --list.
 */
struct tu_subtest {
    const char *name;
    void (*run)(void);
};
#define TU_SUBTEST(name) {#name, test_##name}
#define TU_COUNT(array) (sizeof(array) / sizeof((array)[0]))

static inline int tu_run_subtests(const char *test, int argc, char **argv,
                                  const struct tu_subtest *subtests, size_t count) {
    size_t i;
    int a;
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (i = 0; i < count; i++) {
            printf("%s\n", subtests[i].name);
        }
        return 0;
    }
    tu_start(test);
    for (a = 1; a < argc; a++) {
        for (i = 0; i < count && strcmp(argv[a], subtests[i].name) != 0; i++) {
        }
        if (i == count) {
            fprintf(stderr, "%s: no subtest \"%s\" (--list lists them)\n", test, argv[a]);
            return 2;
        }
    }
    for (i = 0; i < count; i++) {
        int selected = argc == 1;
        for (a = 1; a < argc; a++) {
            selected |= strcmp(argv[a], subtests[i].name) == 0;
        }
        if (selected) {
            printf("%s: %s ...\n", test, subtests[i].name);
            fflush(stdout);
            subtests[i].run();
            printf("%s: %s ok\n", test, subtests[i].name);
            fflush(stdout);
        }
    }
    printf("%s: ok\n", test);
    return 0;
}

/* ---- keys and block contents ------------------------------------------ */

static inline uint64_t tu_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Writes the key_len-byte key number id (distinct ids give distinct keys). */
static inline void tu_key(uint8_t *key, size_t key_len, uint64_t id) {
    size_t i;
    uint64_t word = 0;
    for (i = 0; i < key_len; i++) {
        if (i % 8 == 0) {
            word = tu_mix64(id * 0x9e3779b97f4a7c15ull + i / 8 + 1);
        }
        key[i] = (uint8_t)(word >> (8 * (i % 8)));
    }
    /* The id's low bytes verbatim, so short keys stay distinct too. */
    for (i = 0; i < key_len && i < 8; i++) {
        key[i] = (uint8_t)(id >> (8 * i));
    }
}

/* Packs the keys numbered ids[0..n) into keys (n * key_len bytes). */
static inline void tu_keys(uint8_t *keys, size_t key_len, const uint64_t *ids, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        tu_key(keys + i * key_len, key_len, ids[i]);
    }
}

/* Fills a block with the pattern of seed (a different seed differs everywhere). */
static inline void tu_fill(uint8_t *block, size_t bytes, uint64_t seed) {
    size_t i;
    uint64_t x = tu_mix64(seed + 0x1234567ull);
    for (i = 0; i + 8 <= bytes; i += 8) {
        x = tu_mix64(x + i);
        memcpy(block + i, &x, 8);
    }
    for (; i < bytes; i++) {
        block[i] = (uint8_t)(seed + i);
    }
}

/* Index of the first byte that differs from the pattern of seed, or -1. */
static inline long tu_mismatch(const uint8_t *block, size_t bytes, uint64_t seed) {
    size_t i, j;
    uint8_t want[8];
    uint64_t x = tu_mix64(seed + 0x1234567ull);
    for (i = 0; i + 8 <= bytes; i += 8) {
        x = tu_mix64(x + i);
        memcpy(want, &x, 8);
        if (memcmp(block + i, want, 8) != 0) {
            for (j = 0; block[i + j] == want[j]; j++) {
            }
            return (long)(i + j);
        }
    }
    for (; i < bytes; i++) {
        if (block[i] != (uint8_t)(seed + i)) {
            return (long)i;
        }
    }
    return -1;
}

/* True if every byte of block is value. */
static inline int tu_all_bytes(const uint8_t *block, size_t bytes, uint8_t value) {
    size_t i;
    for (i = 0; i < bytes; i++) {
        if (block[i] != value) {
            return 0;
        }
    }
    return 1;
}

/* ---- tiers ------------------------------------------------------------ */

static inline uint8_t *tu_alloc_rows(size_t rows, size_t block_bytes) {
    size_t bytes = rows * block_bytes;
    uint8_t *p = (uint8_t *)aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    CHECK(p != NULL);
    memset(p, 0, bytes);
    return p;
}

/* A tier over primary with capacity (a config string) and io_threads (0 = default). */
static inline tier_t *tu_new_tier(void *primary, size_t primary_len, size_t block_bytes,
                                  const char *capacity, unsigned io_threads) {
    tier_t *tier = NULL;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", capacity));
    if (io_threads > 0) {
        char n[16];
        snprintf(n, sizeof n, "%u", io_threads);
        CHECK_OK(tier_config_set(cfg, "io_threads", n));
    }
    CHECK_OK(tier_new(cfg, primary, primary_len, block_bytes, &tier));
    CHECK(tier != NULL);
    tier_config_free(cfg);
    return tier;
}

/*
 * Drains the tier and polls every result into out (at most cap); fails if
 * more are queued. Returns how many were polled.
 */
static inline size_t tu_drain_poll(tier_t *tier, tier_job_result_t *out, size_t cap) {
    size_t total = 0;
    size_t got = 0;
    tier_job_result_t extra;
    CHECK_OK(tier_drain(tier));
    while (total < cap) {
        CHECK_OK(tier_poll_finished(tier, out + total, sizeof(tier_job_result_t),
                                    cap - total, &got));
        if (got == 0) {
            break;
        }
        total += got;
    }
    CHECK_OK(tier_poll_finished(tier, &extra, sizeof(tier_job_result_t), 1, &got));
    CHECK(got == 0);
    return total;
}

/* Drains the tier and returns its only result, which must be job_id's. */
static inline tier_job_result_t tu_finish(tier_t *tier, uint64_t job_id) {
    tier_job_result_t r[2];
    size_t n = tu_drain_poll(tier, r, 2);
    if (n != 1 || r[0].job_id != job_id) {
        fprintf(stderr, "expected exactly the result of job %llu, got %zu results (first id %llu)\n",
                (unsigned long long)job_id, n, n > 0 ? (unsigned long long)r[0].job_id : 0ull);
    }
    CHECK(n == 1);
    CHECK(r[0].job_id == job_id);
    return r[0];
}

/* Stores the keys ids[0..n) from rows[0..n) as job job_id and expects success. */
static inline tier_job_result_t tu_store(tier_t *tier, uint64_t job_id, size_t key_len,
                                         const uint64_t *ids, const int64_t *rows, size_t n) {
    uint8_t *keys = (uint8_t *)malloc(n * key_len + 1);
    tier_job_result_t r;
    CHECK(keys != NULL);
    tu_keys(keys, key_len, ids, n);
    CHECK_OK(tier_submit_store(tier, job_id, keys, key_len, rows, n));
    r = tu_finish(tier, job_id);
    free(keys);
    CHECK_STATUS(r.status, TIER_OK);
    CHECK(r.kind == TIER_JOB_STORE);
    CHECK(r.num_blocks == n && r.num_done == n);
    return r;
}

/* Loads the keys ids[0..n) into rows[0..n) as job job_id; returns the result. */
static inline tier_job_result_t tu_load(tier_t *tier, uint64_t job_id, size_t key_len,
                                        const uint64_t *ids, const int64_t *rows, size_t n) {
    uint8_t *keys = (uint8_t *)malloc(n * key_len + 1);
    tier_job_result_t r;
    CHECK(keys != NULL);
    tu_keys(keys, key_len, ids, n);
    CHECK_OK(tier_submit_load(tier, job_id, keys, key_len, rows, n));
    r = tu_finish(tier, job_id);
    free(keys);
    CHECK(r.kind == TIER_JOB_LOAD);
    CHECK(r.num_blocks == n);
    return r;
}

/* The lookup state of the single key id. */
static inline uint8_t tu_state(tier_t *tier, size_t key_len, uint64_t id) {
    uint8_t key[TIER_MAX_KEY_LEN];
    uint8_t state = 0xEE;
    tu_key(key, key_len, id);
    CHECK_OK(tier_lookup(tier, key, key_len, 1, &state));
    CHECK(state == TIER_MISS || state == TIER_HIT || state == TIER_PENDING);
    return state;
}

static inline tier_stats_t tu_stats(tier_t *tier) {
    tier_stats_t s;
    memset(&s, 0, sizeof s);
    CHECK_OK(tier_stats(tier, &s, sizeof(tier_stats_t)));
    return s;
}

#endif /* KVTIER_TEST_UTIL_H */
