// An engine-like program against an installed kvtier, through kvtier.hpp:
// stores four blocks from its primary buffer, loads them back into other
// rows, and compares the bytes. Exits 1 on a mismatch or an error.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1  // dladdr
#endif
#include <dlfcn.h>

#include <kvtier.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t kBlock = 64 * 1024;
constexpr std::size_t kBlocks = 4;
constexpr std::size_t kKeyLen = 36;

std::uint8_t pattern(std::size_t block, std::size_t i) {
    return static_cast<std::uint8_t>((block + 1) * 131 + i * 7 + (i >> 10));
}

kvtier::JobResult finish(kvtier::Tier &tier, std::uint64_t job_id) {
    tier.drain();
    kvtier::JobResult result[2] = {};
    const std::size_t n = tier.poll(result);
    if (n != 1 || result[0].job_id != job_id || !kvtier::succeeded(result[0])) {
        std::fprintf(stderr, "job %llu: %zu results, status %s\n", static_cast<unsigned long long>(job_id), n,
                     n > 0 ? kvtier::status_name(result[0].status) : "-");
        std::exit(1);
    }
    return result[0];
}

}  // namespace

int main() {
    std::printf("kvtier library %s, header %s\n", kvtier::version(), kvtier::header_version);
#ifdef KVTIER_PACKAGE_VERSION
    if (std::strcmp(kvtier::version(), KVTIER_PACKAGE_VERSION) != 0 ||
        std::strcmp(kvtier::header_version, KVTIER_PACKAGE_VERSION) != 0) {
        std::fprintf(stderr, "version mismatch: package %s\n", KVTIER_PACKAGE_VERSION);
        return 1;
    }
#endif
    Dl_info info{};
    if (dladdr(static_cast<const void *>(kvtier::version()), &info) != 0 && info.dli_fname != nullptr) {
        std::printf("kvtier library file: %s\n", info.dli_fname);
    }

    try {
        std::vector<std::uint8_t> primary(2 * kBlocks * kBlock);
        std::vector<std::array<std::uint8_t, kKeyLen>> keys(kBlocks);
        std::vector<std::int64_t> src, dst;
        for (std::size_t b = 0; b < kBlocks; ++b) {
            for (std::size_t i = 0; i < kBlock; ++i) primary[b * kBlock + i] = pattern(b, i);
            for (std::size_t i = 0; i < kKeyLen; ++i) keys[b][i] = static_cast<std::uint8_t>(b * 17 + i);
            src.push_back(static_cast<std::int64_t>(b));
            dst.push_back(static_cast<std::int64_t>(kBlocks + b));
        }

        kvtier::Tier tier(kvtier::Config().set("capacity_bytes", "1MiB").set("io_threads", 2), primary.data(),
                          primary.size(), kBlock);
        std::printf("%s\n", tier.describe().c_str());

        tier.submit_store(1, keys, src);
        const kvtier::JobResult stored = finish(tier, 1);
        tier.submit_load(2, keys, dst);
        const kvtier::JobResult loaded = finish(tier, 2);
        if (stored.num_done != kBlocks || loaded.num_done != kBlocks || loaded.bytes != kBlocks * kBlock) {
            std::fprintf(stderr, "stored %u, loaded %u blocks\n", stored.num_done, loaded.num_done);
            return 1;
        }
        for (std::size_t b = 0; b < kBlocks; ++b) {
            if (std::memcmp(&primary[b * kBlock], &primary[(kBlocks + b) * kBlock], kBlock) != 0) {
                std::fprintf(stderr, "block %zu came back different\n", b);
                return 1;
            }
        }
        std::printf("round trip: %zu blocks of %zu bytes stored and loaded, byte-exact\n", kBlocks, kBlock);
    } catch (const kvtier::Error &e) {
        std::fprintf(stderr, "kvtier error: %s\n", e.what());
        return 1;
    }
    return 0;
}
