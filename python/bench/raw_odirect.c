/* The raw bound of bench_disk_vs_fs.py: one O_DIRECT file per row, written
 * (open, pwrite, close) or read back (open, pread, close) by `threads` POSIX
 * threads taking rows in turn; no checksum, no header, no rename. Files
 * spread over 256 subdirectories `<dir>/<i % 256>/`, which the caller made
 * (one directory would serialise the creates on its lock, as no tier does).
 * And the same reads of files another writer made (`raw_read_files`: kvtier's
 * own block files, header and payload), to tell the tier's code from its
 * files. And the same writes published as kvtier publishes a block
 * (`raw_publish_pass`: a temporary name, a 56-byte `user.kvtier` attribute
 * where the file system takes one, then rename), to tell the tier's code
 * from its crash-safe publication. Built by the script with `cc -O2 -shared
 * -fPIC -pthread` and called through ctypes (which releases the GIL). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

struct pass {
    const char *dir;
    char *base;
    size_t row_bytes;
    const long *rows;
    size_t n;
    int load;
    /* raw_publish_pass: write under a temporary name, set the attribute,
     * rename into place. */
    int publish;
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

/* Writes `path` as kvtier's disk tier publishes a block (its header as
 * the file's attribute): 0 or an errno. The attribute's bytes are
 * arbitrary; a file system without user attributes gets none, as kvtier
 * then keeps its header in the file. */
static int publish(const char *path, const char *row, size_t row_bytes) {
    char tmp[4200];
    static const char header[56] = {'K', 'V', 'T', 'X'};
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    ssize_t done = pwrite(fd, row, row_bytes, 0);
    int error = done == (ssize_t)row_bytes ? 0 : done < 0 ? errno : EIO;
    if (!error && fsetxattr(fd, "user.kvtier", header, sizeof header, 0) != 0 &&
        errno != ENOTSUP)
        error = errno;
    close(fd);
    if (!error && rename(tmp, path) != 0) error = errno;
    return error;
}

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
        if (p->publish) {
            int error = publish(path, row, p->row_bytes);
            if (error) {
                atomic_store(&p->error, error);
                break;
            }
            continue;
        }
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
    struct pass p = {dir, base, row_bytes, rows, n, load, 0, NULL, 0, 0, 0};
    return run(&p, threads);
}

/* raw_pass's stores, each published as kvtier publishes a block. */
double raw_publish_pass(const char *dir, char *base, size_t row_bytes, const long *rows,
                        size_t n, int threads) {
    struct pass p = {dir, base, row_bytes, rows, n, 0, 1, NULL, 0, 0, 0};
    return run(&p, threads);
}

/* Reads `paths[i]` (a header of `header` bytes, then the payload) into row
 * `rows[i]`, in one preadv, O_DIRECT; seconds as raw_pass, or -errno. */
double raw_read_files(const char *const *paths, size_t header, char *base, size_t row_bytes,
                      const long *rows, size_t n, int threads) {
    struct pass p = {NULL, base, row_bytes, rows, n, 1, 0, paths, header, 0, 0};
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
