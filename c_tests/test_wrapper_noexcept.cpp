// kvtier.hpp in a program built with -fno-exceptions (c_tests/CMakeLists.txt
// builds every *_noexcept.cpp that way): the throwing members are compiled
// out; the ownership, the views and the C API on get() remain.

#include "test_util.h"

#include "kvtier.hpp"

#include <array>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#error "test_wrapper_noexcept.cpp must be built with -fno-exceptions"
#endif
#ifndef KVTIER_NO_EXCEPTIONS
#error "kvtier.hpp did not switch to KVTIER_NO_EXCEPTIONS without exceptions"
#endif

namespace {

template <class T, class = void>
struct has_drain : std::false_type {};
template <class T>
struct has_drain<T, std::void_t<decltype(std::declval<T &>().drain())>> : std::true_type {};

template <class T, class = void>
struct has_set : std::false_type {};
template <class T>
struct has_set<T, std::void_t<decltype(std::declval<T &>().set("io_threads", "1"))>> : std::true_type {};

static_assert(!has_drain<kvtier::Tier>::value, "throwing members are compiled out");
static_assert(!has_set<kvtier::Config>::value, "throwing members are compiled out");
static_assert(!std::is_default_constructible<kvtier::Config>::value, "Config() could only fail by throwing");
static_assert(std::is_nothrow_move_constructible<kvtier::Tier>::value, "moves remain");

constexpr std::size_t kKeyLen = 16;
constexpr std::size_t kBlock = 4096;

}  // namespace

int main() {
    tu_start("test_wrapper_noexcept");
    CHECK(std::string(kvtier::version()) == kvtier::header_version);

    kvtier::Config cfg(tier_config_new());
    CHECK(static_cast<bool>(cfg));
    CHECK_OK(tier_config_set(cfg.get(), "capacity_bytes", "64KiB"));
    CHECK_STATUS(tier_config_set(cfg.get(), "capacity_bytes", "lots"), TIER_ERR_CONFIG);
    CHECK(kvtier::last_error().rfind("tier_config_set: capacity_bytes", 0) == 0);
    CHECK(std::string(kvtier::status_name(TIER_ERR_CONFIG)) == "TIER_ERR_CONFIG");

    uint8_t *primary = tu_alloc_rows(4, kBlock);
    tier_t *raw = nullptr;
    CHECK_OK(tier_new(cfg.get(), primary, 4 * kBlock, kBlock, &raw));
    kvtier::Tier tier(raw);
    kvtier::Tier owner(std::move(tier));
    CHECK(!tier && owner.get() == raw);
    CHECK(owner.describe().find(KVTIER_VERSION_STRING) != std::string::npos);
    CHECK(owner.metrics().find("# TYPE kvtier_io_threads gauge\n") != std::string::npos);
    CHECK(kvtier::Tier().metrics().empty());

    // The views feed the C API.
    std::vector<std::array<std::uint8_t, kKeyLen>> keys(2);
    tu_key(keys[0].data(), kKeyLen, 1);
    tu_key(keys[1].data(), kKeyLen, 2);
    const kvtier::Keys view(keys);
    const std::array<std::int64_t, 2> src = {0, 1};
    const std::array<std::int64_t, 2> dst = {2, 3};
    const kvtier::Span<const std::int64_t> src_rows(src), dst_rows(dst);
    tu_fill(primary, kBlock, 11);
    tu_fill(primary + kBlock, kBlock, 12);
    CHECK_OK(tier_submit_store(owner.get(), 1, view.data(), view.key_len(), src_rows.data(), view.size()));
    CHECK(tu_finish(owner.get(), 1).status == TIER_OK);
    CHECK_OK(tier_submit_load(owner.get(), 2, view.data(), view.key_len(), dst_rows.data(), view.size()));
    CHECK(tu_finish(owner.get(), 2).status == TIER_OK);
    CHECK(tu_mismatch(primary + 2 * kBlock, kBlock, 11) == -1);
    CHECK(tu_mismatch(primary + 3 * kBlock, kBlock, 12) == -1);

    owner.reset();  // tier_free: the buffer may go now
    std::free(primary);
    std::printf("test_wrapper_noexcept: ok\n");
    return 0;
}
