/*
 * Link-time stand-in for the 0.1.0 library (soname libkvtier.so.0), so
 * old_app records DT_NEEDED libkvtier.so.0 as a program built then did. It
 * is never loaded at run time: the test runs old_app against today's
 * library only.
 */
#include "kvtier.h"

const char *tier_version(void) { return "stub"; }
tier_status_t tier_new(const tier_config_t *c, void *p, size_t l, size_t b, tier_t **o) {
    (void)c, (void)p, (void)l, (void)b, (void)o;
    return TIER_ERR_IO;
}
void tier_free(tier_t *t) { (void)t; }
tier_status_t tier_submit_store(tier_t *t, uint64_t j, const uint8_t *k, size_t kl, const int64_t *b,
                                size_t n) {
    (void)t, (void)j, (void)k, (void)kl, (void)b, (void)n;
    return TIER_ERR_IO;
}
tier_status_t tier_drain(tier_t *t) { (void)t; return TIER_ERR_IO; }
tier_status_t tier_poll_finished(tier_t *t, tier_job_result_t *o, size_t c, size_t *n) {
    (void)t, (void)o, (void)c, (void)n;
    return TIER_ERR_IO;
}
tier_status_t tier_stats(tier_t *t, tier_stats_t *o) { (void)t, (void)o; return TIER_ERR_IO; }
