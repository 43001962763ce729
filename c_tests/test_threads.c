/*
 * Several threads on one handle at once: random stores, loads, lookups,
 * touches, polls, waits and the odd clear, on private and shared keys, with a
 * capacity small enough to force eviction and NO_SPACE.
 *
 * A key's block contents are a function of the key, so every successful load
 * is checked byte for byte whoever stored the key. Results are polled by
 * whichever thread polls; they are collected in one table, and every accepted
 * job must appear in it exactly once.
 */
#include "test_util.h"

#include <pthread.h>

#define THREADS 6
#define OPS 4000
#define KEY_LEN 16
#define BLOCK ((size_t)8192)
#define CAPACITY_BLOCKS 48
#define ROWS_PER_THREAD 64
#define MAX_JOB 8
#define MAX_OUTSTANDING 8
#define OWN_KEYS 8
#define SHARED_KEYS 16
/* Rows nobody writes: the source of the stores that cannot fit. */
#define SPARE_ROWS (CAPACITY_BLOCKS + 1)
#define TOTAL_ROWS (THREADS * ROWS_PER_THREAD + SPARE_ROWS)
/* Job sequence numbers per thread: at most one job per op. */
#define MAX_SEQ (OPS + 1)

enum { KIND_NONE = 0, KIND_STORE = 1, KIND_LOAD = 2, KIND_OVERSIZE = 3 };

struct job {
    int kind;
    size_t n;
    uint64_t ids[MAX_JOB];
    int64_t rows[MAX_JOB];
    int seen;                 /* times a poller reported it */
    tier_job_result_t result; /* as reported */
};

struct thread_state {
    int index;
    uint64_t rng;
    unsigned char busy[ROWS_PER_THREAD];
    size_t outstanding[MAX_OUTSTANDING]; /* sequence numbers */
    size_t num_outstanding;
    size_t next_seq;
    /* What this thread saw through the API. */
    uint64_t stores, loads, oversize, lookups, clears;
    uint64_t stores_ok, stores_no_space, loads_ok, loads_not_found;
    uint64_t bytes_stored, bytes_loaded;
};

static tier_t *g_tier;
static uint8_t *g_primary;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* [thread][seq]; thread THREADS is main. Guarded by g_lock. */
static struct job g_jobs[THREADS + 1][MAX_SEQ];

static uint64_t job_id(int thread, size_t seq) {
    return ((uint64_t)(thread + 1) << 40) | (uint64_t)seq;
}

static uint64_t next_rand(struct thread_state *t) {
    t->rng += 0x9e3779b97f4a7c15ull;
    return tu_mix64(t->rng);
}

static uint8_t *row_ptr(int64_t row) {
    return g_primary + (size_t)row * BLOCK;
}

/* Records polled results; any thread may have polled any job. */
static void record(const tier_job_result_t *r, size_t n) {
    size_t i;
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < n; i++) {
        uint64_t thread = (r[i].job_id >> 40) - 1;
        uint64_t seq = r[i].job_id & ((1ull << 40) - 1);
        struct job *job;
        if ((r[i].job_id >> 40) == 0 || thread > THREADS || seq >= MAX_SEQ ||
            g_jobs[thread][seq].kind == KIND_NONE) {
            fprintf(stderr, "result for job %llx, which was never submitted\n",
                    (unsigned long long)r[i].job_id);
            exit(1);
        }
        job = &g_jobs[thread][seq];
        job->seen++;
        if (job->seen != 1) {
            fprintf(stderr, "job %llx reported %d times\n", (unsigned long long)r[i].job_id,
                    job->seen);
            exit(1);
        }
        job->result = r[i];
    }
    pthread_mutex_unlock(&g_lock);
}

static size_t poll_some(size_t cap) {
    tier_job_result_t r[16];
    size_t n = 0;
    CHECK(cap >= 1 && cap <= 16);
    CHECK_OK(tier_poll_finished(g_tier, r, sizeof(tier_job_result_t), cap, &n));
    CHECK(n <= cap);
    record(r, n);
    return n;
}

/* Checks a finished job of this thread against what it submitted and frees its rows. */
static void verify(struct thread_state *t, const struct job *job, const tier_job_result_t *r) {
    size_t j;
    CHECK(r->num_blocks == job->n);
    CHECK(r->num_done <= r->num_blocks);
    switch (job->kind) {
    case KIND_STORE:
        CHECK(r->kind == TIER_JOB_STORE);
        CHECK(r->status == TIER_OK || r->status == TIER_ERR_NO_SPACE);
        CHECK(r->bytes % BLOCK == 0 && r->bytes <= job->n * BLOCK);
        if (r->status == TIER_OK) {
            /* All present at completion, unless a clear or an eviction of a
             * key it found present raced it. */
            CHECK(r->num_done <= job->n);
            t->stores_ok++;
        } else {
            CHECK(r->bytes == 0);
            t->stores_no_space++;
        }
        t->bytes_stored += r->bytes;
        break;
    case KIND_OVERSIZE:
        CHECK(r->kind == TIER_JOB_STORE);
        CHECK_STATUS(r->status, TIER_ERR_NO_SPACE);
        CHECK(r->num_done == 0 && r->bytes == 0);
        t->stores_no_space++;
        return;
    case KIND_LOAD:
        CHECK(r->kind == TIER_JOB_LOAD);
        CHECK(r->status == TIER_OK || r->status == TIER_ERR_NOT_FOUND);
        CHECK(r->status != TIER_OK || r->num_done == job->n);
        CHECK(r->status == TIER_OK || r->num_done < job->n);
        CHECK(r->bytes == r->num_done * BLOCK);
        for (j = 0; j < r->num_done; j++) {
            long at = tu_mismatch(row_ptr(job->rows[j]), BLOCK, job->ids[j]);
            if (at != -1) {
                fprintf(stderr, "thread %d: load of key %llx into row %lld differs at byte %ld\n",
                        t->index, (unsigned long long)job->ids[j], (long long)job->rows[j], at);
            }
            CHECK(at == -1);
        }
        if (r->status == TIER_OK) {
            t->loads_ok++;
        } else {
            t->loads_not_found++;
        }
        t->bytes_loaded += r->bytes;
        break;
    default:
        CHECK(0);
    }
    for (j = 0; j < job->n; j++) {
        size_t local = (size_t)job->rows[j] - (size_t)t->index * ROWS_PER_THREAD;
        CHECK(local < ROWS_PER_THREAD && t->busy[local]);
        t->busy[local] = 0;
    }
}

/* Verifies and releases this thread's jobs that some thread has polled. */
static void reap(struct thread_state *t) {
    size_t i = 0;
    while (i < t->num_outstanding) {
        size_t seq = t->outstanding[i];
        struct job job;
        pthread_mutex_lock(&g_lock);
        job = g_jobs[t->index][seq];
        pthread_mutex_unlock(&g_lock);
        if (job.seen == 0) {
            i++;
            continue;
        }
        verify(t, &job, &job.result);
        t->outstanding[i] = t->outstanding[--t->num_outstanding];
    }
}

static uint64_t pick_key(struct thread_state *t, uint64_t r) {
    if (r & 1) {
        return (r >> 1) % SHARED_KEYS + 1;
    }
    return ((uint64_t)(t->index + 1) << 20) | ((r >> 1) % OWN_KEYS);
}

/* Claims n free rows of this thread; 0 if there are not enough. */
static int claim_rows(struct thread_state *t, int64_t *rows, size_t n) {
    size_t i, found = 0;
    for (i = 0; i < ROWS_PER_THREAD && found < n; i++) {
        if (!t->busy[i]) {
            rows[found++] = (int64_t)(t->index * ROWS_PER_THREAD + i);
        }
    }
    if (found < n) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        t->busy[(size_t)rows[i] - (size_t)t->index * ROWS_PER_THREAD] = 1;
    }
    return 1;
}

static void submit(struct thread_state *t, int kind, size_t n, const uint64_t *ids,
                   const int64_t *rows) {
    uint8_t keys[SPARE_ROWS * KEY_LEN];
    size_t seq = t->next_seq++;
    struct job *job = &g_jobs[t->index][seq];
    tier_status_t s;
    CHECK(seq < MAX_SEQ && n <= SPARE_ROWS);
    tu_keys(keys, KEY_LEN, ids, n);
    /* Registered before the submit: the result may be polled before it returns. */
    pthread_mutex_lock(&g_lock);
    job->kind = kind;
    job->n = n;
    if (n <= MAX_JOB) {
        memcpy(job->ids, ids, n * sizeof ids[0]);
        memcpy(job->rows, rows, n * sizeof rows[0]);
    }
    pthread_mutex_unlock(&g_lock);
    if (kind == KIND_LOAD) {
        s = tier_submit_load(g_tier, job_id(t->index, seq), keys, KEY_LEN, rows, n);
        t->loads++;
    } else {
        s = tier_submit_store(g_tier, job_id(t->index, seq), keys, KEY_LEN, rows, n);
        t->stores++;
    }
    CHECK_OK(s);
    CHECK(t->num_outstanding < MAX_OUTSTANDING);
    t->outstanding[t->num_outstanding++] = seq;
}

static void do_store(struct thread_state *t, uint64_t r) {
    uint64_t ids[MAX_JOB];
    int64_t rows[MAX_JOB];
    size_t n = 1 + (size_t)(r % MAX_JOB), j;
    if (!claim_rows(t, rows, n)) {
        return;
    }
    for (j = 0; j < n; j++) {
        ids[j] = pick_key(t, next_rand(t));
        tu_fill(row_ptr(rows[j]), BLOCK, ids[j]);
    }
    submit(t, KIND_STORE, n, ids, rows);
}

static void do_load(struct thread_state *t, uint64_t r) {
    uint64_t ids[MAX_JOB];
    int64_t rows[MAX_JOB];
    /* Shorter than stores, so that a good share finds all its keys. */
    size_t n = 1 + (size_t)(r % (MAX_JOB / 2)), j;
    if (!claim_rows(t, rows, n)) {
        return;
    }
    for (j = 0; j < n; j++) {
        ids[j] = pick_key(t, next_rand(t));
        memset(row_ptr(rows[j]), 0xEE, BLOCK);
    }
    submit(t, KIND_LOAD, n, ids, rows);
}

/* More new keys than the whole capacity: always NO_SPACE. */
static void do_oversize(struct thread_state *t) {
    uint64_t ids[SPARE_ROWS];
    int64_t rows[SPARE_ROWS];
    size_t j;
    for (j = 0; j < SPARE_ROWS; j++) {
        ids[j] = ((uint64_t)(t->index + 1) << 20) | (1u << 16) | (t->oversize << 8) | j;
        rows[j] = (int64_t)(THREADS * ROWS_PER_THREAD + j);
    }
    t->oversize++;
    submit(t, KIND_OVERSIZE, SPARE_ROWS, ids, rows);
}

static void do_lookup_or_touch(struct thread_state *t, uint64_t r, int lookup) {
    uint64_t ids[MAX_JOB];
    uint8_t keys[MAX_JOB * KEY_LEN];
    uint8_t states[MAX_JOB];
    size_t n = 1 + (size_t)(r % MAX_JOB), j;
    for (j = 0; j < n; j++) {
        ids[j] = pick_key(t, next_rand(t));
    }
    tu_keys(keys, KEY_LEN, ids, n);
    if (!lookup) {
        CHECK_OK(tier_touch(g_tier, keys, KEY_LEN, n));
        return;
    }
    memset(states, 0xAB, sizeof states);
    CHECK_OK(tier_lookup(g_tier, keys, KEY_LEN, n, states));
    for (j = 0; j < n; j++) {
        CHECK(states[j] == TIER_MISS || states[j] == TIER_HIT || states[j] == TIER_PENDING);
    }
    t->lookups += n;
}

static void *worker(void *arg) {
    struct thread_state *t = (struct thread_state *)arg;
    size_t op;
    for (op = 0; op < OPS; op++) {
        uint64_t r = next_rand(t);
        unsigned choice = (unsigned)(r % 1000);
        reap(t);
        if (t->num_outstanding == MAX_OUTSTANDING) {
            tier_status_t w = tier_wait(g_tier, 1);
            CHECK(w == TIER_OK || w == TIER_TIMEOUT);
            poll_some(16);
            continue;
        }
        r >>= 10;
        if (choice < 300) {
            do_store(t, r);
        } else if (choice < 550) {
            do_load(t, r);
        } else if (choice < 700) {
            do_lookup_or_touch(t, r, 1);
        } else if (choice < 800) {
            do_lookup_or_touch(t, r, 0);
        } else if (choice < 920) {
            poll_some(1 + (size_t)(r % 16));
        } else if (choice < 960) {
            tier_status_t w = tier_wait(g_tier, 1);
            CHECK(w == TIER_OK || w == TIER_TIMEOUT);
        } else if (choice < 985) {
            tier_stats_t st = tu_stats(g_tier);
            CHECK(st.used_bytes <= st.capacity_bytes);
            CHECK(st.num_blocks <= st.capacity_blocks);
        } else if (choice < 998) {
            do_oversize(t);
        } else if (t->index == 0) {
            CHECK_OK(tier_clear(g_tier));
            t->clears++;
        }
    }
    /* Jobs still in flight are left to main's drain. */
    return NULL;
}

int main(void) {
    pthread_t threads[THREADS];
    struct thread_state *state =
        (struct thread_state *)calloc(THREADS, sizeof(struct thread_state));
    struct thread_state sum;
    tier_job_result_t rest[4];
    tier_stats_t st;
    size_t i, seq, accepted = 0;
    const char *seed_env = getenv("KVTIER_TEST_SEED");
    uint64_t seed = seed_env != NULL ? strtoull(seed_env, NULL, 0) : (uint64_t)tu_now_ns();

    tu_start("test_threads");
    printf("test_threads: seed %llu (set KVTIER_TEST_SEED to repeat)\n", (unsigned long long)seed);
    fflush(stdout);
    CHECK(state != NULL);
    g_primary = tu_alloc_rows(TOTAL_ROWS, BLOCK);
    {
        char capacity[32];
        snprintf(capacity, sizeof capacity, "%zu", CAPACITY_BLOCKS * BLOCK);
        g_tier = tu_new_tier(g_primary, TOTAL_ROWS * BLOCK, BLOCK, capacity, 0);
    }

    for (i = 0; i < THREADS; i++) {
        state[i].index = (int)i;
        state[i].rng = tu_mix64(seed + i);
        CHECK(pthread_create(&threads[i], NULL, worker, &state[i]) == 0);
    }
    for (i = 0; i < THREADS; i++) {
        CHECK(pthread_join(threads[i], NULL) == 0);
    }

    /* Drain, poll the rest, and check the jobs the threads left behind. */
    CHECK_OK(tier_drain(g_tier));
    {
        size_t left = 0, got;
        while ((got = poll_some(16)) > 0) {
            left += got;
        }
        printf("test_threads: %zu results polled after the final drain\n", left);
    }
    CHECK(tu_drain_poll(g_tier, rest, 4) == 0);
    for (i = 0; i < THREADS; i++) {
        reap(&state[i]);
    }

    memset(&sum, 0, sizeof sum);
    for (i = 0; i < THREADS; i++) {
        const struct thread_state *t = &state[i];
        CHECK(t->num_outstanding == 0);
        sum.stores += t->stores;
        sum.loads += t->loads;
        sum.oversize += t->oversize;
        sum.lookups += t->lookups;
        sum.clears += t->clears;
        sum.stores_ok += t->stores_ok;
        sum.stores_no_space += t->stores_no_space;
        sum.loads_ok += t->loads_ok;
        sum.loads_not_found += t->loads_not_found;
        sum.bytes_stored += t->bytes_stored;
        sum.bytes_loaded += t->bytes_loaded;
        for (seq = 0; seq < MAX_SEQ; seq++) {
            const struct job *job = &g_jobs[i][seq];
            if (job->kind != KIND_NONE) {
                accepted++;
                if (job->seen != 1) {
                    fprintf(stderr, "job %llx reported %d times\n",
                            (unsigned long long)job_id((int)i, seq), job->seen);
                }
                CHECK(job->seen == 1);
            }
        }
    }
    CHECK(accepted == sum.stores + sum.loads);

    st = tu_stats(g_tier);
    printf("test_threads: %zu jobs (%llu stores: %llu ok, %llu NO_SPACE of which %llu oversized; "
           "%llu loads: %llu ok, %llu NOT_FOUND), %llu evictions, %llu clears\n",
           accepted, (unsigned long long)sum.stores, (unsigned long long)sum.stores_ok,
           (unsigned long long)sum.stores_no_space, (unsigned long long)sum.oversize,
           (unsigned long long)sum.loads, (unsigned long long)sum.loads_ok,
           (unsigned long long)sum.loads_not_found, (unsigned long long)st.evictions,
           (unsigned long long)sum.clears);
    CHECK(st.stores_ok + st.stores_failed == sum.stores);
    CHECK(st.loads_ok + st.loads_failed == sum.loads);
    CHECK(st.stores_ok == sum.stores_ok && st.stores_failed == sum.stores_no_space);
    CHECK(st.loads_ok == sum.loads_ok && st.loads_failed == sum.loads_not_found);
    CHECK(st.bytes_stored == sum.bytes_stored && st.bytes_loaded == sum.bytes_loaded);
    CHECK(st.lookups == sum.lookups);
    CHECK(st.hits + st.misses + st.lookups_pending == st.lookups);
    CHECK(st.jobs_in_flight == 0 && st.results_queued == 0);
    CHECK(st.used_bytes == st.num_blocks * BLOCK);
    CHECK(st.num_blocks <= CAPACITY_BLOCKS);
    CHECK(st.evictions > 0);
    CHECK(sum.stores_no_space >= sum.oversize && sum.oversize > 0);

    /* Quiet now: whatever is stored still holds its key's bytes. */
    {
        uint64_t ids[THREADS * OWN_KEYS + SHARED_KEYS];
        uint8_t key[KEY_LEN];
        size_t n = 0, hits = 0;
        for (i = 0; i < SHARED_KEYS; i++) {
            ids[n++] = i + 1;
        }
        for (i = 0; i < THREADS * OWN_KEYS; i++) {
            ids[n++] = ((uint64_t)(i / OWN_KEYS + 1) << 20) | (i % OWN_KEYS);
        }
        for (i = 0; i < n; i++) {
            uint8_t state_i = 0;
            tu_key(key, KEY_LEN, ids[i]);
            CHECK_OK(tier_lookup(g_tier, key, KEY_LEN, 1, &state_i));
            CHECK(state_i == TIER_HIT || state_i == TIER_MISS);
            if (state_i == TIER_HIT) {
                int64_t row = 0;
                tier_job_result_t r;
                memset(row_ptr(row), 0, BLOCK);
                r = tu_load(g_tier, job_id(THREADS, hits), KEY_LEN, &ids[i], &row, 1);
                CHECK_STATUS(r.status, TIER_OK);
                CHECK(tu_mismatch(row_ptr(row), BLOCK, ids[i]) == -1);
                hits++;
            }
        }
        CHECK(hits == st.num_blocks);
    }

    tier_free(g_tier);
    free(g_primary);
    free(state);
    printf("test_threads: ok\n");
    return 0;
}
