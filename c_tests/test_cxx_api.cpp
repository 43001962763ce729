// The C API as a C++17 program would use it: RAII handles with tier_free and
// tier_config_free deleters, std::vector buffers, std::thread workers, errors
// turned into exceptions carrying tier_status_str and tier_last_error.

#include "kvtier.h"

#include <array>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

[[noreturn]] void fail(const char *file, int line, const std::string &what) {
    std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what.c_str());
    std::exit(1);
}

#define CHECK(cond)                                 \
    do {                                            \
        if (!(cond)) fail(__FILE__, __LINE__, #cond); \
    } while (0)

std::string last_error() {
    std::string message(tier_last_error(nullptr, 0), '\0');
    // The copy writes a NUL after the message: give it room, then drop it.
    message.push_back('\0');
    const std::size_t len = tier_last_error(message.data(), message.size());
    message.resize(len);
    return message;
}

class tier_error : public std::runtime_error {
  public:
    tier_error(tier_status_t status, const std::string &message)
        : std::runtime_error(std::string(tier_status_str(status)) + ": " + message),
          status_(status) {}
    tier_status_t status() const noexcept { return status_; }

  private:
    tier_status_t status_;
};

void check(tier_status_t status) {
    if (status < 0) throw tier_error(status, last_error());
}

struct TierDeleter {
    void operator()(tier_t *tier) const noexcept { tier_free(tier); }
};
struct ConfigDeleter {
    void operator()(tier_config_t *cfg) const noexcept { tier_config_free(cfg); }
};
using TierPtr = std::unique_ptr<tier_t, TierDeleter>;
using ConfigPtr = std::unique_ptr<tier_config_t, ConfigDeleter>;

constexpr std::size_t kKeyLen = 32;
using Key = std::array<std::uint8_t, kKeyLen>;

Key make_key(std::uint64_t id) {
    Key key{};
    for (std::size_t i = 0; i < kKeyLen; ++i) key[i] = static_cast<std::uint8_t>((id >> (8 * (i % 8))) + i / 8);
    return key;
}

std::uint8_t byte_of(std::uint64_t id, std::size_t i) {
    return static_cast<std::uint8_t>(id * 131 + i * 7 + (i >> 9));
}

std::vector<std::uint8_t> pack(const std::vector<Key> &keys) {
    std::vector<std::uint8_t> packed;
    packed.reserve(keys.size() * kKeyLen);
    for (const Key &k : keys) packed.insert(packed.end(), k.begin(), k.end());
    return packed;
}

TierPtr make_tier(std::vector<std::uint8_t> &primary, std::size_t block,
                  const std::map<std::string, std::string> &options) {
    ConfigPtr cfg(tier_config_new());
    CHECK(cfg != nullptr);
    for (const auto &[key, value] : options) check(tier_config_set(cfg.get(), key.c_str(), value.c_str()));
    tier_t *raw = nullptr;
    check(tier_new(cfg.get(), primary.data(), primary.size(), block, &raw));
    return TierPtr(raw);
}

// Polls on its own thread and hands each result to the thread waiting for it.
class Completions {
  public:
    explicit Completions(tier_t *tier) : tier_(tier), poller_([this] { run(); }) {}
    ~Completions() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        poller_.join();
    }
    Completions(const Completions &) = delete;
    Completions &operator=(const Completions &) = delete;

    tier_job_result_t wait_for(std::uint64_t job_id) {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return results_.count(job_id) > 0; });
        tier_job_result_t r = results_[job_id];
        results_.erase(job_id);
        return r;
    }

  private:
    void run() {
        std::array<tier_job_result_t, 16> batch{};
        for (;;) {
            {
                std::lock_guard<std::mutex> lock(mutex_);
                if (stop_) return;
            }
            const tier_status_t w = tier_wait(tier_, 5);
            CHECK(w == TIER_OK || w == TIER_TIMEOUT);
            std::size_t n = 0;
            check(tier_poll_finished(tier_, batch.data(), sizeof(tier_job_result_t),
                                     batch.size(), &n));
            if (n == 0) continue;
            std::lock_guard<std::mutex> lock(mutex_);
            for (std::size_t i = 0; i < n; ++i) {
                CHECK(results_.count(batch[i].job_id) == 0);
                results_[batch[i].job_id] = batch[i];
            }
            ready_.notify_all();
        }
    }

    tier_t *tier_;
    std::mutex mutex_;
    std::condition_variable ready_;
    std::map<std::uint64_t, tier_job_result_t> results_;
    bool stop_ = false;
    std::thread poller_;
};

constexpr std::size_t kBlock = 64 * 1024;
constexpr std::size_t kWorkers = 4;
constexpr std::size_t kKeysPerWorker = 8;

void round_trip_from_threads() {
    // Rows [w*2k, w*2k+k) are worker w's sources, the next k its destinations.
    std::vector<std::uint8_t> primary(kWorkers * 2 * kKeysPerWorker * kBlock);
    TierPtr tier = make_tier(primary, kBlock, {{"capacity_bytes", "16MiB"}, {"io_threads", "2"}});
    Completions completions(tier.get());

    std::vector<std::thread> workers;
    for (std::size_t w = 0; w < kWorkers; ++w) {
        workers.emplace_back([&, w] {
            std::vector<Key> keys;
            std::vector<std::int64_t> src, dst;
            for (std::size_t i = 0; i < kKeysPerWorker; ++i) {
                const std::uint64_t id = w * 100 + i;
                keys.push_back(make_key(id));
                src.push_back(static_cast<std::int64_t>(w * 2 * kKeysPerWorker + i));
                dst.push_back(src.back() + static_cast<std::int64_t>(kKeysPerWorker));
                std::uint8_t *row = primary.data() + static_cast<std::size_t>(src.back()) * kBlock;
                for (std::size_t b = 0; b < kBlock; ++b) row[b] = byte_of(id, b);
            }
            const std::vector<std::uint8_t> packed = pack(keys);
            const std::uint64_t store_job = (w << 32) | 1, load_job = (w << 32) | 2;
            check(tier_submit_store(tier.get(), store_job, packed.data(), kKeyLen, src.data(), keys.size()));
            // No wait in between: the load waits for the store in flight.
            check(tier_submit_load(tier.get(), load_job, packed.data(), kKeyLen, dst.data(), keys.size()));
            const tier_job_result_t stored = completions.wait_for(store_job);
            const tier_job_result_t loaded = completions.wait_for(load_job);
            CHECK(stored.status == TIER_OK && stored.kind == TIER_JOB_STORE);
            CHECK(stored.num_done == kKeysPerWorker && stored.bytes == kKeysPerWorker * kBlock);
            CHECK(loaded.status == TIER_OK && loaded.kind == TIER_JOB_LOAD);
            CHECK(loaded.num_done == kKeysPerWorker);
            for (std::size_t i = 0; i < kKeysPerWorker; ++i) {
                const std::uint8_t *row = primary.data() + static_cast<std::size_t>(dst[i]) * kBlock;
                for (std::size_t b = 0; b < kBlock; ++b) CHECK(row[b] == byte_of(w * 100 + i, b));
            }
        });
    }
    for (std::thread &t : workers) t.join();

    tier_stats_t stats{};
    check(tier_stats(tier.get(), &stats, sizeof(tier_stats_t)));
    CHECK(stats.num_blocks == kWorkers * kKeysPerWorker);
    CHECK(stats.stores_ok == kWorkers && stats.loads_ok == kWorkers);
    CHECK(stats.bytes_loaded == kWorkers * kKeysPerWorker * kBlock);
}

void errors_become_exceptions() {
    std::vector<std::uint8_t> primary(4 * 4096);
    TierPtr tier = make_tier(primary, 4096, {{"capacity_bytes", "16KiB"}});
    const std::vector<std::uint8_t> packed = pack({make_key(1)});
    const std::int64_t row = 0;

    try {
        check(tier_submit_store(tier.get(), 1, packed.data(), 0, &row, 1));
        CHECK(!"a zero key length was accepted");
    } catch (const tier_error &e) {
        CHECK(e.status() == TIER_ERR_INVALID_ARG);
        const std::string what = e.what();
        CHECK(what.rfind("TIER_ERR_INVALID_ARG: tier_submit_store: ", 0) == 0);
        CHECK(what.find("key_len") != std::string::npos);
    }

    try {
        make_tier(primary, 4096, {{"capacity_bytes", "lots"}});
        CHECK(!"a bad capacity was accepted");
    } catch (const tier_error &e) {
        CHECK(e.status() == TIER_ERR_CONFIG);
        CHECK(std::string(e.what()).find("tier_config_set: capacity_bytes") != std::string::npos);
    }

    // The tier is unaffected and usable.
    check(tier_submit_store(tier.get(), 2, packed.data(), kKeyLen, &row, 1));
    check(tier_drain(tier.get()));
    tier_job_result_t r{};
    std::size_t n = 0;
    check(tier_poll_finished(tier.get(), &r, sizeof(tier_job_result_t), 1, &n));
    CHECK(n == 1 && r.job_id == 2 && r.status == TIER_OK);
    std::array<std::uint8_t, 1> state{};
    check(tier_lookup(tier.get(), packed.data(), kKeyLen, 1, state.data()));
    CHECK(state[0] == TIER_HIT);
}

}  // namespace

int main() {
    std::printf("test_cxx_api: kvtier %s\n", tier_version());
    CHECK(std::string(tier_version()) == KVTIER_VERSION_STRING);
    CHECK(std::string(tier_status_str(TIER_ERR_NOT_FOUND)) == "TIER_ERR_NOT_FOUND");
    round_trip_from_threads();
    errors_become_exceptions();
    std::printf("test_cxx_api: ok\n");
    return 0;
}
