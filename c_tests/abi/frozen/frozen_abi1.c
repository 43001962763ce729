/*
 * A program built against the ABI 1 header as it stood when ABI 1 was made
 * (kvtier_abi1.h, a frozen copy: never regenerated, never edited), run
 * against the current library under AddressSanitizer. Every struct and array
 * it passes is followed by guard bytes, and heap copies of exactly its sizes
 * are handed over too, so a library writing past what this program declared
 * fails here (guard bytes changed, or an ASan report), as does a library that
 * changed a field this program reads. Every later change to the library runs
 * it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* RTLD_DEFAULT */
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier_abi1.h"

#define ROWS 8
#define BLOCK 4096
#define KEY_LEN 24
#define N 4
#define GUARD_BYTES 64
#define GUARD 0x5A

static int failures;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            failures++;                                                    \
        }                                                                  \
    } while (0)

/* Each output the library writes, followed by guard bytes. */
struct guarded_info {
    tier_abi_info_t info;
    uint8_t guard[GUARD_BYTES];
};
struct guarded_stats {
    tier_stats_t stats;
    uint8_t guard[GUARD_BYTES];
};
struct guarded_results {
    tier_job_result_t r[N];
    uint8_t guard[GUARD_BYTES];
};
struct guarded_events {
    tier_event_t ev[N];
    uint8_t guard[GUARD_BYTES];
};
struct guarded_states {
    uint8_t s[N];
    uint8_t guard[GUARD_BYTES];
};
struct guarded_text {
    char text[32];
    uint8_t guard[GUARD_BYTES];
};
struct guarded_count {
    size_t n;
    uint8_t guard[GUARD_BYTES];
};

static int guard_intact(const uint8_t *guard) {
    int i;
    for (i = 0; i < GUARD_BYTES; i++) {
        if (guard[i] != GUARD) {
            return 0;
        }
    }
    return 1;
}

#define GUARDED(var) memset(&(var), GUARD, sizeof(var))
#define CHECK_GUARD(var) CHECK(guard_intact((var).guard))

static void key_of(uint8_t *key, uint64_t id) {
    memset(key, 0, KEY_LEN);
    memcpy(key, "frozen-abi1-", 12);
    memcpy(key + 12, &id, sizeof id);
}

static void poll_results(tier_t *tier, uint64_t first_job) {
    struct guarded_results res;
    struct guarded_count got;
    tier_job_result_t *heap = (tier_job_result_t *)malloc(N * sizeof(tier_job_result_t));
    size_t i;
    CHECK(heap != NULL);
    CHECK(tier_drain(tier) == TIER_OK);
    GUARDED(res);
    GUARDED(got);
    CHECK(tier_poll_finished(tier, res.r, sizeof(tier_job_result_t), N - 1, &got.n) == TIER_OK);
    CHECK(got.n == N - 1);
    for (i = 0; i < got.n && i < N - 1; i++) {
        CHECK(res.r[i].status == TIER_OK && res.r[i].reason == TIER_FAIL_NONE);
        CHECK(res.r[i].job_id >= first_job && res.r[i].job_id < first_job + N);
        CHECK(res.r[i].num_blocks == 1 && res.r[i].num_done == 1 && res.r[i].bytes == BLOCK);
    }
    /* The last slot was not offered: it must be untouched. */
    CHECK(((const uint8_t *)&res.r[N - 1])[0] == GUARD);
    CHECK_GUARD(res);
    CHECK_GUARD(got);
    /* The remaining result into an exactly sized heap array. */
    CHECK(tier_poll_finished(tier, heap, sizeof(tier_job_result_t), 1, &got.n) == TIER_OK);
    CHECK(got.n == 1 && heap[0].status == TIER_OK);
    free(heap);
}

int main(void) {
    struct guarded_info info;
    struct guarded_stats st;
    struct guarded_events ev;
    struct guarded_states states;
    struct guarded_text text;
    struct guarded_count got;
    tier_abi_info_t *heap_info = (tier_abi_info_t *)malloc(sizeof(tier_abi_info_t));
    tier_stats_t *heap_stats = (tier_stats_t *)malloc(sizeof(tier_stats_t));
    tier_event_t *heap_event = (tier_event_t *)malloc(sizeof(tier_event_t));
    uint8_t *primary = (uint8_t *)aligned_alloc(4096, (size_t)ROWS * BLOCK);
    uint8_t keys[N * KEY_LEN];
    int64_t rows[N], back[N];
    tier_config_t *cfg;
    tier_t *tier = NULL;
    uint64_t i;
    size_t len;

    /* A run without the sanitizer would prove less than it claims. */
#if defined(__SANITIZE_ADDRESS__)
    CHECK(dlsym(RTLD_DEFAULT, "__asan_init") != NULL);
#else
    CHECK(!"built with -fsanitize=address");
#endif
    CHECK(heap_info && heap_stats && heap_event && primary);
    /* First, as a dlopen host would: the ABI and the sizes of its structs. */
    GUARDED(info);
    CHECK(tier_abi_info(&info.info, sizeof(tier_abi_info_t)) == TIER_OK);
    CHECK_GUARD(info);
    CHECK(info.info.abi_version == TIER_ABI_VERSION);
    CHECK(info.info.stats_size >= sizeof(tier_stats_t));
    CHECK(info.info.job_result_size >= sizeof(tier_job_result_t));
    CHECK(info.info.event_size >= sizeof(tier_event_t));
    CHECK(tier_abi_info(heap_info, sizeof(tier_abi_info_t)) == TIER_OK);
    CHECK(heap_info->abi_version == TIER_ABI_VERSION);

    for (i = 0; i < (uint64_t)ROWS * BLOCK; i++) {
        primary[i] = (uint8_t)(i * 7 + i / BLOCK);
    }
    cfg = tier_config_new();
    CHECK(cfg != NULL);
    CHECK(tier_config_set(cfg, "capacity_bytes", "1MiB") == TIER_OK);
    CHECK(tier_config_set(cfg, "io_threads", "2") == TIER_OK);
    CHECK(tier_config_set(cfg, "events", "true") == TIER_OK);
    CHECK(tier_new(cfg, primary, (size_t)ROWS * BLOCK, BLOCK, &tier) == TIER_OK && tier != NULL);
    tier_config_free(cfg);
    if (tier == NULL) {
        return 1;
    }

    for (i = 0; i < N; i++) {
        key_of(keys + i * KEY_LEN, i);
        rows[i] = (int64_t)i;
        back[i] = (int64_t)(N + i);
    }
    for (i = 0; i < N; i++) {
        CHECK(tier_submit_store(tier, 100 + i, keys + i * KEY_LEN, KEY_LEN, &rows[i], 1) == TIER_OK);
    }
    poll_results(tier, 100);

    GUARDED(states);
    CHECK(tier_lookup(tier, keys, KEY_LEN, N, states.s) == TIER_OK);
    for (i = 0; i < N; i++) {
        CHECK(states.s[i] == TIER_HIT);
    }
    CHECK_GUARD(states);

    for (i = 0; i < N; i++) {
        CHECK(tier_submit_load(tier, 200 + i, keys + i * KEY_LEN, KEY_LEN, &back[i], 1) == TIER_OK);
    }
    poll_results(tier, 200);
    for (i = 0; i < N; i++) {
        CHECK(memcmp(primary + (N + i) * BLOCK, primary + i * BLOCK, BLOCK) == 0);
    }

    GUARDED(st);
    CHECK(tier_stats(tier, &st.stats, sizeof(tier_stats_t)) == TIER_OK);
    CHECK_GUARD(st);
    CHECK(st.stats.stores_ok == N && st.stats.loads_ok == N && st.stats.num_blocks == N);
    CHECK(st.stats.block_bytes == BLOCK && st.stats.bytes_loaded == N * BLOCK);
    CHECK(tier_stats(tier, heap_stats, sizeof(tier_stats_t)) == TIER_OK);
    CHECK(heap_stats->stores_ok == N);

    GUARDED(ev);
    GUARDED(got);
    CHECK(tier_poll_events(tier, ev.ev, sizeof(tier_event_t), N - 1, &got.n) == TIER_OK);
    CHECK(got.n == N - 1);
    for (i = 0; i < got.n && i < N - 1; i++) {
        CHECK(ev.ev[i].kind == TIER_EVENT_STORED && ev.ev[i].reason == TIER_STORED_WRITTEN);
        CHECK(ev.ev[i].key_len == KEY_LEN && ev.ev[i].seq == i);
    }
    CHECK(((const uint8_t *)&ev.ev[N - 1])[0] == GUARD);
    CHECK_GUARD(ev);
    CHECK_GUARD(got);
    CHECK(tier_poll_events(tier, heap_event, sizeof(tier_event_t), 1, &got.n) == TIER_OK);
    CHECK(got.n == 1 && heap_event->seq == N - 1);

    GUARDED(text);
    len = tier_describe(tier, text.text, sizeof text.text);
    CHECK(len > 0 && strlen(text.text) == (len < sizeof text.text ? len : sizeof text.text - 1));
    CHECK_GUARD(text);
    GUARDED(text);
    len = tier_metrics(tier, text.text, sizeof text.text);
    CHECK(len > sizeof text.text && strlen(text.text) == sizeof text.text - 1);
    CHECK_GUARD(text);
    GUARDED(text);
    CHECK(tier_stats(tier, &st.stats, TIER_STATS_SIZE_V1 - 1) == TIER_ERR_INVALID_ARG);
    len = tier_last_error(text.text, sizeof text.text);
    CHECK(len > 0 && strncmp(text.text, "tier_stats", 10) == 0);
    CHECK_GUARD(text);
    CHECK(strcmp(tier_status_str(TIER_ERR_INVALID_ARG), "TIER_ERR_INVALID_ARG") == 0);

    CHECK(tier_clear(tier) == TIER_OK);
    tier_free(tier);
    free(primary);
    free(heap_info);
    free(heap_stats);
    free(heap_event);
    if (failures == 0) {
        printf("frozen_abi1: ABI %u library, every guard intact: ok\n", info.info.abi_version);
    }
    return failures == 0 ? 0 : 1;
}
