/*
 * The KVTIER_1.1 calls through the C API: extent stores and loads at
 * unaligned offsets with a result per key (written at the caller's stride,
 * before the job is reported), a length mismatch failing only its key,
 * deletes reporting OK, MISS and BUSY with REMOVED events, pins holding off
 * eviction, unpin ignoring what it does not know; bad calls refused with a
 * clear status, nothing queued.
 */
#include "test_util.h"

#define KEY_LEN 32
#define BLOCK 8192
#define ROWS 16

/* A result array with a guard word after each element: the library writes
 * exactly sizeof(tier_item_result_t) bytes per key at this stride. */
struct guarded_item {
    tier_item_result_t item;
    uint32_t guard;
};
#define GUARD 0xC0FFEE11u

static void clear_items(struct guarded_item *items, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        items[i].item.status = 0xDEAD;
        items[i].item.reason = 0xDEAD;
        items[i].guard = GUARD;
    }
}

static void check_item(const struct guarded_item *got, uint32_t status, uint32_t reason) {
    CHECK(got->item.status == status);
    CHECK(got->item.reason == reason);
    CHECK(got->guard == GUARD);
}

static tier_t *new_tier(uint8_t *primary, unsigned capacity_blocks, int events) {
    char capacity[32];
    tier_t *tier = NULL;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    snprintf(capacity, sizeof capacity, "%u", capacity_blocks * BLOCK);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", capacity));
    CHECK_OK(tier_config_set(cfg, "io_threads", "2"));
    if (events) {
        CHECK_OK(tier_config_set(cfg, "events", "true"));
    }
    CHECK_OK(tier_new(cfg, primary, ROWS * BLOCK, BLOCK, &tier));
    tier_config_free(cfg);
    return tier;
}

/* Stores ids[0..n) from (offsets, lengths), each filled with its pattern,
 * and expects every item OK. */
static void store_extents(tier_t *tier, uint8_t *primary, uint64_t job, const uint64_t *ids,
                          const uint64_t *offsets, const uint64_t *lengths, size_t n) {
    uint8_t keys[8 * KEY_LEN];
    struct guarded_item items[8];
    tier_job_result_t r;
    size_t i;
    CHECK(n <= 8);
    for (i = 0; i < n; i++) {
        tu_fill(primary + offsets[i], lengths[i], ids[i]);
    }
    tu_keys(keys, KEY_LEN, ids, n);
    clear_items(items, n);
    CHECK_OK(tier_submit_store_extents(tier, job, keys, KEY_LEN, offsets, lengths, n,
                                       &items[0].item, sizeof items[0]));
    r = tu_finish(tier, job);
    CHECK_STATUS(r.status, TIER_OK);
    CHECK(r.kind == TIER_JOB_STORE && r.num_done == n);
    for (i = 0; i < n; i++) {
        check_item(&items[i], TIER_ITEM_OK, TIER_FAIL_NONE);
    }
}

static void test_unaligned_extents_round_trip_with_results_per_key(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = new_tier(primary, 32, 0);
    const uint64_t ids[4] = {1, 2, 3, 4};
    const uint64_t from_off[4] = {1, 13, 5000, 20001}, len[4] = {1, 4095, BLOCK, 777};
    const uint64_t to_off[4] = {100001, 90000, 7, 60123};
    uint64_t load_ids[5] = {1, 2, 99, 3, 4};
    uint64_t load_off[5] = {100001, 90000, 120000, 7, 60123};
    uint64_t load_len[5] = {1, 4096, 10, BLOCK, 777};
    uint8_t keys[5 * KEY_LEN];
    struct guarded_item items[5];
    tier_job_result_t r;
    size_t i;

    store_extents(tier, primary, 1, ids, from_off, len, 4);
    memset(primary, 0, ROWS * BLOCK);
    tu_keys(keys, KEY_LEN, load_ids, 5);
    clear_items(items, 5);
    CHECK_OK(tier_submit_load_extents(tier, 2, keys, KEY_LEN, load_off, load_len, 5,
                                      &items[0].item, sizeof items[0]));
    r = tu_finish(tier, 2);
    /* Key 2 asked 4096 bytes of a 4095-byte block; key 99 is absent; the
     * others loaded all the same. */
    CHECK(r.kind == TIER_JOB_LOAD && r.num_blocks == 5 && r.num_done == 3);
    CHECK_STATUS(r.status, TIER_ERR_INVALID_ARG);
    CHECK(r.reason == TIER_FAIL_LENGTH_MISMATCH);
    check_item(&items[0], TIER_ITEM_OK, TIER_FAIL_NONE);
    check_item(&items[1], TIER_ITEM_FAILED, TIER_FAIL_LENGTH_MISMATCH);
    check_item(&items[2], TIER_ITEM_MISS, TIER_FAIL_NOT_FOUND);
    check_item(&items[3], TIER_ITEM_OK, TIER_FAIL_NONE);
    check_item(&items[4], TIER_ITEM_OK, TIER_FAIL_NONE);
    CHECK(tu_all_bytes(primary + to_off[1], 4096, 0));
    for (i = 0; i < 4; i++) {
        if (i != 1) {
            CHECK(tu_mismatch(primary + to_off[i], len[i], ids[i]) < 0);
        }
    }
    tier_free(tier);
    free(primary);
}

static void test_deletes_pins_and_events(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = new_tier(primary, 2, 1);
    const uint64_t ids[2] = {1, 2}, off[2] = {0, BLOCK}, len[2] = {10, 20};
    const uint64_t three = 3, off3 = 2 * BLOCK, len3 = 30;
    uint64_t del_ids[3] = {1, 7, 2};
    uint8_t keys[3 * KEY_LEN], states[3] = {0xEE, 0xEE, 0xEE};
    struct guarded_item items[3];
    tier_event_t ev[8];
    tier_job_result_t r;
    size_t got = 0;

    store_extents(tier, primary, 1, ids, off, len, 2);
    CHECK_OK(tier_poll_events(tier, ev, sizeof ev[0], 8, &got));
    CHECK(got == 2);
    /* Both pinned: a store finds no room rather than evict one. */
    tu_keys(keys, KEY_LEN, ids, 2);
    CHECK_OK(tier_pin(tier, keys, KEY_LEN, 2, states));
    CHECK(states[0] == TIER_HIT && states[1] == TIER_HIT);
    tu_key(keys, KEY_LEN, three);
    clear_items(items, 1);
    CHECK_OK(tier_submit_store_extents(tier, 2, keys, KEY_LEN, &off3, &len3, 1, &items[0].item,
                                       sizeof items[0]));
    r = tu_finish(tier, 2);
    CHECK_STATUS(r.status, TIER_ERR_NO_SPACE);
    check_item(&items[0], TIER_ITEM_FAILED, TIER_FAIL_NO_SPACE);
    /* Unpin key 1 (and keys never pinned); delete 1, 7 and the pinned 2. */
    tu_keys(keys, KEY_LEN, del_ids, 3);
    CHECK_OK(tier_unpin(tier, keys, KEY_LEN, 2));
    clear_items(items, 3);
    CHECK_OK(tier_submit_delete(tier, 3, keys, KEY_LEN, 3, &items[0].item, sizeof items[0]));
    r = tu_finish(tier, 3);
    CHECK_STATUS(r.status, TIER_OK);
    CHECK(r.kind == TIER_JOB_DELETE && r.num_blocks == 3 && r.num_done == 1);
    check_item(&items[0], TIER_ITEM_OK, TIER_FAIL_NONE);
    check_item(&items[1], TIER_ITEM_MISS, TIER_FAIL_NOT_FOUND);
    check_item(&items[2], TIER_ITEM_BUSY, TIER_FAIL_BUSY);
    CHECK(tu_state(tier, KEY_LEN, 1) == TIER_MISS && tu_state(tier, KEY_LEN, 2) == TIER_HIT);
    CHECK_OK(tier_poll_events(tier, ev, sizeof ev[0], 8, &got));
    CHECK(got == 1 && ev[0].kind == TIER_EVENT_REMOVED && ev[0].reason == TIER_REMOVED_DELETED);
    /* Without a result array the job is still reported. */
    tu_key(keys, KEY_LEN, 2);
    CHECK_OK(tier_unpin(tier, keys, KEY_LEN, 1));
    CHECK_OK(tier_unpin(tier, keys, KEY_LEN, 1));
    CHECK_OK(tier_submit_delete(tier, 4, keys, KEY_LEN, 1, NULL, 0));
    r = tu_finish(tier, 4);
    CHECK(r.kind == TIER_JOB_DELETE && r.num_done == 1);
    CHECK(tu_state(tier, KEY_LEN, 2) == TIER_MISS);
    tier_free(tier);
    free(primary);
}

static void test_bad_calls_are_refused_and_queue_nothing(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = new_tier(primary, 8, 0);
    uint8_t keys[2 * KEY_LEN];
    const uint64_t ids[2] = {1, 2};
    uint64_t off[2] = {0, ROWS * BLOCK - 10}, len[2] = {8, 11};
    struct guarded_item items[2];
    tier_job_result_t out;
    size_t got = 5;

    tu_keys(keys, KEY_LEN, ids, 2);
    clear_items(items, 2);
    CHECK_ERROR(tier_submit_store_extents(tier, 1, keys, KEY_LEN, off, len, 2, &items[0].item,
                                          sizeof items[0]),
                TIER_ERR_INVALID_ARG, "tier_submit_store_extents", "offsets[1]");
    len[1] = 0;
    off[1] = 0;
    CHECK_ERROR(tier_submit_load_extents(tier, 1, keys, KEY_LEN, off, len, 2, NULL, 0),
                TIER_ERR_INVALID_ARG, "tier_submit_load_extents", "lengths[1]");
    len[1] = BLOCK + 1;
    CHECK_ERROR(tier_submit_store_extents(tier, 1, keys, KEY_LEN, off, len, 2, NULL, 0),
                TIER_ERR_INVALID_ARG, "tier_submit_store_extents", "lengths[1]");
    len[1] = 8;
    off[1] = 4;
    CHECK_ERROR(tier_submit_load_extents(tier, 1, keys, KEY_LEN, off, len, 2, NULL, 0),
                TIER_ERR_INVALID_ARG, "tier_submit_load_extents", "overlap");
    off[1] = BLOCK;
    CHECK_ERROR(tier_submit_store_extents(tier, 1, keys, KEY_LEN, off, len, 2, &items[0].item, 4),
                TIER_ERR_INVALID_ARG, "tier_submit_store_extents", "results");
    CHECK_ERROR(tier_submit_store_extents(tier, 1, keys, KEY_LEN, NULL, len, 2, NULL, 0),
                TIER_ERR_NULL_ARG, "tier_submit_store_extents", "offsets");
    CHECK_ERROR(tier_submit_delete(tier, 1, NULL, KEY_LEN, 2, NULL, 0), TIER_ERR_NULL_ARG,
                "tier_submit_delete", "keys");
    CHECK_ERROR(tier_pin(tier, keys, 0, 2, NULL), TIER_ERR_INVALID_ARG, "tier_pin", "key_len");
    CHECK_ERROR(tier_unpin(NULL, keys, KEY_LEN, 2), TIER_ERR_NULL_ARG, "tier_unpin", "tier");
    CHECK(items[0].item.status == 0xDEAD && items[1].guard == GUARD);
    CHECK_OK(tier_drain(tier));
    CHECK_OK(tier_poll_finished(tier, &out, sizeof out, 1, &got));
    CHECK(got == 0);
    /* n = 0 takes NULLs and is reported as a success. */
    CHECK_OK(tier_submit_store_extents(tier, 1, NULL, KEY_LEN, NULL, NULL, 0, NULL, 0));
    out = tu_finish(tier, 1);
    CHECK_STATUS(out.status, TIER_OK);
    CHECK_OK(tier_pin(tier, NULL, KEY_LEN, 0, NULL));
    CHECK_OK(tier_unpin(tier, NULL, KEY_LEN, 0));
    tier_free(tier);
    free(primary);
}

int main(int argc, char **argv) {
    static const struct tu_subtest subtests[] = {
        TU_SUBTEST(unaligned_extents_round_trip_with_results_per_key),
        TU_SUBTEST(deletes_pins_and_events),
        TU_SUBTEST(bad_calls_are_refused_and_queue_nothing),
    };
    return tu_run_subtests("test_items", argc, argv, subtests, TU_COUNT(subtests));
}
