/*
 * A scratch library for the ABI check's own test (abi_check_catches_changes):
 * one struct written into caller memory and one function, built four ways by
 * SCRATCH_LAYOUT: 0 the baseline, 1 a field inserted in the middle (must fail
 * the check), 2 a field appended (must pass it, as kvtier's size protocol
 * makes an appended field compatible), 3 a function added (must pass; and
 * against 3 as the baseline, 0 removes a function and must fail).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct scratch_stats_t {
    uint64_t first;
#if SCRATCH_LAYOUT == 1
    uint64_t inserted;
#endif
    uint64_t second;
    uint32_t third;
    uint32_t fourth;
#if SCRATCH_LAYOUT == 2
    uint64_t appended;
#endif
} scratch_stats_t;

int tier_scratch_stats(scratch_stats_t *out, size_t out_size) {
    scratch_stats_t s;
    memset(&s, 0, sizeof s);
    s.first = 1;
    memcpy(out, &s, out_size < sizeof s ? out_size : sizeof s);
    return 0;
}

#if SCRATCH_LAYOUT == 3
int tier_scratch_added(void) {
    return 2;
}
#endif
