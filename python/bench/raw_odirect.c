/* The raw bound of bench_disk_vs_fs.py: one O_DIRECT file per row, written
 * (open, pwrite, close) or read back (open, pread, close) by `threads` POSIX
 * threads taking rows in turn; no checksum, no header, no rename. Files
 * spread over 256 subdirectories `<dir>/<i % 256>/`, which the caller made
 * (one directory would serialise the creates on its lock, as no tier does).
 * And the same reads of files another writer made (`raw_read_files`: kvtier's
 * own block files, header and payload), to tell the tier's code from its
 * files. Built by the script with `cc -O2 -shared -fPIC -pthread` and called
 * through ctypes (which releases the GIL). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct pass {
    const char *dir;
    char *base;
    size_t row_bytes;
    const long *rows;
    size_t n;
    int load;
    /* raw_read_files: the files, and the header read before each payload. */
    const char *const *paths;
    size_t header;
    atomic_size_t next;
    atomic_int error;
};

struct span {
    struct pass *p;
    struct timespec start, end;
};

static void *worker(void *arg) {
    struct span *s = arg;
    struct pass *p = s->p;
    char path[4096];
    void *header = NULL;
    if (p->header && posix_memalign(&header, 4096, p->header) != 0) {
        atomic_store(&p->error, ENOMEM);
        return NULL;
    }
    clock_gettime(CLOCK_MONOTONIC, &s->start);
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n || atomic_load(&p->error)) break;
        char *row = p->base + (size_t)p->rows[i] * p->row_bytes;
        if (p->paths) {
            int fd = open(p->paths[i], O_RDONLY | O_DIRECT | O_CLOEXEC);
            if (fd < 0) {
                atomic_store(&p->error, errno);
                break;
            }
            struct iovec iov[2] = {{header, p->header}, {row, p->row_bytes}};
            ssize_t done = preadv(fd, iov, 2, 0);
            if (done != (ssize_t)(p->header + p->row_bytes))
                atomic_store(&p->error, done < 0 ? errno : EIO);
            close(fd);
            continue;
        }
        snprintf(path, sizeof path, "%s/%zu/raw-%zu.bin", p->dir, i % 256, i);
        int fd = p->load ? open(path, O_RDONLY | O_DIRECT | O_CLOEXEC)
                         : open(path, O_CREAT | O_WRONLY | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
        if (fd < 0) {
            atomic_store(&p->error, errno);
            break;
        }
        ssize_t done = p->load ? pread(fd, row, p->row_bytes, 0) : pwrite(fd, row, p->row_bytes, 0);
        if (done != (ssize_t)p->row_bytes) atomic_store(&p->error, done < 0 ? errno : EIO);
        close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &s->end);
    free(header);
    return NULL;
}

static double secs(struct timespec t) { return t.tv_sec + t.tv_nsec * 1e-9; }

static double run(struct pass *p, int threads);

/* Seconds from the first thread's start to the last one's end, or -errno. */
double raw_pass(const char *dir, char *base, size_t row_bytes, const long *rows, size_t n,
                int threads, int load) {
    struct pass p = {dir, base, row_bytes, rows, n, load, NULL, 0, 0, 0};
    return run(&p, threads);
}

/* Reads `paths[i]` (a header of `header` bytes, then the payload) into row
 * `rows[i]`, in one preadv, O_DIRECT; seconds as raw_pass, or -errno. */
double raw_read_files(const char *const *paths, size_t header, char *base, size_t row_bytes,
                      const long *rows, size_t n, int threads) {
    struct pass p = {NULL, base, row_bytes, rows, n, 1, paths, header, 0, 0};
    return run(&p, threads);
}

static double run(struct pass *p, int threads) {
    pthread_t th[256];
    struct span spans[256];
    if (threads < 1 || threads > 256) return -EINVAL;
    for (int t = 0; t < threads; t++) {
        spans[t].p = p;
        if (pthread_create(&th[t], NULL, worker, &spans[t]) != 0) return -EAGAIN;
    }
    double first = 1e300, last = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        if (secs(spans[t].start) < first) first = secs(spans[t].start);
        if (secs(spans[t].end) > last) last = secs(spans[t].end);
    }
    if (atomic_load(&p->error)) return -atomic_load(&p->error);
    return last - first;
}
