/*
 * Block events through the C API: tier_poll_events hands out STORED when a
 * block becomes readable and REMOVED (with its reason) when it stops being
 * readable, each once, with the key inline; a full ring drops the oldest
 * events and says so in place (TIER_EVENT_LOST) and in tier_stats; bad calls
 * get a clear status and leave the outputs untouched.
 */
#include "test_util.h"

#define KEY_LEN 36
#define BLOCK 4096
#define ROWS 8

/* A tier of capacity_blocks blocks with events on, holding events_capacity. */
static tier_t *new_tier_with_events(uint8_t *primary, unsigned capacity_blocks,
                                    const char *events_capacity) {
    char capacity[32];
    tier_t *tier = NULL;
    tier_config_t *cfg = tier_config_new();
    CHECK(cfg != NULL);
    snprintf(capacity, sizeof capacity, "%u", capacity_blocks * BLOCK);
    CHECK_OK(tier_config_set(cfg, "capacity_bytes", capacity));
    CHECK_OK(tier_config_set(cfg, "io_threads", "2"));
    CHECK_OK(tier_config_set(cfg, "events", "true"));
    CHECK_OK(tier_config_set(cfg, "events_capacity", events_capacity));
    CHECK_OK(tier_new(cfg, primary, ROWS * BLOCK, BLOCK, &tier));
    tier_config_free(cfg);
    return tier;
}

static void store(tier_t *tier, uint64_t job_id, const uint64_t *ids, size_t n) {
    int64_t rows[ROWS];
    size_t i;
    CHECK(n <= ROWS);
    for (i = 0; i < n; i++) {
        rows[i] = (int64_t)i;
    }
    tu_store(tier, job_id, KEY_LEN, ids, rows, n);
}

/* Every event waiting (at most cap), polled two at a time. */
static size_t poll_all(tier_t *tier, tier_event_t *out, size_t cap) {
    size_t total = 0, got = 0;
    do {
        CHECK(total + 2 <= cap);
        CHECK_OK(tier_poll_events(tier, out + total, sizeof(tier_event_t), 2, &got));
        CHECK(got <= 2);
        total += got;
    } while (got > 0);
    return total;
}

/* Fails unless e is a `kind` event with `reason` for the key numbered id. */
static void check_event(const tier_event_t *e, uint32_t kind, uint32_t reason, uint64_t id) {
    uint8_t key[TIER_MAX_KEY_LEN];
    size_t i;
    tu_key(key, KEY_LEN, id);
    CHECK(e->kind == kind);
    CHECK(e->reason == reason);
    CHECK(e->dropped == 0);
    CHECK(e->key_len == KEY_LEN);
    CHECK(memcmp(e->key, key, KEY_LEN) == 0);
    for (i = KEY_LEN; i < TIER_MAX_KEY_LEN; i++) {
        CHECK(e->key[i] == 0);
    }
}

static void test_stores_evictions_and_clear_are_reported_once(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = new_tier_with_events(primary, 2, "64");
    tier_event_t ev[16];
    const uint64_t first[2] = {1, 2}, third = 3;
    const int64_t dst = 5;
    size_t n, i;

    CHECK(TIER_EVENT_STORED == 1 && TIER_EVENT_REMOVED == 2 && TIER_EVENT_LOST == 3);
    store(tier, 1, first, 2);
    n = poll_all(tier, ev, 16);
    CHECK(n == 2);
    check_event(&ev[0], TIER_EVENT_STORED, TIER_STORED_WRITTEN, 1);
    check_event(&ev[1], TIER_EVENT_STORED, TIER_STORED_WRITTEN, 2);
    CHECK(ev[0].seq == 0 && ev[1].seq == 1);

    /* Reading 2 makes it the most recent, so storing 3 evicts 1. */
    CHECK_STATUS(tu_load(tier, 2, KEY_LEN, &first[1], &dst, 1).status, TIER_OK);
    store(tier, 3, &third, 1);
    n = poll_all(tier, ev, 16);
    CHECK(n == 2);
    check_event(&ev[0], TIER_EVENT_REMOVED, TIER_REMOVED_EVICTED, 1);
    check_event(&ev[1], TIER_EVENT_STORED, TIER_STORED_WRITTEN, 3);
    CHECK(ev[0].seq == 2 && ev[1].seq == 3);
    CHECK(tu_state(tier, KEY_LEN, 1) == TIER_MISS && tu_state(tier, KEY_LEN, 2) == TIER_HIT);

    CHECK_OK(tier_clear(tier));
    n = poll_all(tier, ev, 16);
    CHECK(n == 2);
    for (i = 0; i < 2; i++) {
        CHECK(ev[i].kind == TIER_EVENT_REMOVED && ev[i].reason == TIER_REMOVED_CLEARED);
    }
    check_event(&ev[ev[0].key[0] == 2 ? 0 : 1], TIER_EVENT_REMOVED, TIER_REMOVED_CLEARED, 2);
    check_event(&ev[ev[0].key[0] == 2 ? 1 : 0], TIER_EVENT_REMOVED, TIER_REMOVED_CLEARED, 3);
    CHECK_OK(tier_clear(tier));
    CHECK(poll_all(tier, ev, 16) == 0);
    CHECK(tu_stats(tier).events_dropped == 0);
    tier_free(tier);
    free(primary);
}

static void test_a_full_ring_reports_the_loss_in_place(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *tier = new_tier_with_events(primary, 8, "2");
    tier_event_t ev[8];
    size_t got = 0;
    uint64_t id;

    for (id = 1; id <= 5; id++) {
        store(tier, id, &id, 1);
    }
    CHECK(tu_stats(tier).events_dropped == 3);
    CHECK_OK(tier_poll_events(tier, ev, sizeof(tier_event_t), 8, &got));
    CHECK(got == 3);
    CHECK(ev[0].kind == TIER_EVENT_LOST && ev[0].dropped == 3 && ev[0].seq == 0);
    CHECK(ev[0].key_len == 0 && ev[0].reason == 0);
    check_event(&ev[1], TIER_EVENT_STORED, TIER_STORED_WRITTEN, 4);
    check_event(&ev[2], TIER_EVENT_STORED, TIER_STORED_WRITTEN, 5);
    CHECK(ev[1].seq == 3 && ev[2].seq == 4);
    CHECK_OK(tier_poll_events(tier, ev, sizeof(tier_event_t), 8, &got));
    CHECK(got == 0);
    tier_free(tier);
    free(primary);
}

static void test_bad_calls_are_clear_errors(void) {
    uint8_t *primary = tu_alloc_rows(ROWS, BLOCK);
    tier_t *plain = tu_new_tier(primary, ROWS * BLOCK, BLOCK, "32KiB", 1);
    tier_t *tier = new_tier_with_events(primary, 8, "16");
    tier_config_t *cfg = tier_config_new();
    tier_event_t ev[2], untouched;
    size_t got = 77;
    const uint64_t one = 1;

    store(tier, 1, &one, 1);
    memset(&untouched, 0xCD, sizeof untouched);
    ev[0] = untouched;
    CHECK_ERROR(tier_poll_events(NULL, ev, sizeof(tier_event_t),
                                 2, &got), TIER_ERR_NULL_ARG, "tier_poll_events",
                "tier");
    CHECK_ERROR(tier_poll_events(tier, NULL, sizeof(tier_event_t),
                                 2, &got), TIER_ERR_NULL_ARG, "tier_poll_events",
                "out");
    CHECK_ERROR(tier_poll_events(tier, ev, sizeof(tier_event_t),
                                 2, NULL), TIER_ERR_NULL_ARG, "tier_poll_events",
                "out_n");
    CHECK_ERROR(tier_poll_events(tier, ev, sizeof(tier_event_t),
                                 0, &got), TIER_ERR_INVALID_ARG, "tier_poll_events",
                "cap");
    CHECK_ERROR(tier_poll_events(plain, ev, sizeof(tier_event_t),
                                 2, &got), TIER_ERR_CONFIG, "tier_poll_events",
                "events=true");
    CHECK(got == 77 && memcmp(&ev[0], &untouched, sizeof untouched) == 0);
    /* The failed calls took nothing. */
    CHECK_OK(tier_poll_events(tier, ev, sizeof(tier_event_t), 2, &got));
    CHECK(got == 1);
    check_event(&ev[0], TIER_EVENT_STORED, TIER_STORED_WRITTEN, 1);

    CHECK(cfg != NULL);
    CHECK_ERROR(tier_config_set(cfg, "events", "maybe"), TIER_ERR_CONFIG, "tier_config_set",
                "events");
    CHECK_ERROR(tier_config_set(cfg, "events_capacity", "0"), TIER_ERR_CONFIG,
                "tier_config_set", "events_capacity");
    CHECK_ERROR(tier_config_set(cfg, "events_capacity", "99999999"), TIER_ERR_CONFIG,
                "tier_config_set", "events_capacity");
    tier_config_free(cfg);
    tier_free(tier);
    tier_free(plain);
    free(primary);
}

int main(int argc, char **argv) {
    static const struct tu_subtest subtests[] = {
        TU_SUBTEST(stores_evictions_and_clear_are_reported_once),
        TU_SUBTEST(a_full_ring_reports_the_loss_in_place),
        TU_SUBTEST(bad_calls_are_clear_errors),
    };
    return tu_run_subtests("test_events", argc, argv, subtests, TU_COUNT(subtests));
}
