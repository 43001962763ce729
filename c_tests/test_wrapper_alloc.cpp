// kvtier.hpp allocates nothing on the scheduler-facing calls: lookup, touch,
// submit_*, wait, poll, drain, clear and stats, with every kind of view.
// Counts this thread's operator new calls, so it replaces operator new, which
// is why it is not part of test_wrapper.cpp (valgrind replaces operator new
// itself).

#include "wrapper_util.hpp"

#include <chrono>
#include <new>

namespace {
thread_local bool g_counting = false;
thread_local std::size_t g_allocations = 0;
}  // namespace

void *operator new(std::size_t size) {
    if (g_counting) {
        ++g_allocations;
    }
    if (void *p = std::malloc(size != 0 ? size : 1)) {
        return p;
    }
    throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace wrapper_test;

// lookup, touch, submit_*, wait, poll, drain, clear and stats allocate nothing
// in C++ (the Rust side uses its own allocator, not operator new).
void no_allocation() {
    constexpr std::size_t kBlock = 4096;
    Primary primary(8, kBlock);
    kvtier::Tier tier(config("64KiB", 1), primary.data, primary.bytes, kBlock);
    const std::vector<Key> four = keys(1, 4);
    const std::vector<std::int64_t> src = rows(0, 4), dst = rows(4, 4);
    std::vector<std::uint8_t> packed(4 * kKeyLen);
    for (std::size_t i = 0; i < 4; ++i) tu_key(packed.data() + i * kKeyLen, kKeyLen, 1 + i);
    std::array<kvtier::State, 4> states{};
    std::array<std::uint8_t, 4> bytes{};
    std::array<kvtier::JobResult, 4> results{};
    std::size_t polled = 0;

    g_allocations = 0;
    g_counting = true;
    tier.lookup(four, states);
    tier.touch(four);
    tier.submit_store(1, four, src);
    tier.wait(std::chrono::seconds(30));
    tier.drain();
    polled += tier.poll(results);
    tier.submit_load(2, kvtier::Keys(packed, kKeyLen), {dst.data(), dst.size()});
    tier.drain();
    polled += tier.poll(results);
    tier.lookup({packed.data(), kKeyLen, 4}, bytes);
    const kvtier::Stats stats = tier.stats();
    tier.clear();
    g_counting = false;
    CHECK(g_allocations == 0);
    CHECK(polled == 2 && stats.loads_ok == 1 && bytes[3] == TIER_HIT);

    // The counter works: an error allocates its message.
    g_counting = true;
    try {
        tier.lookup({packed.data(), 0, 4}, bytes);
    } catch (const kvtier::Error &) {
    }
    g_counting = false;
    CHECK(g_allocations > 0);
}

}  // namespace

int main() {
    tu_start("test_wrapper_alloc");
    no_allocation();
    std::printf("test_wrapper_alloc: ok\n");
    return 0;
}
