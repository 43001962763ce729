// Helpers of the kvtier.hpp tests (test_wrapper*.cpp).
#ifndef KVTIER_WRAPPER_UTIL_HPP
#define KVTIER_WRAPPER_UTIL_HPP

#include "test_util.h"

#include "kvtier.hpp"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace wrapper_test {

constexpr std::size_t kKeyLen = 36;  // vLLM's: a 32-byte hash and a 4-byte group
using Key = std::array<std::uint8_t, kKeyLen>;

inline Key key(std::uint64_t id) {
    Key k{};
    tu_key(k.data(), k.size(), id);
    return k;
}

inline std::vector<Key> keys(std::uint64_t first, std::size_t n) {
    std::vector<Key> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(key(first + i));
    return out;
}

inline std::vector<std::int64_t> rows(std::int64_t first, std::size_t n) {
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(first + static_cast<std::int64_t>(i));
    return out;
}

// A primary buffer of `count` rows of `block` bytes.
struct Primary {
    Primary(std::size_t count, std::size_t block) : block(block), bytes(count * block) {
        data = tu_alloc_rows(count, block);
    }
    ~Primary() { std::free(data); }
    Primary(const Primary &) = delete;
    Primary &operator=(const Primary &) = delete;

    std::uint8_t *row(std::int64_t r) const { return data + static_cast<std::size_t>(r) * block; }

    std::size_t block;
    std::size_t bytes;
    std::uint8_t *data;
};

inline kvtier::Config config(const char *capacity, unsigned io_threads) {
    kvtier::Config cfg;
    cfg.set("capacity_bytes", capacity).set("io_threads", io_threads);
    return cfg;
}

}  // namespace wrapper_test

#endif  // KVTIER_WRAPPER_UTIL_HPP
