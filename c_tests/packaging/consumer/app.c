/*
 * The C version of app.cpp, for the pkg-config consumer test: stores four
 * blocks, loads them back into other rows through the C API, and compares
 * the bytes. Exits 1 on a mismatch or an error.
 */
#define _GNU_SOURCE 1 /* dladdr */
#include <dlfcn.h>

#include <kvtier.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK (64 * 1024)
#define BLOCKS 4
#define KEY_LEN 36

static int fail(const char *what, tier_status_t status) {
    char message[512];
    tier_last_error(message, sizeof message);
    fprintf(stderr, "%s: %s: %s\n", what, tier_status_str(status), message);
    return 1;
}

static int finish(tier_t *tier, uint64_t job_id) {
    tier_job_result_t result[2];
    size_t n = 0;
    tier_status_t status = tier_drain(tier);
    if (status == TIER_OK) {
        status = tier_poll_finished(tier, result, sizeof(tier_job_result_t), 2, &n);
    }
    if (status != TIER_OK) {
        return fail("tier_drain/tier_poll_finished", status);
    }
    if (n != 1 || result[0].job_id != job_id || result[0].status != TIER_OK || result[0].num_done != BLOCKS) {
        fprintf(stderr, "job %llu: %zu results, status %s\n", (unsigned long long)job_id, n,
                n > 0 ? tier_status_str(result[0].status) : "-");
        return 1;
    }
    return 0;
}

int main(void) {
    uint8_t *primary = (uint8_t *)calloc(2 * BLOCKS, BLOCK);
    uint8_t keys[BLOCKS * KEY_LEN];
    int64_t src[BLOCKS], dst[BLOCKS];
    tier_config_t *cfg = tier_config_new();
    tier_t *tier = NULL;
    tier_status_t status;
    Dl_info info;
    size_t b, i;
    int rc = 0;

    printf("kvtier library %s, header %s\n", tier_version(), KVTIER_VERSION_STRING);
#ifdef KVTIER_PACKAGE_VERSION
    if (strcmp(tier_version(), KVTIER_PACKAGE_VERSION) != 0 || strcmp(KVTIER_VERSION_STRING, KVTIER_PACKAGE_VERSION) != 0) {
        fprintf(stderr, "version mismatch: package %s\n", KVTIER_PACKAGE_VERSION);
        return 1;
    }
#endif
    memset(&info, 0, sizeof info);
    if (dladdr((const void *)tier_version(), &info) != 0 && info.dli_fname != NULL) {
        printf("kvtier library file: %s\n", info.dli_fname);
    }
    if (primary == NULL || cfg == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (b = 0; b < BLOCKS; b++) {
        for (i = 0; i < BLOCK; i++) {
            primary[b * BLOCK + i] = (uint8_t)((b + 1) * 131 + i * 7 + (i >> 10));
        }
        for (i = 0; i < KEY_LEN; i++) {
            keys[b * KEY_LEN + i] = (uint8_t)(b * 17 + i);
        }
        src[b] = (int64_t)b;
        dst[b] = (int64_t)(BLOCKS + b);
    }

    if ((status = tier_config_set(cfg, "capacity_bytes", "1MiB")) != TIER_OK) {
        return fail("tier_config_set", status);
    }
    status = tier_new(cfg, primary, 2 * BLOCKS * BLOCK, BLOCK, &tier);
    tier_config_free(cfg);
    if (status != TIER_OK) {
        return fail("tier_new", status);
    }

    if ((status = tier_submit_store(tier, 1, keys, KEY_LEN, src, BLOCKS)) != TIER_OK) {
        rc = fail("tier_submit_store", status);
    } else if ((rc = finish(tier, 1)) == 0) {
        if ((status = tier_submit_load(tier, 2, keys, KEY_LEN, dst, BLOCKS)) != TIER_OK) {
            rc = fail("tier_submit_load", status);
        } else {
            rc = finish(tier, 2);
        }
    }
    for (b = 0; rc == 0 && b < BLOCKS; b++) {
        if (memcmp(primary + b * BLOCK, primary + (BLOCKS + b) * BLOCK, BLOCK) != 0) {
            fprintf(stderr, "block %zu came back different\n", b);
            rc = 1;
        }
    }
    tier_free(tier);
    free(primary);
    if (rc == 0) {
        printf("round trip: %d blocks of %d bytes stored and loaded, byte-exact\n", BLOCKS, BLOCK);
    }
    return rc;
}
