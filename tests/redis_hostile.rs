//! Hostile and broken Redis replies (issue 54), from a fake server inside
//! the test (tests/common/hostile.rs): no reply kills, hangs or bloats the
//! process, a job is reported once and within its deadline, and nothing
//! read on a connection out of step deletes a good block. See
//! docs/reliability-rules.md, "Replies a tier does not trust".

mod common;

use common::hostile::{bulk, rss_bytes, Answer, FakeRedis, FakeState};
use common::redis::redis_config_at;
use common::*;
use kvtier::{
    ErrorKind, EventKind, FailReason, LookupState, PrimaryBuffer, RemovedReason, Tier, TierConfig,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BB: usize = 4096;

/// Scheduling slack allowed past a deadline (a loaded 2-core machine): less
/// than what the overruns these tests catch cost (0.95 s and more).
const SLACK: Duration = Duration::from_millis(800);

/// The hostile replies to a command off the data path, by name.
fn hostile_replies() -> Vec<(&'static str, Answer)> {
    vec![
        ("$99999999999", Answer::Bytes(b"$99999999999\r\n".to_vec())),
        (
            "$i64::MAX",
            Answer::Bytes(b"$9223372036854775807\r\n".to_vec()),
        ),
        (
            "*i64::MAX",
            Answer::Bytes(b"*9223372036854775807\r\n".to_vec()),
        ),
        (
            "3 GiB streamed",
            Answer::Stream {
                head: b"$3221225472\r\n".to_vec(),
                piece: vec![b'x'; 1 << 20],
            },
        ),
        ("100,000 levels", Answer::Bytes(nested(100_000))),
    ]
}

/// `*1` nested `levels` deep around an integer (80 KB at 20,000 levels).
fn nested(levels: usize) -> Vec<u8> {
    let mut r = b"*1\r\n".repeat(levels);
    r.extend_from_slice(b":1\r\n");
    r
}

/// Whether a message says a reply broke a limit.
fn names_a_limit(message: &str) -> bool {
    message.contains("larger than the") || message.contains("nested deeper than")
}

/// Whether the tier reported a block removed as corrupt (events on).
fn counted_corrupt(h: &Harness) -> bool {
    let corrupt = EventKind::Removed(RemovedReason::Corrupt);
    h.events().iter().any(|&(kind, _)| kind == corrupt)
}

fn config(fake: &FakeRedis, capacity: usize, io_timeout_ms: u64) -> TierConfig {
    let mut c = with_events(redis_config_at(&fake.url(), capacity, BB), 4096);
    c.set("io_timeout_ms", &io_timeout_ms.to_string()).unwrap();
    c.set("io_threads", "2").unwrap();
    // Shared tiers need one; owned ones name their keys by it as well.
    c.set("namespace", "hostile").unwrap();
    c
}

fn open(config: &TierConfig) -> (kvtier::Result<Tier>, Duration, Buffer) {
    let buffer = Buffer::new(8 * BB);
    let primary = unsafe { PrimaryBuffer::new(buffer.ptr(), buffer.len(), BB) }.unwrap();
    let started = Instant::now();
    let tier = Tier::new(config, primary);
    (tier, started.elapsed(), buffer)
}

/// Waits `quiet` for any result and fails if one comes: a job is reported
/// once.
fn no_more_results(h: &Harness, quiet: Duration) {
    let until = Instant::now() + quiet;
    while Instant::now() < until {
        let extra = h.tier().poll(8);
        assert!(extra.is_empty(), "reported again: {extra:?}");
        h.tier().wait(Duration::from_millis(20));
    }
}

/// `tier_new` against a server whose answer to one of the commands it sends
/// (INFO asking whether it is a cluster, PING, CLUSTER SLOTS at open,
/// CLUSTER NODES and SCAN at adoption) is a huge declared length, a
/// streamed 3 GiB, or 100,000 levels of nesting: it fails with TIER_ERR_IO
/// at once, naming the limit, and the process keeps its memory (these
/// aborted it allocating the length, or overflowed a thread's stack).
#[test]
fn hostile_replies_at_tier_new_fail_it_cleanly() {
    let paths: [(&str, Option<&str>, &str); 5] = [
        ("INFO", None, "auto"),
        ("PING", None, "off"),
        ("CLUSTER", Some("SLOTS"), "on"),
        ("CLUSTER", Some("NODES"), "on"),
        ("SCAN", None, "off"),
    ];
    for (command, sub, cluster) in paths {
        for (what, answer) in hostile_replies() {
            let answer = std::sync::Mutex::new(Some(answer));
            let script = move |args: &[Vec<u8>], _: &FakeState| {
                let sub_matches =
                    sub.is_none_or(|sub| args.get(1).is_some_and(|a| a == sub.as_bytes()));
                if args[0] == command.as_bytes() && sub_matches {
                    if let Some(a) = answer.lock().unwrap().take() {
                        return a;
                    }
                }
                Answer::Normal
            };
            let fake = match cluster {
                "on" => FakeRedis::start_cluster(script),
                _ => FakeRedis::start(script),
            };
            let mut c = config(&fake, 8, 2000);
            c.set("cluster", cluster).unwrap();
            let path = format!("{command} {}", sub.unwrap_or(""));
            let rss = rss_bytes();
            let (tier, took, _buffer) = open(&c);
            let e = tier
                .err()
                .unwrap_or_else(|| panic!("{path} {what}: opened"));
            assert_eq!(e.kind(), ErrorKind::Io, "{path} {what}: {e}");
            assert!(names_a_limit(e.message()), "{path} {what}: {e}");
            assert!(took < Duration::from_secs(2), "{path} {what}: {took:?}");
            let grown = rss_bytes().saturating_sub(rss);
            assert!(grown < 64 << 20, "{path} {what}: RSS grew {grown} bytes");
        }
    }
}

/// A cluster whose CLUSTER SLOTS, read again after a MOVED, is hostile:
/// the refresh fails (the old map stays), the job follows the redirection
/// and succeeds, reported once.
#[test]
fn a_hostile_map_read_after_moved_costs_only_the_refresh() {
    for (what, answer) in hostile_replies() {
        let answer = std::sync::Mutex::new(Some(answer));
        let moved = AtomicUsize::new(0);
        let port = Arc::new(AtomicUsize::new(0));
        let at = Arc::clone(&port);
        let fake = FakeRedis::start_cluster(move |args, st| match args[0].as_slice() {
            // The first map (at open) is true; the next is hostile.
            b"CLUSTER" if st.count_sub("CLUSTER", "SLOTS") > 1 => {
                answer.lock().unwrap().take().unwrap_or(Answer::Normal)
            }
            b"GET" if moved.fetch_add(1, Ordering::SeqCst) == 0 => Answer::Bytes(
                format!("-MOVED 7 127.0.0.1:{}\r\n", at.load(Ordering::SeqCst)).into_bytes(),
            ),
            _ => Answer::Normal,
        });
        port.store(fake.port() as usize, Ordering::SeqCst);
        let mut c = config(&fake, 8, 2000);
        c.set("cluster", "on").unwrap();
        let h = Harness::new(&c, 8, BB);
        h.store_all(1, &[1]);
        // Past the map's shortest refresh interval (250 ms since open).
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        let r = h.load(2, &[1], &[3]);
        assert!(r.is_ok() && h.row_holds(3, 1), "{what}: {r:?}");
        assert!(started.elapsed() < Duration::from_secs(2) + SLACK, "{what}");
        assert_eq!(
            fake.count_sub("CLUSTER", "SLOTS"),
            2,
            "{what}: the map was read again"
        );
        no_more_results(&h, Duration::from_millis(200));
    }
}

/// A value found bad in its row is read again privately before it is
/// judged; a hostile reply to that re-read fails the load with
/// TIER_ERR_IO, deletes nothing and counts nothing CORRUPT. A hostile reply
/// to the DEL of a value truly condemned costs only that DEL.
#[test]
fn hostile_replies_to_a_reread_or_a_delete_fail_only_that_call() {
    for (what, answer) in hostile_replies() {
        let answer = std::sync::Mutex::new(Some(answer));
        let fake = FakeRedis::start(move |args, st| {
            let gets = st.count("GET");
            match args[0].as_slice() {
                // The direct read: the stored value, one payload byte off.
                b"GET" if gets == 1 => {
                    let mut v = st.values[&args[1]].clone();
                    *v.last_mut().unwrap() ^= 1;
                    Answer::Bytes(bulk(&v))
                }
                b"GET" if gets == 2 => answer.lock().unwrap().take().unwrap_or(Answer::Normal),
                _ => Answer::Normal,
            }
        });
        let h = Harness::new(&config(&fake, 8, 2000), 8, BB);
        h.store_all(1, &[1]);
        let stored = fake.values();
        let started = Instant::now();
        let r = h.load(2, &[1], &[3]);
        assert_eq!(r.error, Some(ErrorKind::Io), "{what}: {r:?}");
        assert!(started.elapsed() < Duration::from_secs(2) + SLACK, "{what}");
        assert_eq!(fake.count("DEL"), 0, "{what}: deleted");
        assert_eq!(fake.values(), stored, "{what}: the value changed");
        assert!(!counted_corrupt(&h), "{what}");
        // Read again, the value is good.
        assert!(h.load(3, &[1], &[4]).is_ok() && h.row_holds(4, 1), "{what}");
        no_more_results(&h, Duration::from_millis(100));
    }
    for (what, answer) in hostile_replies() {
        let answer = std::sync::Mutex::new(Some(answer));
        let fake = FakeRedis::start(move |args, _| match args[0].as_slice() {
            b"GET" => Answer::Bytes(bulk(b"garbage, not a block")),
            b"DEL" => answer.lock().unwrap().take().unwrap_or(Answer::Normal),
            _ => Answer::Normal,
        });
        let h = Harness::new(&config(&fake, 8, 2000), 8, BB);
        h.store_all(1, &[1]);
        let r = h.load(2, &[1], &[3]);
        assert_eq!(r.error, Some(ErrorKind::Corrupt), "{what}: {r:?}");
        assert_eq!(fake.count("DEL"), 1, "{what}");
        assert_eq!(h.lookup(&[1]), [LookupState::Miss], "{what}");
        no_more_results(&h, Duration::from_millis(100));
    }
}

/// Owned adoption against a SCAN cursor that never returns to 0: tier_new
/// returns after the adoption's deadline (10 x io_timeout_ms) with what it
/// adopted, and says so (it once looped for ever).
#[test]
fn a_scan_cursor_that_never_ends_costs_tier_new_its_deadline() {
    let fake = FakeRedis::start(|args, _| match args[0].as_slice() {
        b"SCAN" => Answer::Bytes(b"*2\r\n$2\r\n17\r\n*0\r\n".to_vec()),
        _ => Answer::Normal,
    });
    let c = config(&fake, 8, 200);
    let (tier, took, _buffer) = open(&c);
    let tier = tier.unwrap();
    let deadline = Duration::from_millis(10 * 200);
    assert!(took >= deadline && took < deadline + SLACK, "{took:?}");
    assert!(
        tier.describe()
            .contains("adoption at open stopped early: deadline reached"),
        "{}",
        tier.describe()
    );
    assert_eq!(tier.stats().num_blocks, 0);
    assert!(fake.count("SCAN") > 1);
}

/// Owned adoption against a server that floods matching names (a new page
/// of 1,000 every SCAN, the cursor never 0): adoption stops at its key
/// budget (2 keys per block of capacity), at once, and the tier holds its
/// capacity (it once grew to 1.9 GB in a minute).
#[test]
fn a_flood_of_names_stops_adoption_at_its_key_budget() {
    let next = AtomicUsize::new(0);
    let fake = FakeRedis::start(move |args, _| match args[0].as_slice() {
        b"SCAN" => {
            let prefix = String::from_utf8_lossy(args[3].strip_suffix(b"*").unwrap()).into_owned();
            let names: Vec<u8> = (0..1000)
                .flat_map(|_| {
                    let i = next.fetch_add(1, Ordering::SeqCst) as u64;
                    let hex: String = key(i).iter().map(|b| format!("{b:02x}")).collect();
                    bulk(format!("{prefix}{{{hex}}}").as_bytes())
                })
                .collect();
            let mut reply = b"*2\r\n$2\r\n17\r\n*1000\r\n".to_vec();
            reply.extend_from_slice(&names);
            Answer::Bytes(reply)
        }
        _ => Answer::Normal,
    });
    let c = config(&fake, 64, 2000);
    let rss = rss_bytes();
    let (tier, took, _buffer) = open(&c);
    let tier = tier.unwrap();
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(tier.stats().num_blocks, 64);
    assert_eq!(
        fake.count("SCAN"),
        1,
        "one page holds the budget of 128 keys"
    );
    assert!(
        tier.describe()
            .contains("adoption at open stopped early: key budget reached (128 keys"),
        "{}",
        tier.describe()
    );
    let grown = rss_bytes().saturating_sub(rss);
    assert!(grown < 64 << 20, "RSS grew {grown} bytes");
}

/// A server (or proxy) that answers once too often, with the answer or a
/// little after it: no good block is deleted, none counted corrupt, no
/// wrong byte loaded, on an owned tier sealed or not and an unsealed shared
/// one (it once deleted 62 of 64 good blocks).
#[test]
fn a_surplus_reply_deletes_no_good_block() {
    let variants: [(&str, &[(&str, &str)]); 3] = [
        ("owned", &[]),
        ("owned sealed", &[("seal_key", SEAL_A)]),
        ("shared", &[("sharing", "shared")]),
    ];
    for (what, settings) in variants {
        for later in [false, true] {
            let surplus_sent = AtomicUsize::new(0);
            let fake = FakeRedis::start(move |args, st| {
                // The fourth GET is answered twice: the second time with
                // another block's value (the first one stored).
                if args[0] == b"GET" && st.count("GET") == 4 {
                    surplus_sent.fetch_add(1, Ordering::SeqCst);
                    let other = st.values.values().next().unwrap().clone();
                    return match later {
                        false => Answer::NormalThen(bulk(&other)),
                        true => Answer::NormalThenLater(bulk(&other), Duration::from_millis(5)),
                    };
                }
                Answer::Normal
            });
            let mut c = config(&fake, 128, 2000);
            for (k, v) in settings {
                c.set(k, v).unwrap();
            }
            let h = Harness::new(&c, 8, BB);
            let ids: Vec<u64> = (1..=64).collect();
            for chunk in ids.chunks(8) {
                h.store_all(chunk[0], chunk);
            }
            let stored = fake.values();
            assert_eq!(stored.len(), 64, "{what}");
            let (mut ok, mut io) = (0, 0);
            for (job, &i) in ids.iter().enumerate() {
                let r = h.load(1000 + job as u64, &[i], &[2]);
                match r.error {
                    None => {
                        assert!(h.row_holds(2, i), "{what}: block {i} loaded wrong bytes");
                        ok += 1;
                    }
                    Some(ErrorKind::Io) => io += 1,
                    _ => panic!("{what}, later {later}: block {i}: {r:?}"),
                }
            }
            assert_eq!(fake.count("DEL"), 0, "{what}, later {later}: deleted");
            assert_eq!(
                fake.values(),
                stored,
                "{what}, later {later}: values changed"
            );
            assert!(!counted_corrupt(&h), "{what}, later {later}");
            assert!(
                ok >= 63 && ok + io == 64,
                "{what}, later {later}: {ok} ok, {io} io"
            );
        }
    }
}

/// A load whose values all fail their checksum in the row and whose
/// private re-reads are slow (600 ms each, io_timeout_ms 1000): the
/// re-reads share the job's deadline, so the job is reported within it,
/// once (each once got a fresh deadline: 4 re-reads took 3.7 s).
#[test]
fn slow_rereads_share_the_job_deadline() {
    let fake = FakeRedis::start(|args, st| match args[0].as_slice() {
        b"GET" if st.count("GET") <= 4 => {
            let mut v = st.values[&args[1]].clone();
            *v.last_mut().unwrap() ^= 1;
            Answer::Bytes(bulk(&v))
        }
        b"GET" => Answer::Delayed(Duration::from_millis(600)),
        _ => Answer::Normal,
    });
    let h = Harness::new(&config(&fake, 8, 1000), 8, BB);
    h.store_all(1, &[1, 2, 3, 4]);
    let started = Instant::now();
    h.tier()
        .submit_load(2, &keys(&[1, 2, 3, 4]), KEY_LEN, &[4, 5, 6, 7])
        .unwrap();
    let r = h.result_of(2);
    let took = started.elapsed();
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert_eq!(r.reason, FailReason::Deadline, "{r:?}");
    // The first re-read (600 ms) fits the deadline, the second cannot.
    assert!(r.num_done <= 1, "{r:?}");
    assert!(took < Duration::from_millis(1000) + SLACK, "{took:?}");
    no_more_results(&h, Duration::from_millis(1500));
    assert_eq!(fake.count("DEL"), 0);
}

/// A listening port whose accept queue is full: a connect to it waits
/// for ever (its SYN is dropped). Returns the port and what holds it.
fn port_that_never_accepts() -> (u16, impl Drop) {
    struct Held {
        fd: libc::c_int,
        _fillers: Vec<std::net::TcpStream>,
    }
    impl Drop for Held {
        fn drop(&mut self) {
            unsafe { libc::close(self.fd) };
        }
    }
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as _;
        addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(libc::listen(fd, 0), 0);
        let mut got = len;
        libc::getsockname(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut got);
        let port = u16::from_be(addr.sin_port);
        let mut fillers = Vec::new();
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        while let Ok(s) = std::net::TcpStream::connect_timeout(&to, Duration::from_millis(200)) {
            fillers.push(s);
            assert!(fillers.len() < 16, "the accept queue never fills");
        }
        (
            port,
            Held {
                fd,
                _fillers: fillers,
            },
        )
    }
}

/// A cluster that redirects (MOVED, after 950 ms) to a node whose port
/// never accepts: the connect on the later pass takes what is left of the
/// job's deadline, so each job is reported within io_timeout_ms, once (it
/// once got a fresh io_timeout_ms: 1.95 s here, 1.9 s seen for 1 s).
#[test]
fn a_moved_target_that_never_accepts_costs_at_most_the_job_deadline() {
    let (hole, _held) = port_that_never_accepts();
    let redirect = Arc::new(AtomicUsize::new(0));
    let on = Arc::clone(&redirect);
    let fake = FakeRedis::start_cluster(move |args, _| match args[0].as_slice() {
        // A slow first node: the redirection's pass starts 950 ms in.
        b"SET" | b"GET" if on.load(Ordering::SeqCst) == 1 => Answer::BytesAfter(
            format!("-MOVED 7 127.0.0.1:{hole}\r\n").into_bytes(),
            Duration::from_millis(950),
        ),
        _ => Answer::Normal,
    });
    let mut c = config(&fake, 8, 1000);
    c.set("cluster", "on").unwrap();
    let h = Harness::new(&c, 8, BB);
    // Block 2 stored before the slot moves, for the load to ask.
    h.store_all(10, &[2]);
    redirect.store(1, Ordering::SeqCst);
    // Past the map's shortest refresh interval, so each job reads it too.
    std::thread::sleep(Duration::from_millis(300));
    for job in 1..=2u64 {
        h.fill(0, job);
        let started = Instant::now();
        let r = match job {
            1 => h.store(job, &[job], &[0]),
            _ => h.load(job, &[job], &[0]),
        };
        let took = started.elapsed();
        assert_eq!(r.error, Some(ErrorKind::Io), "job {job}: {r:?}");
        assert!(
            took < Duration::from_millis(1000) + SLACK,
            "job {job}: {took:?}"
        );
        no_more_results(&h, Duration::from_millis(300));
    }
}

/// A shared tier that meets a value it cannot read (a newer format) does
/// not answer HIT for it again for a probe's time: the failed load's
/// verdict is kept as a MISS (it once answered HIT after every failed
/// load, and the engine loaded it again and again).
#[test]
fn a_shared_tier_keeps_an_unreadable_value_a_miss_for_the_probe_ttl() {
    let fake = FakeRedis::start(|_, _| Answer::Normal);
    let mut c = config(&fake, 8, 2000);
    c.set("sharing", "shared").unwrap();
    c.set("probe_ttl_ms", "1000").unwrap();
    let h = Harness::new(&c, 8, BB);
    h.store_all(1, &[1]);
    // Rewritten as a later format would write it: version 3, the header's
    // checksum (its last 8 bytes, 92 for a 36-byte key) made again.
    {
        let mut st = fake.state.lock().unwrap();
        let value = st.values.values_mut().next().unwrap();
        value[8..12].copy_from_slice(&3u32.to_le_bytes());
        let sum = twox_hash::XxHash64::oneshot(0, &value[..84]);
        value[84..92].copy_from_slice(&sum.to_le_bytes());
    }
    let r = h.load(2, &[1], &[3]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    let asked = fake.count("EXISTS");
    let failed_at = Instant::now();
    while failed_at.elapsed() < Duration::from_millis(500) {
        assert_eq!(h.lookup(&[1]), [LookupState::Miss]);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fake.count("EXISTS"), asked, "probed within the TTL");
    // After the TTL it is asked again (another version may have replaced it).
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        h.lookup_settled(&[1], Duration::from_secs(5)),
        [LookupState::Hit]
    );
    assert_eq!(fake.values().len(), 1, "the newer value is kept");
}
