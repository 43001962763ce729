// An engine's event loop around kvtier, in C++ (kvtier.hpp), the way a
// serving engine drives an I/O tier without a thread of its own:
//
//   - one epoll set holding the tier's completion descriptor
//     (Tier::completion_fd, readable exactly while results wait) and a
//     timerfd that ticks the scheduler;
//   - on a tick the scheduler submits what it can: stores of blocks written
//     into free primary rows, then loads of every stored block back into
//     free rows;
//   - on the completion descriptor it polls every waiting result, returns
//     the job's rows, and checks each loaded row byte for byte.
//
// Exits 0 after every block made the round trip; 1 on a failed job, a byte
// that differs, or a stall (no result for 10 s with jobs in flight: a lost
// wake-up would be one). Built and run by CTest (example_engine_loop).
//
//   engine_loop [blocks] [block_bytes]      defaults: 2048 blocks of 16 KiB

#include "kvtier.hpp"

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr std::size_t kKeyLen = 36;
constexpr std::size_t kRows = 128;        // the primary buffer: far fewer rows than blocks
constexpr std::size_t kBlocksPerJob = 8;
constexpr auto kTick = std::chrono::milliseconds(2);
constexpr auto kStallLimit = std::chrono::seconds(10);

using Clock = std::chrono::steady_clock;
using Key = std::array<std::uint8_t, kKeyLen>;

Key key_of(std::uint64_t block) {
    Key key{};
    for (std::size_t i = 0; i < kKeyLen; i++) {
        key[i] = static_cast<std::uint8_t>((block * 0x9E3779B97F4A7C15ull) >> ((i % 8) * 8)) ^
                 static_cast<std::uint8_t>(i);
    }
    return key;
}

// The bytes of block `block`: a different sequence per block and per offset.
std::uint8_t byte_of(std::uint64_t block, std::size_t offset) {
    std::uint64_t x = block * 0xD1B54A32D192ED03ull + offset / 8;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return static_cast<std::uint8_t>(x >> ((offset % 8) * 8));
}

void check_sys(int rc, const char *what) {
    if (rc < 0) {
        throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
    }
}

// A job in flight: its blocks and the rows they use.
struct InFlight {
    std::vector<std::uint64_t> blocks;
    std::vector<std::int64_t> rows;
};

class Engine {
  public:
    Engine(std::size_t blocks, std::size_t block_bytes)
        : blocks_(blocks),
          block_bytes_(block_bytes),
          primary_(kRows * block_bytes),
          tier_(kvtier::Config()
                    .set("capacity_bytes", static_cast<std::uint64_t>(blocks * block_bytes))
                    .set("io_threads", 2),
                primary_.data(), primary_.size(), block_bytes) {
        for (std::size_t r = kRows; r > 0; r--) {
            free_rows_.push_back(static_cast<std::int64_t>(r - 1));
        }
    }

    int run() {
        const int epoll = epoll_create1(EPOLL_CLOEXEC);
        check_sys(epoll, "epoll_create1");
        const int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        check_sys(timer, "timerfd_create");
        itimerspec tick{};
        tick.it_interval.tv_nsec = std::chrono::nanoseconds(kTick).count();
        tick.it_value = tick.it_interval;
        check_sys(timerfd_settime(timer, 0, &tick, nullptr), "timerfd_settime");

        const int completions = tier_.completion_fd();  // owned by the tier
        epoll_event ev{};
        ev.events = EPOLLIN;  // level-triggered: readable while results wait
        ev.data.fd = completions;
        check_sys(epoll_ctl(epoll, EPOLL_CTL_ADD, completions, &ev), "epoll_ctl");
        ev.data.fd = timer;
        check_sys(epoll_ctl(epoll, EPOLL_CTL_ADD, timer, &ev), "epoll_ctl");

        last_progress_ = Clock::now();
        while (failures_ == 0 && loaded_ < blocks_) {
            std::array<epoll_event, 2> events{};
            const int n = epoll_wait(epoll, events.data(), static_cast<int>(events.size()), 1000);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            check_sys(n, "epoll_wait");
            for (int i = 0; i < n; i++) {
                if (events[static_cast<std::size_t>(i)].data.fd == completions) {
                    on_results();
                } else {
                    std::uint64_t expirations;
                    if (read(timer, &expirations, sizeof expirations) < 0 && errno != EAGAIN) {
                        check_sys(-1, "read(timerfd)");
                    }
                    schedule();
                }
            }
            if (!in_flight_.empty() && Clock::now() - last_progress_ > kStallLimit) {
                std::fprintf(stderr, "stall: no result for %lld s with %zu jobs in flight\n",
                             static_cast<long long>(kStallLimit.count()), in_flight_.size());
                failures_++;
            }
        }
        epoll_ctl(epoll, EPOLL_CTL_DEL, completions, nullptr);  // before the tier goes
        close(timer);
        close(epoll);
        report();
        return failures_ == 0 ? 0 : 1;
    }

  private:
    // One scheduler step: submit stores of the next blocks while rows are
    // free, then (once every block is stored) loads.
    void schedule() {
        while (free_rows_.size() >= kBlocksPerJob) {
            const bool storing = submitted_stores_ < blocks_;
            std::size_t& next = storing ? submitted_stores_ : submitted_loads_;
            if (!storing && stored_ < blocks_) {
                return;  // loads start once every store succeeded
            }
            if (next >= blocks_) {
                return;
            }
            InFlight job;
            std::vector<Key> keys;
            for (std::size_t i = 0; i < kBlocksPerJob && next < blocks_; i++, next++) {
                const std::int64_t row = free_rows_.back();
                free_rows_.pop_back();
                if (storing) {
                    std::uint8_t *dst = row_data(row);
                    for (std::size_t b = 0; b < block_bytes_; b++) {
                        dst[b] = byte_of(next, b);
                    }
                } else {
                    std::memset(row_data(row), 0, block_bytes_);  // a load must write it all
                }
                job.blocks.push_back(next);
                job.rows.push_back(row);
                keys.push_back(key_of(next));
            }
            const std::uint64_t id = next_job_id_++;
            if (storing) {
                tier_.submit_store(id, keys, job.rows);
            } else {
                tier_.submit_load(id, keys, job.rows);
            }
            in_flight_.emplace(id, std::move(job));
        }
    }

    // The completion descriptor is readable: take every waiting result.
    void on_results() {
        std::array<kvtier::JobResult, 16> done{};
        std::size_t n;
        do {
            n = tier_.poll(done);
            for (std::size_t i = 0; i < n; i++) {
                finish(done[i]);
            }
            if (n > 0) {
                last_progress_ = Clock::now();
            }
        } while (n == done.size());
    }

    void finish(const kvtier::JobResult& r) {
        auto it = in_flight_.find(r.job_id);
        if (it == in_flight_.end()) {
            std::fprintf(stderr, "result of unknown job %llu\n", static_cast<unsigned long long>(r.job_id));
            failures_++;
            return;
        }
        InFlight job = std::move(it->second);
        in_flight_.erase(it);
        if (!kvtier::succeeded(r)) {
            std::fprintf(stderr, "job %llu failed: %s\n", static_cast<unsigned long long>(r.job_id),
                         kvtier::status_name(r.status));
            failures_++;
        }
        io_ns_ += r.io_ns;
        elapsed_ns_ += r.elapsed_ns;
        for (std::size_t i = 0; i < job.blocks.size(); i++) {
            if (kvtier::kind(r) == kvtier::JobKind::load) {
                const std::uint8_t *row = row_data(job.rows[i]);
                for (std::size_t b = 0; b < block_bytes_; b++) {
                    if (row[b] != byte_of(job.blocks[i], b)) {
                        std::fprintf(stderr, "block %llu: byte %zu differs\n",
                                     static_cast<unsigned long long>(job.blocks[i]), b);
                        failures_++;
                        break;
                    }
                }
                loaded_++;
            } else {
                stored_++;
            }
            free_rows_.push_back(job.rows[i]);
        }
    }

    void report() const {
        std::printf("engine_loop: %zu blocks of %zu bytes stored and loaded back, %zu verified; "
                    "%zu failures\n",
                    blocks_, block_bytes_, loaded_, failures_);
        std::printf("engine_loop: jobs spent %.1f%% of their time in I/O (io_ns / elapsed_ns)\n",
                    elapsed_ns_ ? 100.0 * static_cast<double>(io_ns_) / static_cast<double>(elapsed_ns_) : 0.0);
        // What a /metrics endpoint would serve, in part.
        const std::string metrics = tier_.metrics();
        std::size_t at = 0;
        while (at < metrics.size()) {
            std::size_t end = metrics.find('\n', at);
            const std::string line = metrics.substr(at, end - at);
            if (line.rfind("kvtier_jobs_total", 0) == 0 || line.rfind("kvtier_job_latency_seconds_count", 0) == 0) {
                std::printf("  %s\n", line.c_str());
            }
            at = end + 1;
        }
    }

    std::uint8_t *row_data(std::int64_t row) {
        return primary_.data() + static_cast<std::size_t>(row) * block_bytes_;
    }

    std::size_t blocks_;
    std::size_t block_bytes_;
    std::vector<std::uint8_t> primary_;
    kvtier::Tier tier_;
    std::vector<std::int64_t> free_rows_;
    std::unordered_map<std::uint64_t, InFlight> in_flight_;
    std::uint64_t next_job_id_ = 1;
    std::size_t submitted_stores_ = 0;
    std::size_t submitted_loads_ = 0;
    std::size_t stored_ = 0;
    std::size_t loaded_ = 0;
    std::size_t failures_ = 0;
    std::uint64_t io_ns_ = 0;
    std::uint64_t elapsed_ns_ = 0;
    Clock::time_point last_progress_;
};

}  // namespace

int main(int argc, char **argv) {
    const std::size_t blocks = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2048;
    const std::size_t block_bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16 * 1024;
    if (blocks == 0 || block_bytes == 0) {
        std::fprintf(stderr, "usage: engine_loop [blocks > 0] [block_bytes > 0]\n");
        return 2;
    }
    try {
        Engine engine(blocks, block_bytes);
        return engine.run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "engine_loop: %s\n", e.what());
        return 1;
    }
}
