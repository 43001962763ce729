/*
 * kvtier.hpp — a header-only C++17 wrapper over the kvtier C API (kvtier.h).
 *
 * It adds no behaviour of its own: every call is one C call on the same
 * handle, so kvtier.h's documentation (contract, ownership, threads) applies.
 * What it adds:
 *
 *  - kvtier::Tier owns a tier_t* (tier_free in the destructor) and is
 *    move-only; a moved-from Tier is empty and its destructor does nothing.
 *    Every method may be called from any thread, concurrently, on one Tier,
 *    like the C functions; destruction, move assignment, reset() and release()
 *    must not race with other calls, like tier_free.
 *  - kvtier::Config owns a tier_config_t* and chains set() calls. One thread
 *    at a time.
 *  - Failures throw kvtier::Error (a std::runtime_error) with the status code,
 *    its name and this thread's tier_last_error message. Job failures are not
 *    exceptions: they arrive as a JobResult's status, as in C.
 *  - Keys and Span<T> are non-owning views, so lookup, touch, submit_*, poll,
 *    poll_events, wait, drain, clear and stats allocate nothing beyond what the C call does
 *    (errors allocate, for the exception).
 *
 * Without exceptions (-fno-exceptions, or KVTIER_NO_EXCEPTIONS defined before
 * including this header), everything that reports failure by throwing is
 * compiled out. What remains is the ownership (Tier and Config adopt, move,
 * get, release, reset, free), the views, version(), status_name(),
 * last_error(), Tier::describe() and Tier::metrics(); make the other calls
 * (tier_completion_fd among them) through the C API
 * on tier.get(), which returns status codes:
 *
 *     tier_t *raw = nullptr;
 *     if (tier_new(cfg.get(), primary, len, block, &raw) != TIER_OK) { ... }
 *     kvtier::Tier tier(raw);                  // tier_free when it goes away
 *     tier_status_t s = tier_submit_store(tier.get(), job, keys, 36, rows, n);
 *
 * Example (with exceptions):
 *
 *     kvtier::Tier tier(kvtier::Config().set("capacity_bytes", "8GiB").set("events", true),
 *                       primary, primary_len, block_bytes);
 *     tier.submit_store(job_id, {keys, 36, n}, {rows, n});  // or containers
 *     tier.wait(std::chrono::milliseconds(10));
 *     std::array<kvtier::JobResult, 64> done;
 *     for (const kvtier::JobResult &r : kvtier::Span<kvtier::JobResult>(done.data(), tier.poll(done))) ...
 */

#ifndef KVTIER_HPP
#define KVTIER_HPP

#include "kvtier.h"

#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#if !defined(KVTIER_NO_EXCEPTIONS) && \
    !(defined(__cpp_exceptions) || defined(__EXCEPTIONS) || defined(_CPPUNWIND))
#define KVTIER_NO_EXCEPTIONS 1
#endif

#ifndef KVTIER_NO_EXCEPTIONS
#include <stdexcept>
#endif

namespace kvtier {

/** A lookup answer; the values are TIER_MISS, TIER_HIT and TIER_PENDING. */
enum class State : std::uint8_t { miss = TIER_MISS, hit = TIER_HIT, pending = TIER_PENDING };

/** A job's kind; the values are TIER_JOB_STORE, TIER_JOB_LOAD and TIER_JOB_DELETE. */
enum class JobKind : std::uint32_t { store = TIER_JOB_STORE, load = TIER_JOB_LOAD, remove = TIER_JOB_DELETE };

/** One finished job (job_id, status, kind, num_blocks, num_done, bytes, elapsed_ns, io_ns). */
using JobResult = tier_job_result_t;

/** A snapshot of a tier's state and counters (see tier_stats_t). */
using Stats = tier_stats_t;

/** A block event's kind; the values are TIER_EVENT_STORED, TIER_EVENT_REMOVED and TIER_EVENT_LOST. */
enum class EventKind : std::uint32_t { stored = TIER_EVENT_STORED, removed = TIER_EVENT_REMOVED, lost = TIER_EVENT_LOST };

/**
 * One block event (seq, dropped, kind, reason, key_len, key; see tier_event_t):
 * reason is a TIER_STORED_* or TIER_REMOVED_* code.
 */
using Event = tier_event_t;
/** One key's outcome in an extent or delete job (KVTIER_1.1). */
using ItemResult = tier_item_result_t;

/** The event's kind as an EventKind. */
inline EventKind kind(const Event &event) noexcept { return static_cast<EventKind>(event.kind); }

/** The job's kind as a JobKind. */
inline JobKind kind(const JobResult &result) noexcept { return static_cast<JobKind>(result.kind); }

/** True if the job succeeded (status TIER_OK). */
inline bool succeeded(const JobResult &result) noexcept { return result.status == TIER_OK; }

/** The library's version, e.g. "0.1.0"; compare with header_version. */
inline const char *version() noexcept { return tier_version(); }

/** The version of the headers this program was compiled with. */
inline constexpr const char header_version[] = KVTIER_VERSION_STRING;

/** The name of a status code, e.g. "TIER_ERR_NO_SPACE". */
inline const char *status_name(tier_status_t status) noexcept { return tier_status_str(status); }

namespace detail {

/**
 * The text of a C call of the form `size_t call(char *buf, size_t cap)` that
 * returns the full length (tier_last_error, tier_describe): sized by a first
 * call, and again while the text changes length between calls.
 */
template <class TextCall>
std::string text_of(TextCall call) {
    std::string text;
    std::size_t len = call(nullptr, 0);
    while (text.size() != len) {
        text.resize(len);
        // The C call also writes a NUL at text[len], which std::string keeps.
        len = call(&text[0], len + 1);
    }
    return text;
}

}  // namespace detail

/** This thread's message of the last failed C call ("function: detail"), or "". */
inline std::string last_error() {
    return detail::text_of([](char *buf, std::size_t cap) { return tier_last_error(buf, cap); });
}

namespace detail {

template <class C>
using data_t = decltype(std::data(std::declval<C &>()));

template <class C, class T, class = void>
struct is_container_of : std::false_type {};

// Contiguous elements convertible to T the way T* accepts U* (adding const,
// never converting a derived type to its base).
template <class C, class T>
struct is_container_of<C, T, std::void_t<data_t<C>, decltype(std::size(std::declval<C &>()))>>
    : std::is_convertible<std::remove_pointer_t<data_t<C>> (*)[], T (*)[]> {};

template <class T>
struct is_span : std::false_type {};

template <class T>
struct key_array : std::false_type {};

template <std::size_t L>
struct key_array<std::array<std::uint8_t, L>> : std::true_type {
    static_assert(sizeof(std::array<std::uint8_t, L>) == L, "std::array must be unpadded");
    static constexpr std::size_t key_len = L;
};

template <class C>
using key_array_of = key_array<std::remove_cv_t<std::remove_pointer_t<data_t<C>>>>;

// A NUL-terminated string argument: a C string or a std::string.
class CString {
  public:
    CString(const char *s) noexcept : s_(s) {}
    CString(const std::string &s) noexcept : s_(s.c_str()) {}
    const char *c_str() const noexcept { return s_; }

  private:
    const char *s_;
};

}  // namespace detail

template <class T>
class Span;

namespace detail {
template <class T>
struct is_span<Span<T>> : std::true_type {};
}  // namespace detail

/**
 * A view of `size()` contiguous T (a C++17 stand-in for std::span): from a
 * pointer and a count, or from an array or container (std::vector,
 * std::array, std::span...). It never owns or allocates.
 */
template <class T>
class Span {
  public:
    constexpr Span() noexcept = default;
    /** A pointer and a count; a literal 0 is rejected, so that {0, 1} cannot mean (NULL, 1). */
    template <class P, std::enable_if_t<std::is_convertible<P, T *>::value && !std::is_integral<P>::value, int> = 0>
    constexpr Span(P data, std::size_t size) noexcept : data_(data), size_(size) {}

    template <class C, std::enable_if_t<!detail::is_span<std::remove_cv_t<std::remove_reference_t<C>>>::value &&
                                            detail::is_container_of<C, T>::value &&
                                            (std::is_lvalue_reference<C>::value ||
                                             std::is_const<T>::value),
                                        int> = 0>
    constexpr Span(C &&container) noexcept(noexcept(std::data(container)) &&
                                           noexcept(std::size(container)))
        : data_(std::data(container)), size_(static_cast<std::size_t>(std::size(container))) {}

    constexpr T *data() const noexcept { return data_; }
    constexpr std::size_t size() const noexcept { return size_; }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr T *begin() const noexcept { return data_; }
    constexpr T *end() const noexcept { return data_ + size_; }
    constexpr T &operator[](std::size_t i) const noexcept { return data_[i]; }

  private:
    T *data_ = nullptr;
    std::size_t size_ = 0;
};

/** A block event's key bytes (empty for EventKind::lost). */
inline Span<const std::uint8_t> key(const Event &event) noexcept {
    return Span<const std::uint8_t>(event.key, event.key_len);
}

/**
 * A view of packed keys, the C API's (keys, key_len, n): `size()` keys of
 * `key_len()` bytes back to back. Build it from a pointer, key length and
 * count; from packed bytes and a key length; or from a container of
 * fixed-size keys such as std::vector<std::array<std::uint8_t, 36>>.
 */
class Keys {
  public:
    constexpr Keys() noexcept = default;

    constexpr Keys(const std::uint8_t *packed, std::size_t key_len, std::size_t count) noexcept
        : data_(packed), key_len_(key_len), count_(count) {}

    /** Packed bytes; a size that is not a multiple of key_len is rejected at use. */
    constexpr Keys(Span<const std::uint8_t> packed, std::size_t key_len) noexcept
        : data_(packed.data()),
          key_len_(key_len),
          count_(key_len != 0 ? packed.size() / key_len : packed.size()),
          tail_(key_len != 0 ? packed.size() % key_len : 0) {}

    template <class C, std::enable_if_t<detail::key_array_of<const C>::value, int> = 0>
    constexpr Keys(const C &keys) noexcept
        : data_(std::size(keys) != 0 ? std::data(keys)->data() : nullptr),
          key_len_(detail::key_array_of<const C>::key_len),
          count_(static_cast<std::size_t>(std::size(keys))) {}

    constexpr const std::uint8_t *data() const noexcept { return data_; }
    constexpr std::size_t key_len() const noexcept { return key_len_; }
    /** The number of keys. */
    constexpr std::size_t size() const noexcept { return count_; }
    /** Bytes left over after the last whole key (0 unless built from bad packed bytes). */
    constexpr std::size_t tail() const noexcept { return tail_; }

  private:
    const std::uint8_t *data_ = nullptr;
    std::size_t key_len_ = 0;
    std::size_t count_ = 0;
    std::size_t tail_ = 0;
};

#ifndef KVTIER_NO_EXCEPTIONS

/**
 * A failed call: status() is the TIER_ERR_* code, message() the library's
 * explanation ("tier_submit_store: key_len: 0 is outside 1..=128") and what()
 * both ("TIER_ERR_INVALID_ARG: tier_submit_store: ..."). Checks the wrapper
 * makes itself (sizes of views) name the method ("kvtier::Tier::lookup: ...").
 */
class Error : public std::runtime_error {
  public:
    Error(tier_status_t status, const std::string &message)
        : std::runtime_error(std::string(tier_status_str(status)) + ": " + message),
          status_(status),
          message_offset_(std::char_traits<char>::length(tier_status_str(status)) + 2) {}

    tier_status_t status() const noexcept { return status_; }
    const char *status_name() const noexcept { return tier_status_str(status_); }
    const char *message() const noexcept { return what() + message_offset_; }

  private:
    tier_status_t status_;
    std::size_t message_offset_;
};

namespace detail {

// Throws for negative codes (errors); returns the others (TIER_OK, TIER_TIMEOUT).
inline tier_status_t check(tier_status_t status) {
    if (status < 0) {
        throw Error(status, last_error());
    }
    return status;
}

[[noreturn]] inline void invalid(const char *method, const std::string &detail) {
    throw Error(TIER_ERR_INVALID_ARG, std::string("kvtier::Tier::") + method + ": " + detail);
}

inline void check_keys(const char *method, const Keys &keys) {
    if (keys.tail() != 0) {
        invalid(method, "packed keys are " + std::to_string(keys.size() * keys.key_len() + keys.tail()) +
                            " bytes, not a multiple of key_len " + std::to_string(keys.key_len()));
    }
}

inline void check_rows(const char *method, const Keys &keys, std::size_t rows) {
    check_keys(method, keys);
    if (rows != keys.size()) {
        invalid(method, std::to_string(rows) + " block ids for " + std::to_string(keys.size()) + " keys");
    }
}

}  // namespace detail

#endif  // KVTIER_NO_EXCEPTIONS

/**
 * Owns a configuration builder (tier_config_new / tier_config_free).
 *
 *     kvtier::Config cfg;
 *     cfg.set("backend", "disk").set("path", dir).set("shared", true);   // io_threads: the disk's 32
 *
 * set() throws kvtier::Error (TIER_ERR_CONFIG for an unknown key or a bad
 * value; the configuration is then unchanged). Not for concurrent use.
 */
class Config {
  public:
#ifndef KVTIER_NO_EXCEPTIONS
    /** The defaults (see tier_config_new). Throws Error(TIER_ERR_ALLOC). */
    Config() : cfg_(tier_config_new()) {
        if (cfg_ == nullptr) {
            throw Error(TIER_ERR_ALLOC, "tier_config_new: out of memory");
        }
    }
#endif

    /** Takes ownership of a builder from tier_config_new (NULL gives an empty Config). */
    explicit Config(tier_config_t *adopt) noexcept : cfg_(adopt) {}

    Config(Config &&other) noexcept : cfg_(std::exchange(other.cfg_, nullptr)) {}
    Config &operator=(Config &&other) noexcept {
        reset(other.release());
        return *this;
    }
    Config(const Config &) = delete;
    Config &operator=(const Config &) = delete;
    ~Config() { tier_config_free(cfg_); }

    tier_config_t *get() const noexcept { return cfg_; }
    explicit operator bool() const noexcept { return cfg_ != nullptr; }
    /** Gives up ownership; the caller frees the result with tier_config_free. */
    tier_config_t *release() noexcept { return std::exchange(cfg_, nullptr); }
    /** Frees the builder held, then holds `adopt`. */
    void reset(tier_config_t *adopt = nullptr) noexcept { tier_config_free(std::exchange(cfg_, adopt)); }

#ifndef KVTIER_NO_EXCEPTIONS
    /** Sets an option from a string ("capacity_bytes", "8GiB"). */
    Config &set(detail::CString key, detail::CString value) & {
        detail::check(tier_config_set(cfg_, key.c_str(), value.c_str()));
        return *this;
    }

    /** Sets an option from an integer ("events_capacity", 4096). */
    template <class Int, std::enable_if_t<std::is_integral<Int>::value && !std::is_same<Int, bool>::value, int> = 0>
    Config &set(detail::CString key, Int value) & {
        char text[24];
        const std::to_chars_result end = std::to_chars(text, text + sizeof text - 1, value);
        *end.ptr = '\0';
        return set(key, static_cast<const char *>(text));
    }

    /** Sets an option from a bool ("shared", true), as "true" or "false". */
    template <class Bool, std::enable_if_t<std::is_same<Bool, bool>::value, int> = 0>
    Config &set(detail::CString key, Bool value) & {
        return set(key, value ? "true" : "false");
    }

    /** The same on a temporary, so that `Config cfg = Config().set(...);` works. */
    template <class Value>
    Config &&set(detail::CString key, Value &&value) && {
        set(key, std::forward<Value>(value));
        return std::move(*this);
    }
#endif

  private:
    tier_config_t *cfg_ = nullptr;
};

/**
 * Owns a tier (tier_new / tier_free). Move-only; a moved-from Tier is empty:
 * its methods throw Error(TIER_ERR_NULL_ARG) and its destructor does nothing.
 *
 * The primary buffer stays the caller's and must outlive the Tier (see
 * tier_new). Destroying the Tier stops its threads and abandons queued jobs.
 */
class Tier {
  public:
    /** An empty Tier (owns nothing). */
    Tier() noexcept = default;

    /** Takes ownership of a handle from tier_new (NULL gives an empty Tier). */
    explicit Tier(tier_t *adopt) noexcept : tier_(adopt) {}

#ifndef KVTIER_NO_EXCEPTIONS
    /** A tier with the default configuration. Throws Error (see tier_new). */
    Tier(void *primary, std::size_t primary_len, std::size_t block_bytes) {
        detail::check(tier_new(nullptr, primary, primary_len, block_bytes, &tier_));
    }

    /** A tier configured by `config`, which is only read. Throws Error (see tier_new). */
    Tier(const Config &config, void *primary, std::size_t primary_len, std::size_t block_bytes) {
        if (!config) {
            // tier_new would take NULL for the defaults, hiding the mistake.
            throw Error(TIER_ERR_NULL_ARG, "kvtier::Tier::Tier: the Config is empty (moved from or released)");
        }
        detail::check(tier_new(config.get(), primary, primary_len, block_bytes, &tier_));
    }
#endif

    Tier(Tier &&other) noexcept : tier_(std::exchange(other.tier_, nullptr)) {}
    /** Frees the tier held, then takes other's; other becomes empty. */
    Tier &operator=(Tier &&other) noexcept {
        reset(other.release());
        return *this;
    }
    Tier(const Tier &) = delete;
    Tier &operator=(const Tier &) = delete;
    ~Tier() { tier_free(tier_); }

    tier_t *get() const noexcept { return tier_; }
    explicit operator bool() const noexcept { return tier_ != nullptr; }
    /** Gives up ownership; the caller frees the result with tier_free. */
    tier_t *release() noexcept { return std::exchange(tier_, nullptr); }
    /** Frees the tier held (tier_free), then holds `adopt`. */
    void reset(tier_t *adopt = nullptr) noexcept { tier_free(std::exchange(tier_, adopt)); }

    /** A one-line description for logs (see tier_describe); "" for an empty Tier. */
    std::string describe() const {
        return detail::text_of(
            [this](char *buf, std::size_t cap) { return tier_describe(tier_, buf, cap); });
    }

    /**
     * The tier's metrics in the Prometheus text format, ready to serve on a
     * /metrics endpoint (see tier_metrics); "" for an empty Tier.
     */
    std::string metrics() const {
        return detail::text_of(
            [this](char *buf, std::size_t cap) { return tier_metrics(tier_, buf, cap); });
    }

#ifndef KVTIER_NO_EXCEPTIONS
    /**
     * A descriptor that is readable exactly while finished results wait: add
     * it to an epoll set (EPOLLIN) and call poll() when it fires; nothing to
     * re-arm. The Tier owns it (closed with the Tier): never read, write or
     * close it. The same descriptor on every call. Throws Error (see
     * tier_completion_fd).
     */
    int completion_fd() { return detail::check(tier_completion_fd(tier_)); }

    /**
     * Has the library add 1 to the caller's eventfd `fd` each time a job of
     * `kind` completes, after its result is queued, until the Tier is freed.
     * The tier writes a duplicate: `fd` stays the caller's to read and close.
     * Throws Error (see tier_add_notify_fd).
     */
    void add_notify_fd(JobKind kind, int fd) {
        detail::check(tier_add_notify_fd(tier_, static_cast<std::uint32_t>(kind), fd));
    }

    /** Writes one state per key to `states` (at least keys.size() of them). See tier_lookup. */
    void lookup(Keys keys, Span<State> states) {
        // uint8_t is unsigned char, which may write any object's bytes.
        lookup(keys, Span<std::uint8_t>(reinterpret_cast<std::uint8_t *>(states.data()), states.size()));
    }

    /** As above, as TIER_MISS / TIER_HIT / TIER_PENDING bytes. */
    void lookup(Keys keys, Span<std::uint8_t> states) {
        detail::check_keys("lookup", keys);
        if (states.size() < keys.size()) {
            detail::invalid("lookup", "states holds " + std::to_string(states.size()) + " entries for " +
                                          std::to_string(keys.size()) + " keys");
        }
        detail::check(tier_lookup(tier_, keys.data(), keys.key_len(), keys.size(), states.data()));
    }

    /** Makes the stored keys most recently used, the first most of all. See tier_touch. */
    void touch(Keys keys) {
        detail::check_keys("touch", keys);
        detail::check(tier_touch(tier_, keys.data(), keys.key_len(), keys.size()));
    }

    /**
     * Submits a job copying primary rows block_ids[i] into the tier under
     * keys[i] (one block id per key). Its result comes from poll(), exactly
     * once. Throws Error if rejected (see tier_submit_store).
     */
    void submit_store(std::uint64_t job_id, Keys keys, Span<const std::int64_t> block_ids) {
        detail::check_rows("submit_store", keys, block_ids.size());
        detail::check(tier_submit_store(tier_, job_id, keys.data(), keys.key_len(), block_ids.data(), keys.size()));
    }

    /** Submits a job copying keys[i]'s block into primary row block_ids[i]. See tier_submit_load. */
    void submit_load(std::uint64_t job_id, Keys keys, Span<const std::int64_t> block_ids) {
        detail::check_rows("submit_load", keys, block_ids.size());
        detail::check(tier_submit_load(tier_, job_id, keys.data(), keys.key_len(), block_ids.data(), keys.size()));
    }

    /**
     * Submits a job storing keys[i] from the lengths[i] bytes at byte
     * offsets[i] of the primary buffer (KVTIER_1.1). `results` (empty, or
     * one per key) gets each key's outcome before the job is reported: keep
     * it alive until then. Throws Error if rejected (see
     * tier_submit_store_extents).
     */
    void submit_store_extents(std::uint64_t job_id, Keys keys, Span<const std::uint64_t> offsets,
                              Span<const std::uint64_t> lengths, Span<ItemResult> results = {}) {
        check_extents("submit_store_extents", keys, offsets, lengths, results);
        detail::check(tier_submit_store_extents(tier_, job_id, keys.data(), keys.key_len(), offsets.data(),
                                                lengths.data(), keys.size(), results_or_null(results),
                                                sizeof(ItemResult)));
    }

    /** Submits a job loading keys[i] into the extents; goes on past a failed key. See tier_submit_load_extents. */
    void submit_load_extents(std::uint64_t job_id, Keys keys, Span<const std::uint64_t> offsets,
                             Span<const std::uint64_t> lengths, Span<ItemResult> results = {}) {
        check_extents("submit_load_extents", keys, offsets, lengths, results);
        detail::check(tier_submit_load_extents(tier_, job_id, keys.data(), keys.key_len(), offsets.data(),
                                               lengths.data(), keys.size(), results_or_null(results),
                                               sizeof(ItemResult)));
    }

    /** Submits a job deleting keys from the tier and its storage. See tier_submit_delete. */
    void submit_delete(std::uint64_t job_id, Keys keys, Span<ItemResult> results = {}) {
        detail::check_keys("submit_delete", keys);
        if (!results.empty() && results.size() < keys.size()) {
            detail::invalid("submit_delete", "results holds " + std::to_string(results.size()) + " entries for " +
                                                 std::to_string(keys.size()) + " keys");
        }
        detail::check(tier_submit_delete(tier_, job_id, keys.data(), keys.key_len(), keys.size(),
                                         results_or_null(results), sizeof(ItemResult)));
    }

    /** Looks up keys and pins every HIT, writing one state per key. See tier_pin. */
    void pin(Keys keys, Span<State> states) {
        detail::check_keys("pin", keys);
        if (states.size() < keys.size()) {
            detail::invalid("pin", "states holds " + std::to_string(states.size()) + " entries for " +
                                       std::to_string(keys.size()) + " keys");
        }
        detail::check(tier_pin(tier_, keys.data(), keys.key_len(), keys.size(),
                               reinterpret_cast<std::uint8_t *>(states.data())));
    }

    /** Drops one pin of each key; unknown keys are ignored. See tier_unpin. */
    void unpin(Keys keys) {
        detail::check_keys("unpin", keys);
        detail::check(tier_unpin(tier_, keys.data(), keys.key_len(), keys.size()));
    }

    /**
     * Moves up to out.size() finished results, oldest first, into `out` and
     * returns how many (0 if none is ready). Never blocks; `out` must not be
     * empty. See tier_poll_finished.
     */
    [[nodiscard]] std::size_t poll(Span<JobResult> out) {
        std::size_t n = 0;
        detail::check(tier_poll_finished(tier_, out.data(), sizeof(tier_job_result_t),
                                         out.size(), &n));
        return n;
    }

    /**
     * Waits until a result is ready to poll (true) or `timeout` passes
     * (false). Does not consume results. See tier_wait.
     */
    bool wait(std::chrono::milliseconds timeout) {
        const std::chrono::milliseconds::rep ms = timeout.count();
        const std::uint32_t capped = ms <= 0 ? 0u : ms >= UINT32_MAX ? UINT32_MAX : static_cast<std::uint32_t>(ms);
        return detail::check(tier_wait(tier_, capped)) == TIER_OK;
    }

    /** Blocks until every accepted job's result is queued (not consumed). See tier_drain. */
    void drain() { detail::check(tier_drain(tier_)); }

    /** Drops every stored block. See tier_clear. */
    void clear() { detail::check(tier_clear(tier_)); }

    Stats stats() {
        Stats out{};
        detail::check(tier_stats(tier_, &out, sizeof(tier_stats_t)));
        return out;
    }

    /**
     * What the tier can do or is: its TIER_FEATURE_* bits, e.g.
     * `tier.features() & TIER_FEATURE_EXTENTS` before an extent job. See
     * tier_features (KVTIER_1.1).
     */
    std::uint64_t features() const {
        std::uint64_t out = 0;
        detail::check(tier_features(tier_, &out));
        return out;
    }

    /** True if the tier has `feature`, a TIER_FEATURE_* bit (see features()). */
    bool has(std::uint64_t feature) const { return (features() & feature) == feature; }

    /**
     * Moves up to out.size() block events, oldest first, into `out` and
     * returns how many (0 if none is waiting). Never blocks; `out` must not be
     * empty; the tier must have been created with events=true (else Error
     * TIER_ERR_CONFIG). See tier_poll_events.
     */
    [[nodiscard]] std::size_t poll_events(Span<Event> out) {
        std::size_t n = 0;
        detail::check(tier_poll_events(tier_, out.data(), sizeof(tier_event_t), out.size(), &n));
        return n;
    }
#endif  // KVTIER_NO_EXCEPTIONS

  private:
#ifndef KVTIER_NO_EXCEPTIONS
    static ItemResult *results_or_null(Span<ItemResult> results) {
        return results.empty() ? nullptr : results.data();
    }

    static void check_extents(const char *method, const Keys &keys, Span<const std::uint64_t> offsets,
                              Span<const std::uint64_t> lengths, Span<ItemResult> results) {
        detail::check_rows(method, keys, offsets.size());
        if (lengths.size() != keys.size()) {
            detail::invalid(method, std::to_string(lengths.size()) + " lengths for " +
                                        std::to_string(keys.size()) + " keys");
        }
        if (!results.empty() && results.size() < keys.size()) {
            detail::invalid(method, "results holds " + std::to_string(results.size()) + " entries for " +
                                        std::to_string(keys.size()) + " keys");
        }
    }
#endif  // KVTIER_NO_EXCEPTIONS

    tier_t *tier_ = nullptr;
};

}  // namespace kvtier

#endif  // KVTIER_HPP
