/*
 * What an engine observes besides results: tier_metrics (the text-out
 * convention of tier_describe: length queries, truncation, NULL), the
 * completion descriptor of tier_completion_fd (readable while results wait,
 * reset by the poll that takes the last one, non-blocking, close-on-exec,
 * owned by the tier), the callers' own eventfds of tier_add_notify_fd
 * (one count per job of their kind, written after the result is queued),
 * and a result's io_ns.
 */
#include "test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define KEY_LEN 36
#define BLOCK 4096
#define ROWS 8

static const size_t kBlock = BLOCK;

/* 1 if fd is readable within timeout_ms. */
static int readable(int fd, int timeout_ms) {
    struct pollfd p;
    int n;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    n = poll(&p, 1, timeout_ms);
    CHECK(n >= 0);
    return n == 1 && (p.revents & POLLIN) != 0;
}

/* The metrics text, in a buffer the caller frees. */
static char *metrics_text(tier_t *tier, size_t *len) {
    size_t need = tier_metrics(tier, NULL, 0);
    char *text;
    CHECK(need > 0);
    /* Room to spare: counters may grow between the two calls. */
    text = (char *)malloc(need + 4096);
    CHECK(text != NULL);
    *len = tier_metrics(tier, text, need + 4096);
    CHECK(*len < need + 4096);
    CHECK(strlen(text) == *len);
    return text;
}

static void test_metrics_follow_the_text_out_convention(void) {
    uint8_t *rows = tu_alloc_rows(ROWS, kBlock);
    tier_t *tier = tu_new_tier(rows, ROWS * kBlock, kBlock, "1MiB", 2);
    uint64_t ids[2] = {1, 2};
    int64_t src[2] = {0, 1};
    char small[16];
    char *text;
    size_t len, full;

    /* NULL tier: 0, nothing written, and a message saying why. */
    memset(small, 'x', sizeof small);
    CHECK(tier_metrics(NULL, small, sizeof small) == 0);
    CHECK(small[0] == 'x');
    CHECK_ERROR(TIER_ERR_NULL_ARG, TIER_ERR_NULL_ARG, "tier_metrics", "tier is NULL");

    tu_store(tier, 1, KEY_LEN, ids, src, 2);

    /* Length queries: NULL buffer, or capacity 0 (nothing written). */
    full = tier_metrics(tier, NULL, 0);
    CHECK(full > 1000);
    CHECK(tier_metrics(tier, NULL, 100) == full);
    CHECK(tier_metrics(tier, small, 0) == full);
    CHECK(small[0] == 'x');

    /* Truncation: cap - 1 bytes and a NUL; the return value says how much more. */
    CHECK(tier_metrics(tier, small, sizeof small) == full);
    CHECK(strlen(small) == sizeof small - 1);
    CHECK(memcmp(small, "# HELP kvtier_", 14) == 0);
    CHECK(tier_metrics(tier, small, 1) == full);
    CHECK(small[0] == '\0');

    text = metrics_text(tier, &len);
    CHECK(len == full); /* nothing changed in between */
    CHECK(text[len - 1] == '\n');
    CHECK(strstr(text, "# TYPE kvtier_job_latency_seconds histogram\n") != NULL);
    CHECK(strstr(text, "# TYPE kvtier_jobs_total counter\n") != NULL);
    CHECK(strstr(text,
                 "\nkvtier_jobs_total{backend=\"memory\",kind=\"store\",outcome=\"ok\"} 1\n") != NULL);
    CHECK(strstr(text, "\nkvtier_block_io_seconds_count{backend=\"memory\",kind=\"store\"} 2\n") !=
          NULL);
    CHECK(strstr(text, "\nkvtier_transferred_bytes_total{backend=\"memory\",kind=\"store\"} 8192\n") !=
          NULL);
    free(text);

    tier_free(tier);
    free(rows);
}

static void test_completion_fd_is_readable_while_results_wait(void) {
    uint8_t *rows = tu_alloc_rows(ROWS, kBlock);
    tier_t *tier = tu_new_tier(rows, ROWS * kBlock, kBlock, "1MiB", 2);
    int wait_ms = (int)(10000 * tu_time_scale());
    uint8_t keys[3 * KEY_LEN];
    uint64_t ids[3] = {10, 11, 12};
    int64_t src[3] = {0, 1, 2};
    tier_job_result_t r[4];
    size_t n;
    int fd, i;

    CHECK_ERROR(tier_completion_fd(NULL), TIER_ERR_NULL_ARG, "tier_completion_fd", "tier is NULL");

    fd = tier_completion_fd(tier);
    CHECK(fd >= 0);
    CHECK(tier_completion_fd(tier) == fd);
    CHECK((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
    CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK(!readable(fd, 0));

    /* One job: readable once its result is queued, not after it is polled. */
    for (i = 0; i < 3; i++) {
        tu_fill(rows + (size_t)i * kBlock, kBlock, ids[i]);
    }
    tu_keys(keys, KEY_LEN, ids, 3);
    CHECK_OK(tier_submit_store(tier, 1, keys, KEY_LEN, src, 3));
    CHECK(readable(fd, wait_ms));
    CHECK_OK(tier_poll_finished(tier, r, sizeof(tier_job_result_t), 4, &n));
    CHECK(n == 1 && r[0].job_id == 1);
    CHECK_STATUS(r[0].status, TIER_OK);
    /* io_ns: part of the job's life, not empty for a job that copied. */
    CHECK(r[0].io_ns > 0 && r[0].io_ns <= r[0].elapsed_ns);
    CHECK(!readable(fd, 0));

    /* Two results, polled one at a time: readable until the last is taken. */
    CHECK_OK(tier_submit_store(tier, 2, NULL, KEY_LEN, NULL, 0));
    CHECK_OK(tier_submit_store(tier, 3, keys, KEY_LEN, src, 3)); /* all present: nothing copied */
    CHECK_OK(tier_drain(tier));
    CHECK(readable(fd, 0));
    CHECK_OK(tier_poll_finished(tier, r, sizeof(tier_job_result_t), 1, &n));
    CHECK(n == 1 && r[0].job_id == 2 && r[0].io_ns == 0);
    CHECK(readable(fd, 0));
    /* tier_wait neither consumes a result nor resets the descriptor. */
    CHECK_OK(tier_wait(tier, 0));
    CHECK(readable(fd, 0));
    CHECK_OK(tier_poll_finished(tier, r, sizeof(tier_job_result_t), 1, &n));
    CHECK(n == 1 && r[0].job_id == 3 && r[0].io_ns == 0 && r[0].bytes == 0);
    CHECK(!readable(fd, 0));

    /* The tier owns the descriptor: tier_free closes it. */
    tier_free(tier);
    CHECK(fcntl(fd, F_GETFD) == -1);
    free(rows);
}

/* The eventfd's count, read (and so reset) at once; 0 when it was at 0. */
static uint64_t take_count(int fd) {
    uint64_t count = 0;
    if (read(fd, &count, sizeof count) != (ssize_t)sizeof count) {
        return 0;
    }
    return count;
}

static void test_notify_fd_counts_the_jobs_of_its_kind(void) {
    uint8_t *rows = tu_alloc_rows(ROWS, kBlock);
    tier_t *tier = tu_new_tier(rows, ROWS * kBlock, kBlock, "1MiB", 2);
    int wait_ms = (int)(10000 * tu_time_scale());
    int loads = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int stores = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int pipe_fds[2];
    uint8_t keys[2 * KEY_LEN];
    uint64_t ids[2] = {20, 21};
    int64_t src[2] = {0, 1};
    int64_t dst[2] = {4, 5};
    tier_job_result_t r[4];
    size_t n;
    int i;

    CHECK(loads >= 0 && stores >= 0 && pipe(pipe_fds) == 0);
    CHECK_ERROR(tier_add_notify_fd(NULL, TIER_JOB_LOAD, loads), TIER_ERR_NULL_ARG,
                "tier_add_notify_fd", "tier");
    CHECK_ERROR(tier_add_notify_fd(tier, 9, loads), TIER_ERR_INVALID_ARG, "tier_add_notify_fd",
                "job_kind: 9");
    CHECK_ERROR(tier_add_notify_fd(tier, TIER_JOB_LOAD, -1), TIER_ERR_INVALID_ARG,
                "tier_add_notify_fd", "fd: -1");
    CHECK_ERROR(tier_add_notify_fd(tier, TIER_JOB_LOAD, pipe_fds[1]), TIER_ERR_INVALID_ARG,
                "tier_add_notify_fd", "not an eventfd");
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    /* A number not open is refused, never written later. */
    CHECK_ERROR(tier_add_notify_fd(tier, TIER_JOB_LOAD, 987654), TIER_ERR_INVALID_ARG,
                "tier_add_notify_fd", "not an open descriptor");

    CHECK_OK(tier_add_notify_fd(tier, TIER_JOB_LOAD, loads));
    CHECK_OK(tier_add_notify_fd(tier, TIER_JOB_STORE, stores));

    /* A store counts on the store descriptor only, after its result is queued. */
    for (i = 0; i < 2; i++) {
        tu_fill(rows + (size_t)i * kBlock, kBlock, ids[i]);
    }
    tu_keys(keys, KEY_LEN, ids, 2);
    CHECK_OK(tier_submit_store(tier, 1, keys, KEY_LEN, src, 2));
    CHECK(readable(stores, wait_ms));
    CHECK(take_count(stores) == 1);
    CHECK(!readable(loads, 0));
    CHECK_OK(tier_poll_finished(tier, r, sizeof(tier_job_result_t), 4, &n));
    CHECK(n == 1 && r[0].job_id == 1 && r[0].kind == TIER_JOB_STORE);

    /* Two loads: one count each on the load descriptor, both results queued. */
    CHECK_OK(tier_submit_load(tier, 2, keys, KEY_LEN, dst, 1));
    CHECK_OK(tier_submit_load(tier, 3, keys + KEY_LEN, KEY_LEN, dst + 1, 1));
    CHECK_OK(tier_drain(tier));
    CHECK(take_count(loads) == 2);
    CHECK(!readable(stores, 0));
    CHECK_OK(tier_poll_finished(tier, r, sizeof(tier_job_result_t), 4, &n));
    CHECK(n == 2 && r[0].kind == TIER_JOB_LOAD && r[1].kind == TIER_JOB_LOAD);
    CHECK_STATUS(r[0].status, TIER_OK);
    CHECK(memcmp(rows + 4 * kBlock, rows, 2 * kBlock) == 0);

    /* The caller may close its descriptor: the tier writes its own duplicate. */
    close(stores);
    CHECK_OK(tier_submit_store(tier, 4, NULL, KEY_LEN, NULL, 0));
    CHECK_OK(tier_drain(tier));
    CHECK_OK(tier_poll_finished(tier, r, sizeof(tier_job_result_t), 4, &n));
    CHECK(n == 1 && r[0].job_id == 4);
    CHECK(!readable(loads, 0));

    /* Sixteen descriptors at most. */
    for (i = 2; i < 16; i++) {
        CHECK_OK(tier_add_notify_fd(tier, TIER_JOB_DELETE, loads));
    }
    CHECK_ERROR(tier_add_notify_fd(tier, TIER_JOB_DELETE, loads), TIER_ERR_INVALID_ARG,
                "tier_add_notify_fd", "16");

    tier_free(tier);
    close(loads);
    free(rows);
}

int main(int argc, char **argv) {
    static const struct tu_subtest subtests[] = {
        TU_SUBTEST(metrics_follow_the_text_out_convention),
        TU_SUBTEST(completion_fd_is_readable_while_results_wait),
        TU_SUBTEST(notify_fd_counts_the_jobs_of_its_kind),
    };
    return tu_run_subtests("test_observe", argc, argv, subtests, TU_COUNT(subtests));
}
