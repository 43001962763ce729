//! The first-fill phase's report: each pass against the bound measured next
//! to it, as table rows and the `first_fill` JSON object.

use super::prefault::Results;
use crate::report::{num, Cmp, Report};
use crate::stats::{dist, max, median, min, paired_ratio};
use serde_json::json;

impl Results {
    /// Rows against the population bound and the bandwidth phase's memcpy
    /// median (`memcpy`), and the `first_fill` JSON object.
    pub fn report(&self, memcpy: f64, out: &mut Report) {
        let reps = self.cold_store.len();
        let bound = median(&self.populate_bound);
        let spread =
            |v: &[f64]| format!("median of {reps}; min {} max {}", num(min(v)), num(max(v)));
        out.line(
            "first fill",
            format!(
                "fresh tiers of {:.2} GiB, {} threads, {} per pass; arena page policy: {}",
                self.capacity as f64 / (1u64 << 30) as f64,
                self.threads,
                crate::report::gib(self.bytes),
                if self.huge_advice {
                    "MADV_HUGEPAGE (blocks >= 2 MiB)"
                } else {
                    "4 KiB pages (no advice)"
                }
            ),
        );
        out.row(
            format!(
                "populate fresh region, {} threads (fault bound)",
                self.threads
            ),
            bound,
            "GB/s",
            format!(
                "MADV_POPULATE_WRITE per block, tier's page policy; {}",
                spread(&self.populate_bound)
            ),
        );
        // A cold store moves three times the bytes population does (the
        // kernel zeroes each page, then the copy reads and writes it). Where
        // faults are slow (4 KiB pages, memory to compact, a busy host)
        // population dominates; where they are fast, the zeroing and the
        // copy share the cores the copying threads already fill, and their
        // times add. The raw first-touch copy is that same work without
        // kvtier: the bound the target is against. The ratios to population
        // and memcpy alone show which cost dominated on this machine.
        let touch = median(&self.first_touch_bound);
        out.row(
            format!(
                "first-touch memcpy into a fresh region, {} threads (cold-copy bound)",
                self.threads
            ),
            touch,
            "GB/s",
            format!(
                "tier's page policy, the copy faulting the pages in; {}x fault bound, {}x memcpy; {}",
                num(touch / bound),
                num(touch / memcpy),
                spread(&self.first_touch_bound)
            ),
        );
        let cold = median(&self.cold_store);
        out.row(
            "store, first pass, prefault=off",
            cold,
            "GB/s",
            format!(
                "{}x cold-copy bound (paired); {}x fault bound, {}x memcpy; {}",
                num(paired_ratio(&self.first_touch_bound, &self.cold_store)),
                num(cold / bound),
                num(cold / memcpy),
                spread(&self.cold_store)
            ),
        );
        // The cold fill an engine sees with the defaults (background) is the
        // target, against the first-touch copy measured next to each pass.
        // Its background population can run ahead of the stores only on a
        // core they leave idle.
        let background = median(&self.background_store_first);
        let over_touch = paired_ratio(&self.background_bound, &self.background_store_first);
        out.row(
            "store, first pass, prefault=background (default)",
            background,
            "GB/s",
            format!(
                "from tier_new; {}x cold-copy bound (paired: {} GB/s next to it); {}x fault bound, {}x memcpy; {}",
                num(over_touch),
                num(median(&self.background_bound)),
                num(background / bound),
                num(background / memcpy),
                spread(&self.background_store_first)
            ),
        )
        .target(
            "cold fill (defaults) >= 0.9x the raw first-touch copy",
            over_touch,
            Cmp::AtLeast,
            0.9,
        );
        let pop = median(&self.full_populate_s_per_gib);
        out.row(
            "prefault=full: tier_new to all resident",
            pop,
            "s/GiB",
            format!(
                "{} GB/s, one nice-19 thread; {}",
                num((1u64 << 30) as f64 / pop / 1e9),
                spread(&self.full_populate_s_per_gib)
            ),
        );
        let during = median(&self.full_store_during);
        out.row(
            "store, first pass, prefault=full, from tier_new",
            during,
            "GB/s",
            format!(
                "population in progress; {}x fault bound, {}x memcpy; {}",
                num(during / bound),
                num(during / memcpy),
                spread(&self.full_store_during)
            ),
        );
        // Against the first memcpy into freshly populated memory next to
        // each pass: what an engine's own first copy into memory it just
        // populated gets (the steady memcpy baseline reuses warm pages).
        let after = median(&self.full_store_after);
        let over_populated = paired_ratio(&self.full_after_bound, &self.full_store_after);
        out.row(
            "store, first pass, prefault=full, after population",
            after,
            "GB/s",
            format!(
                "{}x the first memcpy into a populated fresh region (paired: {} GB/s next to it), {}x memcpy; {}",
                num(over_populated),
                num(median(&self.full_after_bound)),
                num(after / memcpy),
                spread(&self.full_store_after)
            ),
        )
        .target(
            "populated store >= 0.95x memcpy into populated memory",
            over_populated,
            Cmp::AtLeast,
            0.95,
        );
        for p in &self.policies {
            let mut detail = format!(
                "then memcpy into it {} GB/s ({}x memcpy baseline)",
                num(median(&p.memcpy)),
                num(median(&p.memcpy) / memcpy)
            );
            if !p.collapse_s_per_gib.is_empty() {
                detail.push_str(&format!(
                    "; MADV_COLLAPSE {} s/GiB",
                    num(median(&p.collapse_s_per_gib))
                ));
            }
            if p.collapse_refused > 0 {
                detail.push_str(&format!(
                    "; MADV_COLLAPSE refused (EAGAIN, no free huge pages) in {} of {reps}",
                    p.collapse_refused
                ));
            }
            out.row(
                format!("page policy: populate, {}", p.name),
                median(&p.populate),
                "GB/s",
                format!("{detail}; {}", spread(&p.populate)),
            );
        }
        out.field(
            "first_fill",
            json!({
                "unit": "GB/s (10^9 bytes per second); s/GiB for population time",
                "threads": self.threads,
                "bytes_per_pass": self.bytes,
                "tier_capacity_bytes": self.capacity,
                "arena_huge_page_advice": self.huge_advice,
                "populate_bound": dist(&self.populate_bound),
                "store_prefault_off": dist(&self.cold_store),
                "store_prefault_off_over_bound": cold / bound,
                "store_prefault_background_over_bound": background / bound,
                "first_touch_copy_bound": dist(&self.first_touch_bound),
                "store_prefault_off_over_first_touch_copy": paired_ratio(&self.first_touch_bound, &self.cold_store),
                "store_prefault_background_over_first_touch_copy": over_touch,
                "prefault_full_seconds_per_gib": dist(&self.full_populate_s_per_gib),
                "store_prefault_full_after_population": dist(&self.full_store_after),
                "store_prefault_full_after_population_over_memcpy": after / memcpy,
                "first_memcpy_into_populated_region": dist(&self.full_after_bound),
                "store_prefault_full_after_population_over_populated_memcpy": over_populated,
                "first_touch_copy_bound_next_to_background": dist(&self.background_bound),
                "store_prefault_full_from_tier_new": dist(&self.full_store_during),
                "store_prefault_background_from_tier_new": dist(&self.background_store_first),
                "page_policies": self.policies.iter().map(|p| json!({
                    "policy": p.name,
                    "populate": dist(&p.populate),
                    "collapse_seconds_per_gib": dist(&p.collapse_s_per_gib),
                    "collapse_refused_eagain": p.collapse_refused,
                    "memcpy_into": dist(&p.memcpy),
                })).collect::<Vec<_>>(),
                "verified_bytes": self.verified_bytes,
            }),
        );
        out.verified(format!(
            "{} in first-fill passes",
            crate::report::gib(self.verified_bytes)
        ));
    }
}
