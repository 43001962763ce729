/*
 * kvtier loaded the way a plugin host loads it: no link-time dependency, a
 * dlopen() of the soname (libkvtier.so.<TIER_ABI_VERSION> of the header)
 * from the installed tree, every function of kvtier.h resolved with dlsym()
 * into a table, the library's ABI (tier_abi_info, before any other call) and
 * version checked against the header's, a store
 * and load round trip through the table, dlclose(), and the same again after
 * a second dlopen().
 *
 * The table is generated from the header (kvtier_exports.h, written by CMake
 * from include/kvtier.h), so a new export is resolved here without editing
 * this file; each entry has the type of the header's prototype, so a call
 * through it is type-checked. check_exports.cmake checks the other direction:
 * the library exports nothing the header does not declare.
 *
 * Usage: dlopen_host <directory the library must be loaded from>
 * (the test sets LD_LIBRARY_PATH to the installed lib directory).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* dladdr */
#endif

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "kvtier_exports.h" /* KVTIER_EXPORTS(X): X(name) for each function of kvtier.h */

#define KEY_LEN 16
#define BLOCK 4096
#define BLOCKS 4

#ifdef __cplusplus
#define KVTIER_FN(name) decltype(&name)
#else
#define KVTIER_FN(name) __typeof__(&name)
#endif

/* One typed pointer per exported function, named after it. */
struct kvtier_api {
#define KVTIER_FIELD(name) KVTIER_FN(name) name;
    KVTIER_EXPORTS(KVTIER_FIELD)
#undef KVTIER_FIELD
};

#define KVTIER_ONE(name) +1
enum { EXPORT_COUNT = 0 KVTIER_EXPORTS(KVTIER_ONE) };
#undef KVTIER_ONE

/* dlsym returns void *; a function pointer is copied out of it byte for byte
 * (POSIX guarantees the representations agree). */
typedef char function_pointer_is_pointer_sized[sizeof(void *) == sizeof(void (*)(void)) ? 1 : -1];

static int failures = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                          \
            return;                                                              \
        }                                                                        \
    } while (0)

/* Resolves every function; returns how many are missing. */
static int resolve(void *lib, struct kvtier_api *api) {
    int missing = 0;
    void *sym;
#define KVTIER_RESOLVE(name)                                                 \
    sym = dlsym(lib, #name);                                                 \
    if (sym == NULL) {                                                       \
        fprintf(stderr, "dlsym(%s): %s\n", #name, dlerror());                \
        missing++;                                                           \
    }                                                                        \
    memcpy(&api->name, &sym, sizeof sym);
    KVTIER_EXPORTS(KVTIER_RESOLVE)
#undef KVTIER_RESOLVE
    return missing;
}

/* The library was loaded from `want_dir`, not from anywhere else. */
static void check_loaded_from(const struct kvtier_api *api, const char *want_dir) {
    Dl_info info;
    void *fn;
    char got[PATH_MAX], want[PATH_MAX];
    char *slash;
    memcpy(&fn, &api->tier_version, sizeof fn);
    CHECK(dladdr(fn, &info) != 0 && info.dli_fname != NULL);
    CHECK(realpath(info.dli_fname, got) != NULL);
    CHECK(realpath(want_dir, want) != NULL);
    slash = strrchr(got, '/');
    CHECK(slash != NULL);
    *slash = '\0';
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "loaded %s from %s, expected %s\n", info.dli_fname, got, want);
    }
    CHECK(strcmp(got, want) == 0);
}

/* What a host checks before any other call: the ABI and the struct sizes. */
static void check_abi(const struct kvtier_api *api) {
    tier_abi_info_t info;
    memset(&info, 0, sizeof info);
    CHECK(api->tier_abi_info(&info, sizeof info) == TIER_OK);
    CHECK(info.abi_version == TIER_ABI_VERSION);
    CHECK(info.abi_info_size == sizeof(tier_abi_info_t));
    CHECK(info.stats_size == sizeof(tier_stats_t));
    CHECK(info.job_result_size == sizeof(tier_job_result_t));
    CHECK(info.event_size == sizeof(tier_event_t));
}

static void check_version(const struct kvtier_api *api) {
    int major = -1, minor = -1, patch = -1;
    const char *v = api->tier_version();
    CHECK(v != NULL);
    CHECK(strcmp(v, KVTIER_VERSION_STRING) == 0);
    CHECK(sscanf(v, "%d.%d.%d", &major, &minor, &patch) == 3);
    CHECK(major == KVTIER_VERSION_MAJOR && minor == KVTIER_VERSION_MINOR &&
          patch == KVTIER_VERSION_PATCH);
    CHECK(strcmp(api->tier_status_str(TIER_ERR_NO_SPACE), "TIER_ERR_NO_SPACE") == 0);
}

/* Waits for and returns job `id`'s result through the table. */
static tier_job_result_t finish(const struct kvtier_api *api, tier_t *tier, uint64_t id) {
    tier_job_result_t r;
    size_t n = 0;
    memset(&r, 0, sizeof r);
    r.status = TIER_ERR_IO;
    if (api->tier_drain(tier) == TIER_OK &&
        api->tier_poll_finished(tier, &r, sizeof r, 1, &n) == TIER_OK && n == 1 &&
        r.job_id == id) {
        return r;
    }
    fprintf(stderr, "no result for job %llu\n", (unsigned long long)id);
    r.status = TIER_ERR_IO;
    return r;
}

/* Stores BLOCKS rows and loads them into the other rows, through the table. */
static void round_trip(const struct kvtier_api *api, uint8_t seed) {
    uint8_t *rows = (uint8_t *)calloc(2 * BLOCKS, BLOCK);
    uint8_t keys[BLOCKS * KEY_LEN];
    int64_t src[BLOCKS], dst[BLOCKS];
    tier_config_t *cfg;
    tier_t *tier = NULL;
    tier_stats_t stats;
    tier_job_result_t r;
    size_t i;
    int ok = 1;

    CHECK(rows != NULL);
    for (i = 0; i < BLOCKS; i++) {
        memset(keys + i * KEY_LEN, (int)(seed + i), KEY_LEN);
        memset(rows + i * BLOCK, (int)(seed * 16 + i + 1), BLOCK);
        src[i] = (int64_t)i;
        dst[i] = (int64_t)(BLOCKS + i);
    }
    cfg = api->tier_config_new();
    if (cfg == NULL || api->tier_config_set(cfg, "capacity_bytes", "1MiB") != TIER_OK ||
        api->tier_new(cfg, rows, 2 * BLOCKS * BLOCK, BLOCK, &tier) != TIER_OK) {
        char msg[256];
        api->tier_last_error(msg, sizeof msg);
        fprintf(stderr, "creating a tier failed: %s\n", msg);
        ok = 0;
    }
    api->tier_config_free(cfg);
    if (ok) {
        ok = api->tier_submit_store(tier, 1, keys, KEY_LEN, src, BLOCKS) == TIER_OK &&
             finish(api, tier, 1).status == TIER_OK;
    }
    if (ok) {
        ok = api->tier_submit_load(tier, 2, keys, KEY_LEN, dst, BLOCKS) == TIER_OK;
        r = finish(api, tier, 2);
        ok = ok && r.status == TIER_OK && r.num_done == BLOCKS && r.bytes == BLOCKS * BLOCK;
    }
    if (ok) {
        ok = memcmp(rows, rows + BLOCKS * BLOCK, BLOCKS * BLOCK) == 0;
        ok = ok && api->tier_stats(tier, &stats,
                                   sizeof(tier_stats_t)) == TIER_OK && stats.stores_ok == 1 &&
             stats.loads_ok == 1 && stats.num_blocks == BLOCKS;
        ok = ok && api->tier_metrics(tier, NULL, 0) > 0;
    }
    api->tier_free(tier);
    free(rows);
    CHECK(ok);
}

/* One plugin load: dlopen by soname, resolve, check, round trip, dlclose. */
static void load_and_use(const char *soname, const char *want_dir, int round) {
    struct kvtier_api api;
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", soname, dlerror());
    }
    CHECK(lib != NULL);
    memset(&api, 0, sizeof api);
    CHECK(resolve(lib, &api) == 0);
    check_abi(&api);
    check_loaded_from(&api, want_dir);
    check_version(&api);
    round_trip(&api, (uint8_t)(round * 8));
    CHECK(dlclose(lib) == 0);
}

int main(int argc, char **argv) {
    char soname[64];
    void *still;
    if (argc != 2) {
        fprintf(stderr, "usage: %s <directory the library must be loaded from>\n", argv[0]);
        return 2;
    }
    /* The name a host derives from the header it was built with. */
    snprintf(soname, sizeof soname, "libkvtier.so.%d", TIER_ABI_VERSION);
    if (EXPORT_COUNT < 20) {
        fprintf(stderr, "only %d functions in kvtier_exports.h\n", (int)EXPORT_COUNT);
        return 1;
    }

    load_and_use(soname, argv[1], 1);
    /* Whether dlclose unloaded it: glibc keeps a library whose thread-local
     * destructors are still registered on a live thread, which is fine; the
     * second load must work either way. */
    still = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    printf("dlopen_host: after dlclose the library is %s\n", still ? "still mapped" : "unloaded");
    if (still != NULL) {
        dlclose(still);
    }
    load_and_use(soname, argv[1], 2);

    if (failures == 0) {
        printf("dlopen_host: %s from %s: %d functions resolved, version %s, round trip, dlclose, "
               "and again: ok\n",
               soname, argv[1], (int)EXPORT_COUNT, KVTIER_VERSION_STRING);
    }
    return failures == 0 ? 0 : 1;
}
