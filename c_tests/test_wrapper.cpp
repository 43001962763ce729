// kvtier.hpp, the C++ wrapper: ownership (RAII, moves), failures as
// kvtier::Error with the right status and message, the key and span views,
// byte-exact round trips, and concurrent use from several std::threads. Leaks
// show up under the asan_ and valgrind_ runs of this test. (No allocation on
// the hot paths: test_wrapper_alloc.cpp.)

#include "wrapper_util.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace wrapper_test;

// Runs f, which must throw kvtier::Error with `status` and a message that
// starts with "function:" and contains detail.
template <class F>
void expect_error(int line, F &&f, tier_status_t status, const std::string &function, const std::string &detail) {
    try {
        f();
    } catch (const kvtier::Error &e) {
        const std::string message = e.message();
        const std::string what = e.what();
        if (e.status() != status || std::string(e.status_name()) != tier_status_str(status) ||
            message.rfind(function + ": ", 0) != 0 || message.find(detail, function.size()) == std::string::npos ||
            what != std::string(tier_status_str(status)) + ": " + message) {
            std::fprintf(stderr,
                         "line %d: got Error %s (%d) \"%s\"; expected %s with a message starting "
                         "\"%s: \" and containing \"%s\"\n",
                         line, e.status_name(), static_cast<int>(e.status()), what.c_str(), tier_status_str(status),
                         function.c_str(), detail.c_str());
            std::exit(1);
        }
        // A C API failure leaves the same text in this thread's tier_last_error.
        if (function.rfind("tier_", 0) == 0) CHECK(kvtier::last_error() == message);
        return;
    }
    std::fprintf(stderr, "line %d: expected kvtier::Error %s from %s, nothing was thrown\n", line,
                 tier_status_str(status), function.c_str());
    std::exit(1);
}

int threads_now() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
    }
    CHECK(!"/proc/self/status has no Threads: line");
    return -1;
}

// The thread count, once it settles at `want` (an exiting thread may be
// counted for a moment after it was joined).
int threads_settle(int want) {
    int now = threads_now();
    for (int i = 0; i < 2000 && now != want; ++i) {
        std::this_thread::sleep_for(1ms);
        now = threads_now();
    }
    return now;
}

std::vector<kvtier::JobResult> finish(kvtier::Tier &tier, std::size_t expected) {
    tier.drain();
    std::array<kvtier::JobResult, 8> batch{};
    std::vector<kvtier::JobResult> all;
    for (std::size_t n; (n = tier.poll(batch)) != 0;) all.insert(all.end(), batch.begin(), batch.begin() + n);
    CHECK(all.size() == expected);
    return all;
}

// ---- tests -----------------------------------------------------------------

void test_versions_and_type_traits() {
    CHECK(std::string(kvtier::version()) == KVTIER_VERSION_STRING);
    CHECK(std::string(kvtier::header_version) == KVTIER_VERSION_STRING);
    CHECK(std::string(kvtier::status_name(TIER_ERR_NO_SPACE)) == "TIER_ERR_NO_SPACE");
    static_assert(std::is_base_of<std::runtime_error, kvtier::Error>::value, "Error is a runtime_error");
    static_assert(!std::is_copy_constructible<kvtier::Tier>::value && !std::is_copy_assignable<kvtier::Tier>::value,
                  "Tier is move-only");
    static_assert(std::is_nothrow_move_constructible<kvtier::Tier>::value &&
                      std::is_nothrow_move_assignable<kvtier::Tier>::value,
                  "Tier moves never throw");
    static_assert(!std::is_copy_constructible<kvtier::Config>::value, "Config is move-only");
    static_assert(sizeof(kvtier::State) == 1, "State is one byte, like the C states");
}

// Each tier runs io_threads threads from tier_new to tier_free, so the
// process's thread count shows which tiers are alive.
void test_ownership_frees_each_tier_once() {
    Primary primary(8, 4096);
    const int base = threads_now();
    {
        kvtier::Tier a(config("32KiB", 3), primary.data, primary.bytes, primary.block);
        CHECK(threads_settle(base + 3) == base + 3);
        tier_t *const raw = a.get();
        CHECK(raw != nullptr && static_cast<bool>(a));

        kvtier::Tier b(std::move(a));
        CHECK(!a && a.get() == nullptr && b.get() == raw);
        expect_error(__LINE__, [&] { a.drain(); }, TIER_ERR_NULL_ARG, "tier_drain", "tier");
        expect_error(__LINE__, [&] { a.wait(1ms); }, TIER_ERR_NULL_ARG, "tier_wait", "tier");
        CHECK(a.describe().empty());
        { kvtier::Tier gone(std::move(a)); }  // destroys an empty Tier: nothing happens
        CHECK(threads_settle(base + 3) == base + 3);
        b.submit_store(1, keys(1, 2), rows(0, 2));
        CHECK(finish(b, 1)[0].status == TIER_OK);

        kvtier::Tier c(config("32KiB", 2), primary.data, primary.bytes, primary.block);
        CHECK(threads_settle(base + 5) == base + 5);
        c = std::move(b);  // frees c's own tier
        CHECK(threads_settle(base + 3) == base + 3);
        CHECK(c.get() == raw && !b);
        kvtier::Tier &alias = c;
        c = std::move(alias);  // self-move keeps the tier
        CHECK(c.get() == raw);
        std::array<kvtier::State, 2> states{};
        c.lookup(keys(1, 2), states);
        CHECK(states[0] == kvtier::State::hit && states[1] == kvtier::State::hit);

        tier_t *released = c.release();
        CHECK(released == raw && !c);
        CHECK(threads_settle(base + 3) == base + 3);
        kvtier::Tier d(released);
        CHECK(d.get() == raw);
        d.reset();
        CHECK(!d && threads_settle(base) == base);
        d.reset();  // on an empty Tier: a no-op
        tier_t *adopted = nullptr;
        CHECK_OK(tier_new(nullptr, primary.data, primary.bytes, primary.block, &adopted));
        d.reset(adopted);
        CHECK(d.get() == adopted);
    }
    CHECK(threads_settle(base) == base);

    // Tiers made and dropped in a loop: LeakSanitizer and valgrind see any leak.
    for (int i = 0; i < 20; ++i) {
        kvtier::Tier t(config("32KiB", 1), primary.data, primary.bytes, primary.block);
        t.submit_store(static_cast<std::uint64_t>(i), keys(100, 4), rows(0, 4));
        if (i % 2 == 0) CHECK(finish(t, 1)[0].status == TIER_OK);  // odd ones are dropped with the job queued
    }
    CHECK(threads_settle(base) == base);

    kvtier::Config cfg = kvtier::Config().set("capacity_bytes", "16KiB");
    tier_config_t *const raw_cfg = cfg.get();
    kvtier::Config moved(std::move(cfg));
    CHECK(!cfg && moved.get() == raw_cfg);
    expect_error(__LINE__, [&] { kvtier::Tier t(cfg, primary.data, primary.bytes, primary.block); },
                 TIER_ERR_NULL_ARG, "kvtier::Tier::Tier", "Config is empty");
    cfg = kvtier::Config(tier_config_new());
    CHECK(static_cast<bool>(cfg));
    cfg = std::move(moved);  // frees the fresh builder (valgrind and LSan check)
    CHECK(cfg.get() == raw_cfg && !moved);
    kvtier::Tier from_moved_config(cfg, primary.data, primary.bytes, primary.block);
    CHECK(from_moved_config.stats().capacity_bytes == 16 * 1024);
    tier_config_free(cfg.release());
}

void test_errors_become_exceptions() {
    Primary primary(4, 4096);
    kvtier::Tier tier(config("16KiB", 1), primary.data, primary.bytes, primary.block);
    const std::vector<Key> two = keys(1, 2);
    const std::vector<std::int64_t> two_rows = rows(0, 2);
    std::array<std::uint8_t, 2> states{};

    expect_error(__LINE__, [&] { tier.submit_store(1, {two[0].data(), 0, 2}, two_rows); }, TIER_ERR_INVALID_ARG,
                 "tier_submit_store", "key_len");
    expect_error(__LINE__, [&] { tier.submit_load(1, {two[0].data(), 129, 2}, two_rows); }, TIER_ERR_INVALID_ARG,
                 "tier_submit_load", "key_len");
    expect_error(__LINE__, [&] { tier.lookup({two[0].data(), 0, 2}, states); }, TIER_ERR_INVALID_ARG, "tier_lookup",
                 "key_len");
    expect_error(__LINE__, [&] { tier.touch({two[0].data(), 200, 1}); }, TIER_ERR_INVALID_ARG, "tier_touch",
                 "key_len");
    expect_error(__LINE__, [&] { tier.submit_store(2, two, rows(3, 2)); }, TIER_ERR_OUT_OF_RANGE,
                 "tier_submit_store", "block_ids[1]");
    expect_error(__LINE__, [&] { tier.submit_load(2, two, rows(-1, 2)); }, TIER_ERR_OUT_OF_RANGE,
                 "tier_submit_load", "block_ids[0]");
    std::array<kvtier::JobResult, 1> none{};
    expect_error(__LINE__, [&] { (void)tier.poll(kvtier::Span<kvtier::JobResult>(none.data(), 0)); },
                 TIER_ERR_INVALID_ARG, "tier_poll_finished", "cap");

    tier.submit_store(7, two, two_rows);
    expect_error(__LINE__, [&] { tier.submit_load(7, two, rows(2, 2)); }, TIER_ERR_DUPLICATE_JOB, "tier_submit_load",
                 "job_id");
    const std::vector<kvtier::JobResult> stored = finish(tier, 1);
    CHECK(stored[0].job_id == 7 && kvtier::succeeded(stored[0]) && kvtier::kind(stored[0]) == kvtier::JobKind::store);

    // Checks the wrapper makes before the C call name the method.
    expect_error(__LINE__, [&] { tier.submit_store(3, two, rows(0, 1)); }, TIER_ERR_INVALID_ARG,
                 "kvtier::Tier::submit_store", "1 block ids for 2 keys");
    expect_error(__LINE__, [&] { tier.submit_load(3, two, rows(0, 3)); }, TIER_ERR_INVALID_ARG,
                 "kvtier::Tier::submit_load", "3 block ids for 2 keys");
    expect_error(__LINE__, [&] { tier.lookup(two, kvtier::Span<std::uint8_t>(states.data(), 1)); },
                 TIER_ERR_INVALID_ARG, "kvtier::Tier::lookup", "states holds 1 entries for 2 keys");
    const std::vector<std::uint8_t> ragged(kKeyLen + 5, 0);
    expect_error(__LINE__, [&] { tier.touch(kvtier::Keys(ragged, kKeyLen)); }, TIER_ERR_INVALID_ARG,
                 "kvtier::Tier::touch", "41 bytes, not a multiple of key_len 36");

    // Configuration and creation.
    expect_error(__LINE__, [&] { kvtier::Config().set("capacity_bytes", "lots"); }, TIER_ERR_CONFIG,
                 "tier_config_set", "capacity_bytes");
    expect_error(__LINE__, [&] { kvtier::Config().set(std::string("no_such_key"), 1); }, TIER_ERR_CONFIG,
                 "tier_config_set", "no_such_key");
    expect_error(__LINE__, [&] { kvtier::Config().set("io_threads", 0); }, TIER_ERR_CONFIG, "tier_config_set",
                 "io_threads");
    expect_error(__LINE__, [&] { kvtier::Tier t(primary.data, primary.bytes, 0); }, TIER_ERR_INVALID_ARG, "tier_new",
                 "block_bytes");
    expect_error(__LINE__, [&] { kvtier::Tier t(config("1KiB", 1), primary.data, primary.bytes, primary.block); },
                 TIER_ERR_CONFIG, "tier_new", "capacity_bytes");
    expect_error(__LINE__, [&] { kvtier::Tier t(nullptr, primary.bytes, primary.block); }, TIER_ERR_NULL_ARG,
                 "tier_new", "primary");

    // A job that fails is a result, not an exception.
    const std::vector<Key> missing = keys(50, 2);
    tier.submit_load(8, missing, rows(2, 2));
    const std::vector<kvtier::JobResult> failed = finish(tier, 1);
    CHECK(failed[0].status == TIER_ERR_NOT_FOUND && failed[0].num_done == 0 && !kvtier::succeeded(failed[0]));
    CHECK(kvtier::kind(failed[0]) == kvtier::JobKind::load);

    // Nothing above changed the tier.
    tier.lookup(two, states);
    CHECK(states[0] == TIER_HIT && states[1] == TIER_HIT);
    const kvtier::Stats stats = tier.stats();
    CHECK(stats.stores_ok == 1 && stats.loads_failed == 1 && stats.num_blocks == 2 && stats.jobs_in_flight == 0);
}

// Every way to give keys and rows, and byte-exact data both ways.
void test_events_through_the_wrapper() {
    Primary primary(4, 4096);
    kvtier::Config cfg = config("8KiB", 1);
    cfg.set("events", "true").set("events_capacity", 16);
    kvtier::Tier tier(cfg, primary.data, primary.bytes, primary.block);
    std::array<kvtier::Event, 4> events{};

    tier.submit_store(1, keys(1, 2), rows(0, 2));
    finish(tier, 1);
    tier.submit_store(2, keys(3, 1), rows(2, 1));  // evicts 2, the least recent
    finish(tier, 1);
    const std::size_t n = tier.poll_events(events);
    CHECK(n == 4);
    const std::uint64_t want_ids[4] = {1, 2, 2, 3};
    const kvtier::EventKind want_kinds[4] = {kvtier::EventKind::stored, kvtier::EventKind::stored,
                                             kvtier::EventKind::removed, kvtier::EventKind::stored};
    for (std::size_t i = 0; i < n; ++i) {
        const kvtier::Span<const std::uint8_t> k = kvtier::key(events[i]);
        const Key want = key(want_ids[i]);
        CHECK(kvtier::kind(events[i]) == want_kinds[i] && events[i].seq == i);
        CHECK(k.size() == kKeyLen && std::equal(k.begin(), k.end(), want.begin()));
    }
    CHECK(events[2].reason == TIER_REMOVED_EVICTED && events[0].reason == TIER_STORED_WRITTEN);
    CHECK(tier.poll_events(events) == 0);
    expect_error(__LINE__, [&] { (void)tier.poll_events(kvtier::Span<kvtier::Event>(events.data(), 0)); },
                 TIER_ERR_INVALID_ARG, "tier_poll_events", "cap");
    kvtier::Tier quiet(config("8KiB", 1), primary.data, primary.bytes, primary.block);
    expect_error(__LINE__, [&] { (void)quiet.poll_events(events); }, TIER_ERR_CONFIG, "tier_poll_events",
                 "events=true");
}

void test_round_trip_every_key_and_row_form() {
    constexpr std::size_t kBlock = 16 * 1024;
    constexpr std::size_t kRows = 8;
    Primary primary(2 * kRows, kBlock);
    kvtier::Tier tier(config("1MiB", 2), primary.data, primary.bytes, kBlock);
    for (std::size_t r = 0; r < kRows; ++r) tu_fill(primary.row(static_cast<std::int64_t>(r)), kBlock, 1000 + r);

    // A container of fixed-size keys and a std::vector of rows.
    const std::vector<Key> first = keys(1000, 4);
    tier.submit_store(1, first, rows(0, 4));
    // Packed bytes with a key length, and a C array of rows.
    std::vector<std::uint8_t> packed(4 * kKeyLen);
    for (std::size_t i = 0; i < 4; ++i) tu_key(packed.data() + i * kKeyLen, kKeyLen, 1004 + i);
    const std::int64_t rest[4] = {4, 5, 6, 7};
    tier.submit_store(2, kvtier::Keys(packed, kKeyLen), rest);
    for (const kvtier::JobResult &r : finish(tier, 2)) {
        CHECK(r.status == TIER_OK && r.num_blocks == 4 && r.num_done == 4 && r.bytes == 4 * kBlock);
    }

    // Loads in reverse order into rows kRows.., by pointer and count.
    std::vector<std::uint8_t> reversed(kRows * kKeyLen);
    for (std::size_t i = 0; i < kRows; ++i) tu_key(reversed.data() + i * kKeyLen, kKeyLen, 1000 + kRows - 1 - i);
    const std::vector<std::int64_t> dst = rows(kRows, kRows);
    tier.submit_load(3, {reversed.data(), kKeyLen, kRows}, {dst.data(), dst.size()});
    CHECK(tier.wait(std::chrono::seconds(30)));
    const std::vector<kvtier::JobResult> loaded = finish(tier, 1);
    CHECK(loaded[0].status == TIER_OK && loaded[0].num_done == kRows && loaded[0].bytes == kRows * kBlock);
    for (std::size_t i = 0; i < kRows; ++i) {
        CHECK(tu_mismatch(primary.row(static_cast<std::int64_t>(kRows + i)), kBlock, 1000 + kRows - 1 - i) == -1);
    }

    // Lookup into kvtier::State and into bytes; touch; clear.
    std::array<Key, 3> probe = {key(1000), key(999), key(1007)};
    std::array<kvtier::State, 3> states{};
    tier.lookup(probe, states);
    CHECK(states[0] == kvtier::State::hit && states[1] == kvtier::State::miss && states[2] == kvtier::State::hit);
    tier.touch(probe);
    std::uint8_t bytes[3] = {9, 9, 9};
    tier.lookup(probe, bytes);
    CHECK(bytes[0] == TIER_HIT && bytes[1] == TIER_MISS && bytes[2] == TIER_HIT);
    CHECK(tier.describe().find(KVTIER_VERSION_STRING) != std::string::npos);
    const std::string metrics = tier.metrics();
    CHECK(metrics.size() == tier_metrics(tier.get(), nullptr, 0));
    CHECK(metrics.find("\nkvtier_lookups_total{backend=\"memory\"} 6\n") != std::string::npos);
    const int fd = tier.completion_fd();
    CHECK(fd >= 0 && fd == tier_completion_fd(tier.get()));
    tier.clear();
    tier.lookup(probe, states);
    CHECK(states[0] == kvtier::State::miss && states[2] == kvtier::State::miss);
    CHECK(!tier.wait(1ms));  // nothing left to report: a timeout, not an error
    // An empty job is accepted and reported.
    tier.submit_store(4, kvtier::Keys(nullptr, kKeyLen, 0), kvtier::Span<const std::int64_t>());
    CHECK(finish(tier, 1)[0].num_blocks == 0);
}

// Extents, deletes and pins (KVTIER_1.1) through the wrapper, with results per key.
void test_items_through_the_wrapper() {
    constexpr std::size_t kBlock = 16 * 1024;
    Primary primary(8, kBlock);
    kvtier::Tier tier(config("64KiB", 2), primary.data, primary.bytes, kBlock);
    const std::vector<Key> both = keys(1, 2);
    const std::uint64_t from[2] = {3, kBlock + 1}, lengths[2] = {100, kBlock};
    tu_fill(primary.data + from[0], lengths[0], 1);
    tu_fill(primary.data + from[1], lengths[1], 2);
    std::array<kvtier::ItemResult, 2> items{};
    tier.submit_store_extents(1, both, from, lengths, items);
    CHECK(finish(tier, 1)[0].status == TIER_OK);
    CHECK(items[0].status == TIER_ITEM_OK && items[1].status == TIER_ITEM_OK);
    const std::vector<std::uint64_t> to = {3 * kBlock + 7, 5 * kBlock}, wrong = {100, kBlock - 1};
    tier.submit_load_extents(2, both, to, wrong, items);
    const kvtier::JobResult loaded = finish(tier, 1)[0];
    CHECK(loaded.status != TIER_OK && loaded.num_done == 1);
    CHECK(items[0].status == TIER_ITEM_OK && items[1].status == TIER_ITEM_FAILED &&
          items[1].reason == TIER_FAIL_LENGTH_MISMATCH);
    CHECK(tu_mismatch(primary.data + to[0], 100, 1) == -1);
    std::array<kvtier::State, 2> states{};
    tier.pin(both, states);
    CHECK(states[0] == kvtier::State::hit && states[1] == kvtier::State::hit);
    tier.unpin(keys(1, 1));
    // A notify eventfd for deletes counts the delete job, not the others.
    const int deletes = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    CHECK(deletes >= 0);
    tier.add_notify_fd(kvtier::JobKind::remove, deletes);
    expect_error(__LINE__, [&] { tier.add_notify_fd(kvtier::JobKind::load, 987654); },
                 TIER_ERR_INVALID_ARG, "tier_add_notify_fd", "not an open descriptor");
    tier.submit_delete(3, both, items);
    const kvtier::JobResult deleted = finish(tier, 1)[0];
    CHECK(kvtier::kind(deleted) == kvtier::JobKind::remove);
    std::uint64_t count = 0;
    CHECK(read(deletes, &count, sizeof count) == static_cast<ssize_t>(sizeof count) && count == 1);
    close(deletes);
    CHECK(items[0].status == TIER_ITEM_OK && items[1].status == TIER_ITEM_BUSY);
    tier.unpin(both);  // key 1 no longer pinned, nor stored: ignored
    tier.submit_delete(4, keys(2, 1));  // no results wanted
    CHECK(finish(tier, 1)[0].num_done == 1);
    expect_error(
        __LINE__, [&] { tier.submit_store_extents(5, both, from, kvtier::Span<const std::uint64_t>(lengths, 1)); },
        TIER_ERR_INVALID_ARG, "kvtier::Tier::submit_store_extents", "1 lengths for 2 keys");
    expect_error(
        __LINE__, [&] { tier.submit_load_extents(5, both, to, lengths, kvtier::Span<kvtier::ItemResult>(items.data(), 1)); },
        TIER_ERR_INVALID_ARG, "kvtier::Tier::submit_load_extents", "results holds 1 entries for 2 keys");
}

// Several threads store, load, poll, look up and read stats on one Tier.
void test_threads_share_one_tier() {
    constexpr std::size_t kBlock = 16 * 1024;
    constexpr std::size_t kWorkers = 4;
    constexpr std::size_t kKeys = 4;
    constexpr int kRounds = 20;
    Primary primary(kWorkers * 2 * kKeys, kBlock);
    kvtier::Tier tier(config("4MiB", 2), primary.data, primary.bytes, kBlock);

    std::mutex mutex;
    std::map<std::uint64_t, kvtier::JobResult> results;  // polled by any thread, for its owner
    std::atomic<bool> stop{false};
    // Polls whatever is ready into `results`; returns the result of job_id once there.
    auto take = [&](std::uint64_t job_id) {
        std::array<kvtier::JobResult, 4> batch{};
        for (;;) {
            {
                std::lock_guard<std::mutex> lock(mutex);
                auto it = results.find(job_id);
                if (it != results.end()) {
                    const kvtier::JobResult r = it->second;
                    results.erase(it);
                    return r;
                }
            }
            tier.wait(2ms);
            const std::size_t n = tier.poll(batch);
            std::lock_guard<std::mutex> lock(mutex);
            for (std::size_t i = 0; i < n; ++i) CHECK(results.emplace(batch[i].job_id, batch[i]).second);
        }
    };

    std::thread observer([&] {
        const std::vector<Key> some = keys(0, 8);
        std::array<kvtier::State, 8> states{};
        while (!stop.load()) {
            tier.lookup(some, states);
            tier.touch(some);
            CHECK(tier.stats().io_threads == 2);
            CHECK(!tier.describe().empty());
        }
    });
    std::vector<std::thread> workers;
    for (std::size_t w = 0; w < kWorkers; ++w) {
        workers.emplace_back([&, w] {
            const std::vector<std::int64_t> src = rows(static_cast<std::int64_t>(w * 2 * kKeys), kKeys);
            const std::vector<std::int64_t> dst = rows(static_cast<std::int64_t>(w * 2 * kKeys + kKeys), kKeys);
            for (int round = 0; round < kRounds; ++round) {
                const std::uint64_t first = (w << 20) | (static_cast<std::uint64_t>(round) << 8);
                for (std::size_t i = 0; i < kKeys; ++i) tu_fill(primary.row(src[i]), kBlock, first + i);
                const std::vector<Key> mine = keys(first, kKeys);
                const std::uint64_t store_job = first << 1, load_job = (first << 1) | 1;
                tier.submit_store(store_job, mine, src);
                // No wait in between: the load waits for the store in flight.
                tier.submit_load(load_job, mine, dst);
                const kvtier::JobResult stored = take(store_job);
                const kvtier::JobResult loaded = take(load_job);
                CHECK(stored.status == TIER_OK && stored.num_done == kKeys);
                CHECK(loaded.status == TIER_OK && loaded.num_done == kKeys);
                for (std::size_t i = 0; i < kKeys; ++i) CHECK(tu_mismatch(primary.row(dst[i]), kBlock, first + i) == -1);
            }
        });
    }
    for (std::thread &t : workers) t.join();
    stop.store(true);
    observer.join();

    const kvtier::Stats stats = tier.stats();
    CHECK(stats.stores_ok == kWorkers * kRounds && stats.loads_ok == kWorkers * kRounds);
    CHECK(stats.bytes_loaded == kWorkers * kRounds * kKeys * kBlock && stats.jobs_in_flight == 0);
    CHECK(results.empty());
}

// What a tier can do, and an empty Tier's refusal as an exception.
void test_features_through_the_wrapper() {
    Primary primary(4, 4096);
    kvtier::Tier tier(config("16KiB", 1), primary.data, primary.bytes, primary.block);
    CHECK(tier.features() == TIER_FEATURE_EXTENTS);
    CHECK(tier.has(TIER_FEATURE_EXTENTS) && !tier.has(TIER_FEATURE_SHARED));
    CHECK(!tier.has(TIER_FEATURE_EXTENTS | TIER_FEATURE_PERSISTENT));
    const kvtier::Tier empty;
    expect_error(__LINE__, [&] { (void)empty.features(); }, TIER_ERR_NULL_ARG, "tier_features", "tier");
    CHECK(tier.stats().probes_in_flight == 0);
}

}  // namespace

int main(int argc, char **argv) {
    static const struct tu_subtest subtests[] = {
        TU_SUBTEST(versions_and_type_traits),
        TU_SUBTEST(ownership_frees_each_tier_once),
        TU_SUBTEST(errors_become_exceptions),
        TU_SUBTEST(events_through_the_wrapper),
        TU_SUBTEST(round_trip_every_key_and_row_form),
        TU_SUBTEST(threads_share_one_tier),
        TU_SUBTEST(items_through_the_wrapper),
        TU_SUBTEST(features_through_the_wrapper),
    };
    return tu_run_subtests("test_wrapper", argc, argv, subtests, TU_COUNT(subtests));
}
