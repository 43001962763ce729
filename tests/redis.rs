//! The Redis backend beyond the common contract (which tests/contract.rs and
//! tests/model.rs run on it too): verification, failures, sharing, adoption,
//! configuration errors, on real servers started by the tests.

mod common;

use common::redis::{raw_dbsize, redis_config_at, wait_until, Monitor, RedisCluster, RedisServer};
use common::*;
use kvtier::{
    ErrorKind, EventKind, JobResult, LookupState::*, PrimaryBuffer, RemovedReason, StoredReason,
    Tier, TierConfig,
};
use std::time::{Duration, Instant};

const BB: usize = 4096;

/// The cluster hash tag of test key `i`'s name (the name ends in `{<key hex>}`,
/// so its slot is the tag's).
fn hash_tag(i: u64) -> String {
    format!("{{{}}}", hex_of(i))
}

/// The key names the server holds under this tier's prefix.
fn names_on(server: &RedisServer, config: &TierConfig) -> Vec<String> {
    let out = server.cli(&[
        "--scan",
        "--pattern",
        &format!("{}:*", config.redis.key_prefix),
    ]);
    out.lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

fn open_err(config: &TierConfig) -> kvtier::Error {
    let mut rows = vec![0u8; 4 * BB];
    let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), BB) }.unwrap();
    Tier::new(config, primary).expect_err("tier_new should fail")
}

#[test]
fn values_are_verified_and_a_bad_one_is_deleted() {
    let server = redis_or_skip!();
    let config = with_events(redis_config_at(&server.url(), 8, BB), 64);
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[1, 2, 3, 4]);
    assert_eq!(h.events().len(), 4);
    let names = names_on(&server, &config);
    assert_eq!(names.len(), 4, "{names:?}");
    // Garbage under block 1's name, a truncated value under block 2's.
    let one = names
        .iter()
        .find(|n| n.ends_with(&format!("{}}}", hex_of(1))))
        .unwrap()
        .clone();
    let two = names
        .iter()
        .find(|n| n.ends_with(&format!("{}}}", hex_of(2))))
        .unwrap()
        .clone();
    server.cli(&["SET", &one, "garbage"]);
    server.cli(&["SETRANGE", &two, "100", "x"]);
    for (job, id, name) in [(2, 1, &one), (3, 2, &two)] {
        let r = h.load(job, &[id], &[5]);
        assert_eq!(r.error, Some(ErrorKind::Corrupt), "block {id}: {r:?}");
        assert_eq!(h.lookup(&[id]), [Miss]);
        assert_eq!(
            server.cli(&["EXISTS", name]),
            "0",
            "the bad value is deleted"
        );
        let corrupt = EventKind::Removed(RemovedReason::Corrupt);
        assert_eq!(h.events(), [(corrupt, id)]);
    }
    let r = h.load(4, &[3], &[5]);
    assert!(r.is_ok() && h.row_holds(5, 3), "{r:?}");
    // A value the server no longer has: not found, and reported as vanished.
    let four = names
        .iter()
        .find(|n| n.ends_with(&format!("{}}}", hex_of(4))))
        .unwrap();
    server.cli(&["DEL", four]);
    assert_eq!(h.load(5, &[4], &[5]).error, Some(ErrorKind::NotFound));
    let vanished = EventKind::Removed(RemovedReason::Vanished);
    assert_eq!(h.events(), [(vanished, 4)]);
}

fn hex_of(i: u64) -> String {
    key(i).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_server_restarted_empty_gives_not_found_then_miss() {
    let mut server = redis_or_skip!();
    let config = redis_config_at(&server.url(), 8, BB);
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[1, 2]);
    server.restart();
    // The pool's connections broke with the restart: the first operation
    // may fail with IO (reported, never hung); the next reconnects.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut job = 10;
    let r = loop {
        job += 1;
        let r = h.load(job, &[1], &[5]);
        if r.error != Some(ErrorKind::Io) || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    assert_eq!(h.lookup(&[1]), [Miss]);
    // The tier works on the new server.
    h.store_all(100, &[3]);
    assert!(h.load(101, &[3], &[6]).is_ok() && h.row_holds(6, 3));
}

#[test]
fn a_killed_server_fails_jobs_on_time_and_the_tier_recovers() {
    let mut server = redis_or_skip!();
    let mut config = redis_config_at(&server.url(), 64, BB);
    config.set("io_timeout_ms", "300").unwrap();
    let h = Harness::new(&config, 16, BB);
    h.store_all(1, &[1]);
    server.kill9();
    let started = Instant::now();
    for job in 2..22u64 {
        let ids = [job * 10, job * 10 + 1];
        h.tier()
            .submit_store(job, &keys(&ids), KEY_LEN, &[0, 1])
            .unwrap();
        // Lookups never wait for the server.
        let t = Instant::now();
        h.lookup(&[1, job * 10]);
        assert!(t.elapsed() < Duration::from_millis(50), "a lookup blocked");
    }
    h.tier().drain();
    let results = h.tier().poll(usize::MAX);
    assert_eq!(results.len(), 20, "every job reported once");
    assert!(
        results.iter().all(|r| r.error == Some(ErrorKind::Io)),
        "{results:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failures took {:?}",
        started.elapsed()
    );
    let r = h.load(30, &[1], &[5]);
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert_eq!(h.lookup(&[1]), [Hit], "a transient failure keeps the key");
    server.restart();
    // Back: stores succeed again once the backoff lets the pool reconnect.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut job = 40;
    loop {
        job += 1;
        h.fill(0, 500);
        let r = h.store(job, &[500], &[0]);
        if r.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "never reconnected: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(h.load(job + 1, &[500], &[7]).is_ok() && h.row_holds(7, 500));
}

#[test]
fn owned_tiers_adopt_their_keys_when_reopened_and_delete_what_they_evict() {
    let server = redis_or_skip!();
    let config = redis_config_at(&server.url(), 4, BB);
    {
        let mut h = Harness::new(&config, 8, BB);
        h.scratch_dir = None;
        h.store_all(1, &[1, 2, 3, 4]);
        h.store_all(2, &[5, 6]); // evicts two
        h.tier().drain();
        let deadline = Instant::now() + Duration::from_secs(5);
        while names_on(&server, &config).len() != 4 {
            assert!(Instant::now() < deadline, "evicted keys were not deleted");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let h = Harness::new(&with_events(config, 64), 8, BB);
    assert_eq!(h.tier().stats().num_blocks, 4);
    let present = h.present(&[1, 2, 3, 4, 5, 6]);
    assert_eq!(present.len(), 4, "{present:?}");
    let mut adopted = h.events();
    adopted.sort_unstable_by_key(|&(_, id)| id);
    let recovered = EventKind::Stored(StoredReason::Recovered);
    let want: Vec<_> = present.iter().map(|&i| (recovered, i)).collect();
    assert_eq!(adopted, want, "adopted keys are announced");
    let rows: Vec<i64> = (0..4).collect();
    assert!(h.load(3, &present, &rows).is_ok());
    for (row, &i) in present.iter().enumerate() {
        assert!(h.row_holds(row, i));
    }
}

/// A full owned tier under a stream of stores, with more jobs in flight than
/// it has workers, keeps the server near its capacity: the deletes of what
/// its stores evict are not left behind the stores (before, they waited
/// until no store was queued, and the server held every key stored).
#[test]
fn a_stream_of_stores_leaves_the_server_near_capacity() {
    let server = redis_or_skip!();
    // 64 KiB blocks: jobs long enough that the queue never runs dry
    // between the polls.
    let (capacity, job_blocks, window, jobs, block) = (512, 16, 16, 120, 64 << 10);
    let mut config = redis_config_at(&server.url(), capacity, block);
    config.set("io_threads", "2").unwrap();
    let h = Harness::new(&config, job_blocks, block);
    let port = server.port();
    let most = h.stream_stores(1000, jobs, job_blocks, window, 5, || {
        raw_dbsize(port).expect("DBSIZE")
    });
    let bound = Harness::stream_bound(capacity, window, job_blocks);
    assert!(
        most <= bound,
        "the server held {most} keys of a {capacity}-block tier (bound {bound}; {} stored)",
        jobs as usize * job_blocks
    );
    h.tier().drain();
    assert!(
        wait_until(Duration::from_secs(5), || raw_dbsize(port)
            == Some(capacity)),
        "{:?} keys left, want {capacity}",
        raw_dbsize(port)
    );
}

/// While the tier fills up (a store evicts nothing), a job's blocks go as
/// tasks of two blocks, each its own pipeline on its own connection: the
/// server takes values that are fresh memory faster that way
/// (docs/runs/redis.md, "The bound's shape"). Once the tier is full and
/// every store evicts, a job is one pipeline on one connection again. The
/// server is frozen while the filling job is sent, so that its tasks are
/// all in flight at once.
#[test]
fn a_filling_tier_spreads_a_job_over_connections_and_a_full_one_does_not() {
    let server = redis_or_skip!();
    const JOB: u64 = 16;
    let mut config = redis_config_at(&server.url(), JOB as usize, BB);
    config.set("io_threads", "4").unwrap();
    config.set("connections", "4").unwrap();
    let prefix = config.redis.key_prefix.clone();
    let h = Harness::new(&config, 2 * JOB as usize, BB);
    let mut monitor = Monitor::start(server.port());
    for i in 0..2 * JOB {
        h.fill(i as usize, i);
    }
    let filling: Vec<u64> = (0..JOB).collect();
    let evicting: Vec<u64> = (JOB..2 * JOB).collect();
    let rows = |ids: &[u64]| -> Vec<i64> { ids.iter().map(|&i| i as i64).collect() };

    server.freeze();
    h.tier()
        .submit_store(1, &keys(&filling), KEY_LEN, &rows(&filling))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    server.thaw();
    let r = h.result_of(1);
    assert!(r.is_ok(), "{r:?}");
    let clients = monitor.clients_of("SET", &prefix, JOB as usize, Duration::from_secs(10));
    let mut spread = clients.clone();
    spread.sort();
    spread.dedup();
    assert!(
        spread.len() >= 2,
        "a filling tier's job went over {} connection(s): {clients:?}",
        spread.len()
    );

    let r = h.store(2, &evicting, &rows(&evicting));
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        h.tier().stats().evictions,
        JOB,
        "the second job evicts the first"
    );
    let clients = monitor.clients_of("SET", &prefix, JOB as usize, Duration::from_secs(10));
    assert!(
        clients.iter().all(|c| *c == clients[0]),
        "a full tier's job went over several connections: {clients:?}"
    );
    for &i in &evicting {
        h.write_row(i as usize, &[0u8; BB]);
    }
    let r = h.load(3, &evicting, &rows(&evicting));
    assert!(r.is_ok(), "{r:?}");
    for &i in &evicting {
        assert!(h.row_holds(i as usize, i), "block {i}");
    }
}

/// A cluster tier deletes what it evicts too: one job's evictions are one
/// DEL pipeline per master (keys of one job hash to different slots).
/// Counted on every master.
#[test]
fn a_cluster_tier_deletes_what_it_evicts_on_every_node() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 8, BB);
    config.set("cluster", "on").unwrap();
    let pattern = format!("{}:*", config.redis.key_prefix);
    let names = || -> usize {
        cluster
            .masters()
            .iter()
            .map(|m| {
                cluster
                    .cli_at(m.port, &["--scan", "--pattern", &pattern])
                    .lines()
                    .filter(|l| !l.is_empty())
                    .count()
            })
            .sum()
    };
    let mut h = Harness::new(&config, 8, BB);
    h.scratch_dir = None;
    let first: Vec<u64> = (1..=8).collect();
    h.store_all(1, &first);
    assert_eq!(names(), 8);
    let spread = cluster
        .masters()
        .iter()
        .filter(|m| {
            !cluster
                .cli_at(m.port, &["--scan", "--pattern", &pattern])
                .trim()
                .is_empty()
        })
        .count();
    assert!(spread >= 2, "8 keys on {spread} of 3 masters");
    // Eight new keys evict all eight old ones, in one batch of deletes.
    let second: Vec<u64> = (11..=18).collect();
    h.store_all(2, &second);
    h.tier().drain();
    let deadline = Instant::now() + Duration::from_secs(10);
    while names() != 8 {
        assert!(
            Instant::now() < deadline,
            "{} keys on the cluster, the tier holds 8: evicted keys were not deleted",
            names()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(h.present(&first), Vec::<u64>::new());
    let rows: Vec<i64> = (0..8).collect();
    assert!(h.load(3, &second, &rows).is_ok());
    for (row, &i) in second.iter().enumerate() {
        assert!(h.row_holds(row, i));
    }
}

/// One lookup of many keys a shared tier has not seen: every key PENDING,
/// then each its own verdict (the keys are asked in pipelines of up to 64,
/// on a cluster each to its own master), HIT exactly for the stored ones.
fn a_lookup_of_many_unseen_keys_gets_each_verdict(config: TierConfig) {
    let mut config = config;
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    let writer = Harness::new(&config, 10, BB);
    let stored: Vec<u64> = (1..=150).filter(|i| i % 3 == 0).collect();
    for (job, ids) in stored.chunks(10).enumerate() {
        writer.store_all(job as u64 + 1, ids);
    }
    let reader = Harness::new(&config, 10, BB);
    let all: Vec<u64> = (1..=150).collect();
    assert!(reader.lookup(&all).iter().all(|&s| s == Pending));
    let states = reader.lookup_settled(&all, Duration::from_secs(10));
    for (&i, &state) in all.iter().zip(&states) {
        let want = if i % 3 == 0 { Hit } else { Miss };
        assert_eq!(state, want, "key {i}");
    }
    let rows: Vec<i64> = (0..10).collect();
    assert!(reader.load(1, &stored[..10], &rows).is_ok());
    for (row, &i) in stored[..10].iter().enumerate() {
        assert!(reader.row_holds(row, i));
    }
}

#[test]
fn a_lookup_of_many_unseen_keys_gets_each_verdict_on_a_server() {
    let server = redis_or_skip!();
    a_lookup_of_many_unseen_keys_gets_each_verdict(redis_config_at(&server.url(), 256, BB));
}

#[test]
fn a_lookup_of_many_unseen_keys_gets_each_verdict_on_a_cluster() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("cluster", "on").unwrap();
    a_lookup_of_many_unseen_keys_gets_each_verdict(config);
}

/// A cluster master killed: a shared lookup's keys on the live masters
/// still get their verdicts (HIT for the stored ones), and only the dead
/// master's keys read MISS. The keys of one lookup are probed together, so
/// a pipeline split by master must not fail as a whole with one master.
#[test]
fn a_dead_cluster_master_costs_shared_lookups_only_its_own_keys() {
    let mut cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("cluster", "on").unwrap();
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    config.set("io_timeout_ms", "500").unwrap();
    let writer = Harness::new(&config, 10, BB);
    let ids: Vec<u64> = (1..=60).collect();
    let stored: Vec<u64> = ids.iter().copied().filter(|i| i % 2 == 0).collect();
    for (job, chunk) in stored.chunks(10).enumerate() {
        writer.store_all(job as u64 + 1, chunk);
    }
    let reader = Harness::new(&config, 10, BB);
    let dead = cluster.kill9_master(0);
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    assert!(reader.lookup(&ids).iter().all(|&s| s == Pending));
    // Within the cluster's node timeout (2 s), before the live masters
    // would call the cluster down.
    let states = reader.lookup_settled(&ids, Duration::from_millis(1500));
    let mut hits_on_live_masters = 0;
    for (&i, &state) in ids.iter().zip(&states) {
        let want = if i % 2 == 0 && !dead.serves(slot_of(i)) {
            hits_on_live_masters += 1;
            Hit
        } else {
            Miss
        };
        assert_eq!(
            state,
            want,
            "key {i} (on the dead master: {})",
            dead.serves(slot_of(i))
        );
    }
    assert!(hits_on_live_masters > 0, "stored keys on the live masters");
}

/// A cluster master hung (SIGSTOP): a shared lookup's keys on the live
/// masters get their verdicts as those masters answer, long before the
/// 4 s deadline; the hung master's keys read MISS (at the deadline).
#[test]
fn a_hung_cluster_master_delays_only_its_own_keys_verdicts() {
    let cluster = redis_or_skip!(RedisCluster::start_with(
        3,
        0,
        &[("cluster-node-timeout", "60000")]
    ));
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("cluster", "on").unwrap();
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    config.set("io_timeout_ms", "4000").unwrap();
    let writer = Harness::new(&config, 30, BB);
    let ids: Vec<u64> = (1..=60).collect();
    let stored: Vec<u64> = ids.iter().copied().filter(|i| i % 2 == 0).collect();
    writer.store_all(1, &stored);
    let reader = Harness::new(&config, 10, BB);
    let hung = cluster.masters()[0].clone();
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    let (on_hung, on_live): (Vec<u64>, Vec<u64>) =
        ids.iter().partition(|&&i| hung.serves(slot_of(i)));
    assert!(!on_hung.is_empty() && !on_live.is_empty());
    cluster.server(hung.port).freeze();
    let started = Instant::now();
    assert!(reader.lookup(&ids).iter().all(|&s| s == Pending));
    let live = reader.lookup_settled(&on_live, Duration::from_millis(1500));
    let live_took = started.elapsed();
    let hung_states = reader.lookup_settled(&on_hung, Duration::from_secs(10));
    let hung_took = started.elapsed();
    cluster.server(hung.port).thaw();
    for (&i, &state) in on_live.iter().zip(&live) {
        assert_eq!(state, if i % 2 == 0 { Hit } else { Miss }, "key {i}");
    }
    assert!(hung_states.iter().all(|&s| s == Miss), "{hung_states:?}");
    println!("live masters' verdicts after {live_took:?}, the hung one's after {hung_took:?}");
}

#[test]
fn shared_tiers_find_each_others_blocks_and_delete_nothing() {
    let server = redis_or_skip!();
    let mut a = redis_config_at(&server.url(), 2, BB);
    a.set("sharing", "shared").unwrap();
    a.set("namespace", "shared-test").unwrap();
    a.probe_ttl_ms = 20;
    let mut b = a.clone(); // same key prefix: one keyspace
    b.io_threads = Some(3);
    let writer = Harness::new(&with_events(a.clone(), 64), 8, BB);
    let reader = Harness::new(&with_events(b, 64), 8, BB);
    assert_eq!(
        reader.lookup(&[1]),
        [Pending],
        "an unseen key is asked of the server"
    );
    writer.store_all(1, &[1, 2]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while reader.lookup(&[1, 2]) != [Hit, Hit] {
        assert!(
            Instant::now() < deadline,
            "never found the other tier's blocks"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = reader.load(1, &[1, 2], &[4, 5]);
    assert!(
        r.is_ok() && reader.row_holds(4, 1) && reader.row_holds(5, 2),
        "{r:?}"
    );
    let mut found = reader.events();
    found.sort_unstable_by_key(|&(_, id)| id);
    let by_probe = EventKind::Stored(StoredReason::Found);
    assert_eq!(found, [(by_probe, 1), (by_probe, 2)]);
    // The writer's capacity is 2: storing 3 and 4 evicts 1 and 2 from its
    // index, but in a shared keyspace nothing is deleted.
    writer.store_all(2, &[3, 4]);
    writer.tier().drain();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(names_on(&server, &a).len(), 4);
    assert!(reader.load(2, &[1], &[6]).is_ok() && reader.row_holds(6, 1));
    // Events tell what this tier's index holds: 1 and 2 left the writer's
    // (though not the keyspace).
    let (written, evicted) = (
        EventKind::Stored(StoredReason::Written),
        EventKind::Removed(RemovedReason::Evicted),
    );
    let got = writer.events();
    assert_eq!(&got[..2], [(written, 1), (written, 2)]);
    let mut gone: Vec<_> = got[2..4].to_vec();
    gone.sort_unstable_by_key(|&(_, id)| id);
    assert_eq!(gone, [(evicted, 1), (evicted, 2)]);
    assert_eq!(&got[4..], [(written, 3), (written, 4)]);
}

#[test]
fn server_eviction_under_maxmemory_gives_not_found_then_miss() {
    let server = redis_or_skip!(RedisServer::start_with(&[
        ("maxmemory", "2mb"),
        ("maxmemory-policy", "allkeys-lru"),
    ]));
    let mut config = redis_config_at(&server.url(), 4096, BB);
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    let h = Harness::new(&config, 16, BB);
    for job in 0..100u64 {
        let ids: Vec<u64> = (job * 16..job * 16 + 16).collect();
        h.store_all(job, &ids);
    }
    // Which blocks the server evicted is the server's choice: its LRU clock
    // ticks once a second, so within this fill every key looks equally old
    // and any may survive; and near the limit any command (a probe, a load)
    // may make it evict one more. Lift the limit so that the set it kept
    // stays put, then ask it which are gone.
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let names = names_on(&server, &config);
    assert!(names.len() < 1600, "the server evicted nothing");
    let evicted = (0..1600u64)
        .find(|&i| !names.iter().any(|n| n.ends_with(&hash_tag(i))))
        .unwrap();
    // Gone from the server but still in the index.
    assert_eq!(h.lookup(&[evicted]), [Hit]);
    let r = h.load(1000, &[evicted], &[0]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    // Forgotten: in a shared keyspace the server is asked again, and says no.
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.lookup(&[evicted]) != [Miss] {
        assert!(Instant::now() < deadline, "never settled on MISS");
        std::thread::sleep(Duration::from_millis(5));
    }
    let kept = (0..1600u64)
        .rev()
        .find(|&i| names.iter().any(|n| n.ends_with(&hash_tag(i))))
        .unwrap();
    let r = h.load(1001, &[kept], &[1]);
    assert!(r.is_ok() && h.row_holds(1, kept), "{r:?}");
}

#[test]
fn bad_settings_and_unreachable_servers_fail_tier_new_clearly() {
    let server = redis_or_skip!(RedisServer::start_with(&[("requirepass", "s3cret-pw")]));
    let mut config = redis_config_at("redis://127.0.0.1:1", 8, BB);
    // Nothing listens on port 1.
    config.set("io_timeout_ms", "500").unwrap();
    let err = open_err(&config);
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");

    let wrong = format!("redis://:wrong-pw@127.0.0.1:{}", server.port());
    // Refused whether the cluster question or the first PING meets it.
    for cluster in ["auto", "off"] {
        let mut config = redis_config_at(&wrong, 8, BB);
        config.set("cluster", cluster).unwrap();
        let err = open_err(&config);
        assert_eq!(err.kind(), ErrorKind::Config, "cluster={cluster}: {err}");
        assert!(err.message().contains("authentication"), "{err}");
        assert!(
            !err.message().contains("wrong-pw"),
            "the password leaked: {err}"
        );
    }

    let right = format!("redis://:s3cret-pw@127.0.0.1:{}", server.port());
    let config = redis_config_at(&right, 8, BB);
    let h = Harness::new(&config, 8, BB);
    assert!(
        !h.tier().describe().contains("s3cret"),
        "{}",
        h.tier().describe()
    );
    h.store_all(1, &[1]);

    let mut config = memory_config(8, BB);
    config.set("backend", "redis").unwrap();
    assert_eq!(open_err(&config).kind(), ErrorKind::Config, "no url");
}

/// kvtier's own connection (plain TCP) does what the URL says at connect:
/// `AUTH <user> <password>` for an ACL user, `SELECT <db>`; blocks land in
/// that database and come back byte-exact; a wrong ACL password is a
/// configuration error.
#[test]
fn acl_users_and_databases_from_the_url_are_honoured() {
    let server = redis_or_skip!(RedisServer::start());
    server.cli(&[
        "ACL",
        "SETUSER",
        "engine",
        "on",
        ">engine-pw",
        "~*",
        "+@all",
    ]);
    let url = format!("redis://engine:engine-pw@127.0.0.1:{}/3", server.port());
    let config = redis_config_at(&url, 8, BB);
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[1, 2, 3]);
    let in_db3 = server.cli(&[
        "-n",
        "3",
        "--scan",
        "--pattern",
        &format!("{}:*", config.redis.key_prefix),
    ]);
    assert_eq!(
        in_db3.lines().filter(|l| !l.is_empty()).count(),
        3,
        "{in_db3}"
    );
    assert!(names_on(&server, &config).is_empty(), "nothing in db 0");
    for (i, row) in [(1u64, 4i64), (2, 5), (3, 6)] {
        let r = h.load(10 + i, &[i], &[row]);
        assert!(r.error.is_none(), "{r:?}");
        assert!(h.row_holds(row as usize, i), "block {i}");
    }

    let wrong = format!("redis://engine:nope@127.0.0.1:{}/3", server.port());
    let mut config = redis_config_at(&wrong, 8, BB);
    config.set("cluster", "off").unwrap();
    let err = open_err(&config);
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// `rediss://` on kvtier's own connection (the data path over TLS: SETs
/// from the rows, GET replies into them), to a server whose certificate
/// (made with openssl) the tier trusts through SSL_CERT_FILE, set in child
/// processes so that no other test sees it. Untrusted (the system's roots,
/// or another CA's bundle) or `#insecure`, `tier_new` fails. `cluster=off`
/// throughout: the server is not asked whether it is a cluster.
#[test]
fn tls_connections_are_encrypted_and_verified() {
    let Some(certs) = common::redis::TestCerts::make() else {
        return;
    };
    let server = redis_or_skip!(RedisServer::start_tls(&certs));
    let url = server.tls_url();
    let off = |mut config: TierConfig| {
        config.set("cluster", "off").unwrap();
        config
    };
    // Not trusted: the certificate is nobody's root.
    let err = open_err(&off(redis_config_at(&url, 8, BB)));
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // No verification on request: refused, as the redis crate refuses it.
    let err = open_err(&off(redis_config_at(&format!("{url}/#insecure"), 8, BB)));
    assert!(err.to_string().contains("insecure"), "{err}");
    // Trusted in a child process.
    let child = |name: &str, ca: &std::path::Path, url: &str| {
        let out = test_child(name)
            .env("SSL_CERT_FILE", ca)
            .env("KVTIER_CHILD_URL", url)
            .env("KVTIER_CHILD_PORT", server.tls_port().to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && stdout.contains("tls child: done"),
            "{name}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    child("tls_child", &certs.ca, &url);
    // The blocks went through the TLS port and are on the server, but for
    // the corrupted one, deleted.
    assert_eq!(server.cli(&["DBSIZE"]), "5");
    // Another CA's bundle: refused, naming the certificate, never the password.
    let with_password = format!("rediss://:hunter2@127.0.0.1:{}", server.tls_port());
    child("tls_wrong_ca_child", &certs.other_ca(), &with_password);
}

/// A count `tier_describe` shows just before `what` (e.g. " blocks
/// rerouted"): a cluster tier's slot map reads and the blocks sent again
/// after a redirection (or for want of a master known for their slot).
fn described_count(h: &Harness, what: &str) -> u64 {
    let line = h.tier().describe();
    let at = line
        .find(what)
        .unwrap_or_else(|| panic!("{what:?} not in {line}"));
    line[..at].rsplit(' ').next().unwrap().parse().unwrap()
}

/// MOVED replies the cluster's masters sent so far (`INFO errorstats`).
fn moved_replies(cluster: &RedisCluster) -> u64 {
    cluster
        .masters()
        .iter()
        .map(|m| {
            cluster
                .cli_at(m.port, &["INFO", "errorstats"])
                .lines()
                .find_map(|l| l.strip_prefix("errorstat_MOVED:count="))
                .map_or(0, |n| n.trim().parse::<u64>().unwrap())
        })
        .sum()
}

/// One job's blocks on all three masters: each master's share goes in one
/// direct pipeline and lands in its rows byte-exact (in rows of another
/// order than the keys'), none rerouted.
#[test]
fn a_cluster_job_over_every_master_lands_in_its_rows_byte_exact() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("cluster", "on").unwrap();
    let h = Harness::new(&config, 64, BB);
    let masters = cluster.masters();
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    let ids: Vec<u64> = (0..64).collect();
    h.store_all(1, &ids);
    for m in &masters {
        let theirs = ids.iter().filter(|&&i| m.serves(slot_of(i))).count();
        assert!(theirs > 0, "master {} serves none of the keys", m.port);
        let held: usize = cluster.cli_at(m.port, &["DBSIZE"]).parse().unwrap();
        assert_eq!(held, theirs, "master {} holds its slots' blocks", m.port);
    }
    for row in 0..64 {
        h.write_row(row, &[0u8; BB]);
    }
    let rows: Vec<i64> = (0..64).rev().collect();
    let r = h.load(2, &ids, &rows);
    assert!(r.is_ok() && r.num_done == 64, "{r:?}");
    for (&row, &i) in rows.iter().zip(&ids) {
        assert!(h.row_holds(row as usize, i), "block {i} in row {row}");
    }
    assert_eq!(described_count(&h, " blocks rerouted"), 0);
}

/// Fewer connections per master than I/O threads: concurrent jobs over
/// every master take turns for the connections (a job never waits for one
/// master's connection while it holds another's; a master it could not get
/// at once is served once it holds none), and every block lands byte-exact.
#[test]
fn concurrent_cluster_jobs_share_one_connection_per_master() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 1024, BB);
    config.set("cluster", "on").unwrap();
    config.set("connections", "1").unwrap();
    config.set("io_threads", "6").unwrap();
    let h = Harness::new(&config, 64, BB);
    const JOBS: u64 = 16;
    const PER_JOB: u64 = 4;
    let job_ids = |j: u64| -> Vec<u64> { (j * PER_JOB..(j + 1) * PER_JOB).collect() };
    let job_rows = |j: u64| -> Vec<i64> {
        (0..PER_JOB as i64)
            .map(|k| (j * PER_JOB) as i64 + k)
            .collect()
    };
    for j in 0..JOBS {
        for (&i, &row) in job_ids(j).iter().zip(&job_rows(j)) {
            h.fill(row as usize, i);
        }
    }
    let all_done = |kind: &str| {
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen.len() < JOBS as usize {
            assert!(
                Instant::now() < deadline,
                "{kind}: {} of {JOBS} jobs finished",
                seen.len()
            );
            for r in h.tier().poll(64) {
                assert!(r.is_ok(), "{kind}: {r:?}");
                seen.push(r.job_id);
            }
            h.tier().wait(Duration::from_millis(10));
        }
    };
    for j in 0..JOBS {
        h.tier()
            .submit_store(j, &keys(&job_ids(j)), KEY_LEN, &job_rows(j))
            .unwrap();
    }
    all_done("stores");
    for row in 0..64 {
        h.write_row(row, &[0u8; BB]);
    }
    for j in 0..JOBS {
        h.tier()
            .submit_load(100 + j, &keys(&job_ids(j)), KEY_LEN, &job_rows(j))
            .unwrap();
    }
    all_done("loads");
    for j in 0..JOBS {
        for (&i, &row) in job_ids(j).iter().zip(&job_rows(j)) {
            assert!(h.row_holds(row as usize, i), "block {i} in row {row}");
        }
    }
    assert_eq!(described_count(&h, " blocks rerouted"), 0);
}

/// Moves `slots` slots from the first master to the second with
/// `redis-cli --cluster reshard`, waits until every node agrees on the new
/// owners (a tier may ask any of them), and returns both masters as they
/// were before and are now.
fn move_slots(
    cluster: &RedisCluster,
    slots: u32,
) -> (common::redis::ClusterNode, common::redis::ClusterNode) {
    let masters = cluster.masters();
    let (from, to) = (masters[0].clone(), &masters[1]);
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{}", to.port)])
        .args(["--cluster-from", &from.id, "--cluster-to", &to.id])
        .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster reshard");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let owners = |port: u16| -> Vec<(String, Vec<(u16, u16)>)> {
        let mut owners: Vec<_> = cluster
            .nodes_seen_by(port)
            .into_iter()
            .filter(|n| n.role == common::redis::Role::Master)
            .map(|n| (n.id, n.slots))
            .collect();
        owners.sort();
        owners
    };
    let ports = cluster.ports();
    assert!(
        common::redis::wait_until(Duration::from_secs(30), || {
            ports.iter().all(|&p| owners(p) == owners(ports[0]))
        }),
        "the nodes never agreed on the moved slots"
    );
    let now_to = cluster
        .masters()
        .into_iter()
        .find(|m| m.id == to.id)
        .unwrap();
    (from, now_to)
}

/// Slots move after a shared tier read its slot map: its probes of keys
/// on the moved slots meet MOVED from their old master and are asked
/// again where MOVED sends them, so each stored key still reads HIT.
#[test]
fn a_stale_slot_map_costs_shared_lookups_no_verdict() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 1024, BB);
    config.set("cluster", "on").unwrap();
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    let writer = Harness::new(&config, 32, BB);
    let ids: Vec<u64> = (0..64).collect();
    let stored: Vec<u64> = ids.iter().copied().filter(|i| i % 2 == 0).collect();
    writer.store_all(1, &stored);
    let reader = Harness::new(&config, 16, BB);
    let (from, now_to) = move_slots(&cluster, 4000);
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    let moved = |i: u64| from.serves(slot_of(i)) && now_to.serves(slot_of(i));
    assert!(
        stored.iter().any(|&i| moved(i)),
        "no stored key on a moved slot"
    );
    let before = moved_replies(&cluster);
    assert!(reader.lookup(&ids).iter().all(|&s| s == Pending));
    let states = reader.lookup_settled(&ids, Duration::from_secs(10));
    for (&i, &state) in ids.iter().zip(&states) {
        let want = if i % 2 == 0 { Hit } else { Miss };
        assert_eq!(state, want, "key {i} (slot moved: {})", moved(i));
    }
    assert!(
        moved_replies(&cluster) > before,
        "the reader's slot map should have been stale"
    );
    assert!(described_count(&reader, " blocks rerouted") > 0);
}

/// Slots move between two jobs of one tier: the second job's blocks on the
/// moved slots meet MOVED from their old master (the tier's slot map is
/// stale), are stored and loaded byte-exact all the same, and the map is
/// read again, so a third job meets no MOVED at all.
#[test]
fn a_stale_slot_map_is_refreshed_and_costs_no_block() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 1024, BB);
    config.set("cluster", "on").unwrap();
    let h = Harness::new(&config, 64, BB);
    let ids: Vec<u64> = (0..64).collect();
    h.store_all(1, &ids);
    let (from, now_to) = move_slots(&cluster, 4000);
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    let moved = |i: &u64| from.serves(slot_of(*i)) && now_to.serves(slot_of(*i));
    assert!(ids.iter().any(moved), "no test block on a moved slot");
    let reads = described_count(&h, " times;");
    let before = moved_replies(&cluster);

    // The second job: loads and stores on the stale map.
    let rows: Vec<i64> = (0..64).collect();
    let r = h.load(2, &ids, &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!(ids.iter().enumerate().all(|(row, &i)| h.row_holds(row, i)));
    let fresh: Vec<u64> = (100..164).collect();
    assert!(fresh.iter().any(moved));
    h.store_all(3, &fresh);
    assert!(
        moved_replies(&cluster) > before,
        "the tier's slot map should have been stale"
    );
    assert!(described_count(&h, " blocks rerouted") > 0);
    assert!(
        described_count(&h, " times;") > reads,
        "the map was read again"
    );
    // The same counts in the tier's metrics (tier_metrics).
    let metrics = h.tier().metrics();
    let counter = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.split_once("} ")?.1.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    assert!(counter("kvtier_redis_moved_total{") > 0, "{metrics}");
    assert_eq!(
        counter("kvtier_redis_rerouted_blocks_total{"),
        described_count(&h, " blocks rerouted")
    );
    assert_eq!(
        counter("kvtier_redis_slot_map_reads_total{"),
        described_count(&h, " times;")
    );

    // The third: the map is current, no block meets MOVED.
    let after = moved_replies(&cluster);
    let rerouted = described_count(&h, " blocks rerouted");
    for row in 0..64 {
        h.write_row(row, &[0u8; BB]);
    }
    let r = h.load(4, &fresh, &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!(fresh
        .iter()
        .enumerate()
        .all(|(row, &i)| h.row_holds(row, i)));
    let more: Vec<u64> = (200..264).collect();
    h.store_all(5, &more);
    let r = h.load(6, &ids, &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!(ids.iter().enumerate().all(|(row, &i)| h.row_holds(row, i)));
    assert_eq!(moved_replies(&cluster), after, "MOVED after the refresh");
    assert_eq!(described_count(&h, " blocks rerouted"), rerouted);
}

/// After garbage was written under block 3's name (blocks 3, 4 and 5 stored
/// by `h`, events on): its load fails Corrupt, it is a MISS with a Removed
/// (Corrupt) event, and the connection serves the next load.
fn garbage_in_block_3_is_corrupt_then_a_miss(h: &Harness) {
    let r = h.load(3, &[3], &[0]);
    assert_eq!(r.error, Some(ErrorKind::Corrupt), "{r:?}");
    assert_eq!(h.lookup(&[3]), [Miss]);
    let corrupt = EventKind::Removed(RemovedReason::Corrupt);
    assert_eq!(h.events(), [(corrupt, 3)]);
    let r = h.load(4, &[4, 5], &[0, 1]);
    assert!(r.is_ok() && h.row_holds(0, 4) && h.row_holds(1, 5), "{r:?}");
}

/// Blocks of several TLS records each.
const TLS_BB: usize = 256 << 10;

/// The TLS client of `tls_connections_are_encrypted_and_verified`: a job of
/// several blocks stored and loaded byte-exact; a value corrupted on the
/// server (over TLS, with redis-cli) fails its load with Corrupt, then is a
/// MISS; the connection serves the next load.
#[test]
#[ignore]
fn tls_child() {
    let Ok(url) = std::env::var("KVTIER_CHILD_URL") else {
        return;
    };
    let mut config = with_events(redis_config_at(&url, 16, TLS_BB), 64);
    config.set("cluster", "off").unwrap();
    let h = Harness::new(&config, 8, TLS_BB);
    let ids = [1, 2, 3, 4, 5, 6];
    h.store_all(1, &ids);
    let rows = [7, 6, 5, 4, 3, 2];
    let r = h.load(2, &ids, &rows);
    assert!(r.is_ok(), "{r:?}");
    for (&i, &row) in ids.iter().zip(&rows) {
        assert!(h.row_holds(row as usize, i), "block {i}");
    }
    let _ = h.events();
    let cli = |args: &[&str]| {
        let ca = std::env::var("SSL_CERT_FILE").unwrap();
        let port = std::env::var("KVTIER_CHILD_PORT").unwrap();
        let out = std::process::Command::new("redis-cli")
            .args(["--tls", "--cacert", &ca, "-h", "127.0.0.1", "-p", &port])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let names = cli(&[
        "--scan",
        "--pattern",
        &format!("{}:*", config.redis.key_prefix),
    ]);
    let three = names
        .lines()
        .find(|n| n.ends_with(&format!("{}}}", hex_of(3))))
        .unwrap_or_else(|| panic!("block 3's name in {names:?}"))
        .to_string();
    assert_eq!(cli(&["SET", &three, "garbage"]), "OK");
    garbage_in_block_3_is_corrupt_then_a_miss(&h);
    println!("tls child: done");
}

/// The client of `tls_connections_are_encrypted_and_verified` that trusts
/// another CA only.
#[test]
#[ignore]
fn tls_wrong_ca_child() {
    let Ok(url) = std::env::var("KVTIER_CHILD_URL") else {
        return;
    };
    let mut config = redis_config_at(&url, 8, BB);
    config.set("cluster", "off").unwrap();
    let err = open_err(&config);
    let message = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Io, "{message}");
    assert!(
        message.contains("TLS handshake") && message.contains("certificate"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    println!("tls child: done ({message})");
}

/// A `rediss://` cluster (TLS only: no node has a plain port) takes the
/// router's way, a pool of kvtier's own TLS connections per master, as a
/// plain cluster does. Untrusted, `tier_new` fails naming the certificate;
/// trusted (the test CA through SSL_CERT_FILE, in a child process), a job
/// over all three masters lands byte-exact and a corrupted value is
/// caught (see `tls_cluster_child`).
#[test]
fn a_tls_cluster_job_goes_direct_to_every_master() {
    let Some(certs) = common::redis::TestCerts::make() else {
        return;
    };
    let cluster = redis_or_skip!(RedisCluster::start_tls(3, 0, &certs));
    let err = open_err(&redis_config_at(&cluster.url(), 8, BB));
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    let masters = cluster.masters();
    let ports: Vec<String> = masters.iter().map(|m| m.port.to_string()).collect();
    let out = test_child("tls_cluster_child")
        .env("SSL_CERT_FILE", &certs.ca)
        .env("KVTIER_CHILD_URL", cluster.url())
        .env("KVTIER_CHILD_PORTS", ports.join(","))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("tls cluster child: done"),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Each master holds its slots' blocks, but for the corrupted one, deleted.
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    for m in &masters {
        let theirs = TLS_CLUSTER_IDS
            .filter(|&i| i != 3 && m.serves(slot_of(i)))
            .count();
        assert!(theirs > 0, "master {} serves none of the keys", m.port);
        let held: usize = cluster.cli_at(m.port, &["DBSIZE"]).parse().unwrap();
        assert_eq!(held, theirs, "master {} holds its slots' blocks", m.port);
    }
}

/// The keys `tls_cluster_child` stores (over all three masters).
const TLS_CLUSTER_IDS: std::ops::Range<u64> = 0..24;

/// The client of `a_tls_cluster_job_goes_direct_to_every_master`: a job over
/// every master stored and loaded byte-exact (into rows of another order),
/// through the slot map (`tier_describe`) and none rerouted; a value
/// corrupted on its master (over TLS, with redis-cli) fails its load with
/// Corrupt, then is a MISS; the next load is served.
#[test]
#[ignore]
fn tls_cluster_child() {
    let (Ok(url), Ok(ports)) = (
        std::env::var("KVTIER_CHILD_URL"),
        std::env::var("KVTIER_CHILD_PORTS"),
    ) else {
        return;
    };
    // cluster=auto: the seed is asked over TLS whether it is a cluster.
    let config = with_events(redis_config_at(&url, 64, TLS_BB), 64);
    let ids: Vec<u64> = TLS_CLUSTER_IDS.collect();
    let h = Harness::new(&config, ids.len(), TLS_BB);
    h.store_all(1, &ids);
    for row in 0..ids.len() {
        h.write_row(row, &vec![0u8; TLS_BB]);
    }
    let rows: Vec<i64> = (0..ids.len() as i64).rev().collect();
    let r = h.load(2, &ids, &rows);
    assert!(r.is_ok() && r.num_done as usize == ids.len(), "{r:?}");
    for (&row, &i) in rows.iter().zip(&ids) {
        assert!(h.row_holds(row as usize, i), "block {i} in row {row}");
    }
    let described = h.tier().describe();
    assert!(described.contains("slot map: 3 masters"), "{described}");
    assert_eq!(described_count(&h, " blocks rerouted"), 0, "{described}");
    let _ = h.events();
    let ca = std::env::var("SSL_CERT_FILE").unwrap();
    let cli = |port: &str, args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["--tls", "--cacert", &ca, "-h", "127.0.0.1", "-p", port])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let pattern = format!("{}:*", config.redis.key_prefix);
    let (port, three) = ports
        .split(',')
        .find_map(|port| {
            let names = cli(port, &["--scan", "--pattern", &pattern]);
            let three = names
                .lines()
                .find(|n| n.ends_with(&format!("{}}}", hex_of(3))))?
                .to_string();
            Some((port, three))
        })
        .expect("block 3's name on a master");
    assert_eq!(cli(port, &["SET", &three, "garbage"]), "OK");
    garbage_in_block_3_is_corrupt_then_a_miss(&h);
    assert_eq!(described_count(&h, " blocks rerouted"), 0);
    println!("tls cluster child: done");
}

#[test]
fn a_dead_cluster_master_fails_only_its_own_slots() {
    let mut cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("io_timeout_ms", "500").unwrap();
    let h = Harness::new(&config, 64, BB);
    let ids: Vec<u64> = (0..48).collect();
    h.store_all(1, &ids);
    let dead = cluster.kill9_master(0);
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    let (lost, kept): (Vec<u64>, Vec<u64>) = ids.iter().partition(|&&i| dead.serves(slot_of(i)));
    assert!(
        !lost.is_empty() && !kept.is_empty(),
        "keys spread over the masters"
    );
    for (n, &i) in kept.iter().enumerate() {
        let r = h.load(100 + n as u64, &[i], &[50]);
        assert!(
            r.is_ok() && h.row_holds(50, i),
            "block {i} on a live master: {r:?}"
        );
    }
    let started = Instant::now();
    let r = h.load(99, &[lost[0]], &[50]);
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// Hung masters (SIGSTOP: connections kept, nothing answered) cost a job
/// one `io_timeout_ms` in all, not one per master its blocks are on: the
/// pipelines a job sends its masters share the job's deadline. And a job
/// over a hung master and live ones stores its blocks on the live ones, the
/// first such job too: replies are read from the master that answers first.
/// The slow cluster-node-timeout keeps the live masters serving while one is
/// frozen (the cluster would otherwise flag it failed and go down).
#[test]
fn hung_cluster_masters_cost_one_deadline_per_job() {
    let cluster = redis_or_skip!(RedisCluster::start_with(
        3,
        0,
        &[("cluster-node-timeout", "60000")]
    ));
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("io_timeout_ms", "1000").unwrap();
    let h = Harness::new(&config, 48, BB);
    let ids: Vec<u64> = (0..48).collect();
    let rows: Vec<i64> = (0..48).collect();
    h.store_all(1, &ids);
    let masters = cluster.masters();
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    for m in &masters {
        assert!(
            ids.iter().any(|&i| m.serves(slot_of(i))),
            "keys on every master"
        );
    }

    for m in &masters {
        cluster.server(m.port).freeze();
    }
    let started = Instant::now();
    let r = h.load(2, &ids, &rows);
    let took = started.elapsed();
    for m in &masters {
        cluster.server(m.port).thaw();
    }
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert!(
        took < Duration::from_millis(2500),
        "took {took:?} for a job over three hung masters with a 1 s deadline"
    );
    let recovered =
        common::redis::wait_until(Duration::from_secs(10), || h.load(3, &ids, &rows).is_ok());
    assert!(recovered, "loads never worked again after the thaw");
    assert!(ids.iter().all(|&i| h.row_holds(i as usize, i)));

    // One master hung: every job over it, the first one too (the replies
    // are read from whichever master answers first, so the hung one is
    // read last whatever its place), stores the blocks on the live masters
    // and fails those on the hung one, within the deadline.
    for (round, hung) in [&masters[0], &masters[2]].into_iter().enumerate() {
        cluster.server(hung.port).freeze();
        for job in 0..2u64 {
            // New keys for every job: a key some earlier job stored counts
            // as done without a write (keys made from the ports met each
            // other when two ports were equal mod 100).
            let base = 1000 * (round as u64 + 1) + 100 * (job + 1);
            let keys: Vec<u64> = (base..base + 48).collect();
            let started = Instant::now();
            let r = h.store(4 + job, &keys, &rows);
            let took = started.elapsed();
            assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
            assert!(took < Duration::from_millis(2500), "took {took:?}");
            let live: Vec<u64> = keys
                .iter()
                .copied()
                .filter(|&i| !hung.serves(slot_of(i)))
                .collect();
            assert!(!live.is_empty() && live.len() < keys.len());
            assert_eq!(
                h.present(&keys),
                live,
                "job {job}: the blocks on live masters are stored, those on the hung one are not"
            );
        }
        cluster.server(hung.port).thaw();
    }
}

/// A hung cluster master and more jobs over it than workers: once one
/// request to it has run out of time, the jobs behind get their blocks on
/// the live masters stored and fail the hung one's at once, instead of each
/// waiting out a deadline of its own.
#[test]
fn a_hung_cluster_master_fails_the_jobs_queued_behind_it_within_about_a_deadline() {
    let cluster = redis_or_skip!(RedisCluster::start_with(
        3,
        0,
        &[("cluster-node-timeout", "60000")]
    ));
    let mut config = redis_config_at(&cluster.url(), 1024, BB);
    config.set("io_timeout_ms", "300").unwrap();
    config.set("io_threads", "4").unwrap();
    let job_blocks = 12u64;
    let h = Harness::new(&config, job_blocks as usize, BB);
    let rows: Vec<i64> = (0..job_blocks as i64).collect();
    for r in 0..job_blocks {
        h.fill(r as usize, r);
    }
    let hung = cluster.masters()[0].clone();
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    cluster.server(hung.port).freeze();
    let started = Instant::now();
    let jobs = 32u64;
    let job_keys =
        |job: u64| -> Vec<u64> { (0..job_blocks).map(|b| 10_000 + job * 100 + b).collect() };
    for job in 0..jobs {
        h.tier()
            .submit_store(100 + job, &keys(&job_keys(job)), KEY_LEN, &rows)
            .unwrap();
    }
    let reported = h.results_timed(jobs as usize, started, Duration::from_secs(20));
    let last = reported.iter().map(|r| r.1).max();
    cluster.server(hung.port).thaw();
    println!("last of {jobs} reported after {last:?}");
    assert_eq!(reported.len() as u64, jobs, "jobs never reported");
    for (r, _) in &reported {
        assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
        let job = r.job_id - 100;
        let keys = job_keys(job);
        let live: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|&i| !hung.serves(slot_of(i)))
            .collect();
        assert_eq!(
            h.present(&keys),
            live,
            "job {job}: only the live masters' blocks are stored"
        );
    }
    assert!(
        last < Some(Duration::from_millis(1500)),
        "the last of {jobs} jobs on 4 workers was reported after {last:?} with a 300 ms deadline"
    );
}

#[test]
fn touches_reach_the_servers_lru() {
    let server = redis_or_skip!();
    let config = redis_config_at(&server.url(), 8, BB);
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[1, 2]);
    let name = names_on(&server, &config)
        .into_iter()
        .find(|n| n.ends_with(&hash_tag(1)))
        .unwrap();
    let idle = || -> u64 { server.cli(&["OBJECT", "IDLETIME", &name]).parse().unwrap() };
    std::thread::sleep(Duration::from_millis(2100));
    assert!(idle() >= 2);
    h.touch(&[1]);
    let deadline = Instant::now() + Duration::from_secs(2);
    while idle() >= 2 {
        assert!(
            Instant::now() < deadline,
            "the touch never reached the server"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Calls of `command` the server has answered so far (INFO commandstats).
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |rest| {
            rest.split(',').next().unwrap().trim().parse().unwrap()
        })
}

/// On a single server, deletes and touches name many keys per command (at
/// most 256): a job that evicts 600 blocks, and a touch of 600, reach
/// every key in a few commands instead of one per key.
#[test]
fn a_single_server_gets_deletes_and_touches_of_many_keys_per_command() {
    let server = redis_or_skip!();
    let n = 600;
    let config = redis_config_at(&server.url(), n, BB);
    let h = Harness::new(&config, n, BB);
    let first: Vec<u64> = (1..=n as u64).collect();
    h.store_all(1, &first);
    let names = names_on(&server, &config);
    assert_eq!(names.len(), n);
    let idle = |name: &str| -> u64 { server.cli(&["OBJECT", "IDLETIME", name]).parse().unwrap() };
    // Every 40th key and the last (one redis-cli each: reading all 600
    // takes longer than the idle time they are judged by).
    let sample: Vec<&String> = names.iter().step_by(40).chain(names.last()).collect();
    std::thread::sleep(Duration::from_millis(2100));
    assert!(sample.iter().all(|name| idle(name) >= 2));
    let touches = command_calls(&server, "touch");
    h.touch(&first);
    assert!(
        wait_until(Duration::from_secs(5), || sample
            .iter()
            .all(|name| idle(name) < 2)),
        "a touch did not reach every key"
    );
    let touch_calls = command_calls(&server, "touch") - touches;
    assert!(
        (1..=3).contains(&touch_calls),
        "{touch_calls} TOUCH commands for {n} keys"
    );
    let dels = command_calls(&server, "del");
    let second: Vec<u64> = (n as u64 + 1..=2 * n as u64).collect();
    h.store_all(2, &second);
    h.tier().drain();
    assert!(
        wait_until(Duration::from_secs(5), || names_on(&server, &config)
            .iter()
            .all(|name| !names.contains(name))),
        "evicted keys were left on the server"
    );
    assert_eq!(names_on(&server, &config).len(), n);
    let del_calls = command_calls(&server, "del") - dels;
    assert!(
        (3..=12).contains(&del_calls),
        "{del_calls} DEL commands for {n} evicted keys"
    );
}

/// A cluster master killed: touches of keys on the live masters still
/// reach their LRU.
#[test]
fn touches_reach_the_live_masters_lru_past_a_dead_one() {
    let mut cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 64, BB);
    config.set("cluster", "on").unwrap();
    config.set("io_timeout_ms", "500").unwrap();
    let h = Harness::new(&config, 32, BB);
    let ids: Vec<u64> = (0..32).collect();
    h.store_all(1, &ids);
    let pattern = format!("{}:*", config.redis.key_prefix);
    let masters = cluster.masters();
    std::thread::sleep(Duration::from_millis(2100));
    let dead = cluster.kill9_master(0);
    // Each live master's key names, and how long each has been idle.
    let live: Vec<(u16, String)> = masters
        .iter()
        .filter(|m| m.port != dead.port)
        .flat_map(|m| {
            cluster
                .cli_at(m.port, &["--scan", "--pattern", &pattern])
                .lines()
                .filter(|l| !l.is_empty())
                .map(|name| (m.port, name.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        live.len() >= 8,
        "{} of 32 keys on the live masters",
        live.len()
    );
    let idle = |(port, name): &(u16, String)| -> u64 {
        cluster
            .cli_at(*port, &["OBJECT", "IDLETIME", name])
            .trim()
            .parse()
            .unwrap()
    };
    assert!(live.iter().all(|k| idle(k) >= 2));
    h.touch(&ids);
    // Within the cluster's node timeout (2 s), before the live masters
    // would call the cluster down.
    let deadline = Instant::now() + Duration::from_millis(1500);
    while live.iter().any(|k| idle(k) >= 2) {
        assert!(
            Instant::now() < deadline,
            "touches never reached the live masters"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_hung_server_costs_a_failed_job_on_time() {
    let server = redis_or_skip!();
    let mut config = redis_config_at(&server.url(), 8, BB);
    config.set("io_timeout_ms", "300").unwrap();
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[1]);
    server.freeze();
    let started = Instant::now();
    let r = h.load(2, &[1], &[5]);
    let took = started.elapsed();
    server.thaw();
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} for a 300 ms deadline"
    );
    load_once_answering(&h, 4, 1, 5);
}

/// After a hang: loads block `id` into `row` until a load succeeds (the
/// server answers again), failing the test after 5 s.
fn load_once_answering(h: &Harness, mut job: u64, id: u64, row: i64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = h.load(job, &[id], &[row]);
        job += 1;
        if r.is_ok() {
            assert!(h.row_holds(row as usize, id));
            return;
        }
        assert!(Instant::now() < deadline, "never recovered: {r:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While a hung server's trial request is out, other loads fail at once:
/// they never reach the server, so they prove nothing about their blocks.
/// An engine retrying a key through the hang more often than
/// MAX_TRANSIENT_LOAD_FAILURES keeps it (before, the third failure at once
/// made the key a MISS and left its block on the server unindexed).
#[test]
fn loads_failed_at_once_during_a_hang_do_not_forget_their_keys() {
    let server = redis_or_skip!();
    let mut config = redis_config_at(&server.url(), 8, BB);
    config.set("io_timeout_ms", "600").unwrap();
    config.set("io_threads", "2").unwrap();
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[0, 1]);
    let tier = h.tier();
    server.freeze();
    // A request runs out of time: the server is silent. The next one is
    // its trial, out for a deadline.
    assert_eq!(h.load(10, &[0], &[2]).error, Some(ErrorKind::Io));
    tier.submit_load(11, &keys(&[0]), KEY_LEN, &[3]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut others = Vec::new();
    let mut wait_for = |job: u64| loop {
        if let Some(i) = others.iter().position(|r: &JobResult| r.job_id == job) {
            return others.swap_remove(i);
        }
        others.extend(tier.poll(4));
        tier.wait(Duration::from_millis(2));
    };
    let (mut quick, mut slow) = (0u32, 0u32);
    let mut job = 20;
    while quick <= kvtier::MAX_TRANSIENT_LOAD_FAILURES {
        let started = Instant::now();
        tier.submit_load(job, &keys(&[1]), KEY_LEN, &[4]).unwrap();
        let r = wait_for(job);
        assert_eq!(r.error, Some(ErrorKind::Io), "load {job} of key 1: {r:?}");
        if started.elapsed() < Duration::from_millis(300) {
            quick += 1;
        } else {
            // It went to the server as a trial itself (a slow machine):
            // that one counts, and the test needs fewer than three such.
            slow += 1;
            assert!(
                slow < kvtier::MAX_TRANSIENT_LOAD_FAILURES,
                "no load failed at once"
            );
        }
        job += 1;
    }
    server.thaw();
    wait_for(11); // answered after the thaw, or out of time: either will do
    assert_eq!(h.lookup(&[1]), vec![Hit], "key 1 was forgotten");
    load_once_answering(&h, job, 1, 5);
}

/// A hung server (SIGSTOP: the kernel still accepts connections, nothing is
/// answered) and more jobs than workers: once one request has run out of
/// time, the jobs behind it fail when they reach a worker, one at a time
/// going to find out whether the server is back, instead of each waiting
/// out a deadline of its own (32 jobs on 4 workers were reported over 2.55
/// s with a 300 ms deadline; now within about two deadlines). When the
/// server answers again, so does the tier.
#[test]
fn a_hung_server_fails_the_jobs_queued_behind_it_within_about_a_deadline() {
    let server = redis_or_skip!();
    let mut config = redis_config_at(&server.url(), 64, BB);
    config.set("io_timeout_ms", "300").unwrap();
    config.set("io_threads", "4").unwrap();
    let h = Harness::new(&config, 64, BB);
    let ids: Vec<u64> = (0..64).collect();
    h.store_all(1, &ids);
    server.freeze();
    let started = Instant::now();
    // A key of its own per job: a key whose loads fail three times in a
    // row is forgotten (MAX_TRANSIENT_LOAD_FAILURES).
    let jobs = 32u64;
    for job in 0..jobs {
        h.tier()
            .submit_load(100 + job, &keys(&[job]), KEY_LEN, &[job as i64])
            .unwrap();
    }
    let reported = h.results_timed(jobs as usize, started, Duration::from_secs(10));
    let last = reported.iter().map(|r| r.1).max();
    server.thaw();
    assert_eq!(reported.len() as u64, jobs, "jobs never reported");
    assert!(
        reported.iter().all(|(r, _)| r.error == Some(ErrorKind::Io)),
        "{reported:?}"
    );
    assert!(
        last < Some(Duration::from_millis(1500)),
        "the last of {jobs} jobs on 4 workers was reported after {last:?} with a 300 ms deadline"
    );
    // Answering again: the next job that goes finds out, and the tier is
    // back to normal (no job fails at once any more), every block intact.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut next = jobs;
    loop {
        let r = h.load(200 + next, &[next], &[next as i64]);
        next += 1;
        if r.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline && next < 48,
            "never recovered: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rows: Vec<i64> = (0..jobs as i64).collect();
    let r = h.load(300, &ids[..jobs as usize], &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!((0..jobs).all(|i| h.row_holds(i as usize, i)));
}

/// The same for a shared tier's probes: lookups of absent keys during a
/// hang get their verdicts (MISS) within about a deadline, without holding
/// a worker each for one, so a load behind them is reported on time too.
#[test]
fn a_hung_server_costs_shared_lookups_about_a_deadline() {
    let server = redis_or_skip!();
    let mut config = redis_config_at(&server.url(), 64, BB);
    config.set("io_timeout_ms", "300").unwrap();
    config.set("io_threads", "2").unwrap();
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    let h = Harness::new(&config, 64, BB);
    h.store_all(1, &[1]);
    server.freeze();
    let started = Instant::now();
    // Sixteen probe batches (64 keys each) for two workers.
    let absent: Vec<u64> = (1000..1000 + 16 * 64).collect();
    assert!(h.lookup(&absent).iter().all(|&s| s == Pending));
    h.tier().submit_load(2, &keys(&[1]), KEY_LEN, &[2]).unwrap();
    let states = h.lookup_settled(&absent, Duration::from_secs(10));
    let settled = started.elapsed();
    let r = h.result_of(2);
    let loaded = started.elapsed();
    server.thaw();
    assert!(states.iter().all(|&s| s == Miss), "{states:?}");
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert!(
        settled < Duration::from_millis(1500) && loaded < Duration::from_millis(1500),
        "16 probe batches on 2 workers settled after {settled:?}, the load after {loaded:?}, with a 300 ms deadline"
    );
}

/// Another process on the same keyspace (this test binary re-run as a child).
#[test]
fn two_processes_share_one_keyspace() {
    let server = redis_or_skip!();
    let mut config = redis_config_at(&server.url(), 16, BB);
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    let h = Harness::new(&config, 16, BB);
    h.store_all(1, &(100..110).collect::<Vec<_>>());
    let out = test_child("child")
        .env("KVTIER_CHILD_URL", server.url())
        .env("KVTIER_CHILD_PREFIX", &config.redis.key_prefix)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child: loaded 10 blocks"),
        "child: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // And the other way round: the child stored 200..205.
    let deadline = Instant::now() + Duration::from_secs(5);
    let theirs: Vec<u64> = (200..205).collect();
    while h.lookup(&theirs).iter().any(|&s| s != Hit) {
        assert!(Instant::now() < deadline, "never found the child's blocks");
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = h.load(2, &theirs, &(0..5).collect::<Vec<_>>());
    assert!(r.is_ok(), "{r:?}");
    assert!(theirs
        .iter()
        .enumerate()
        .all(|(row, &i)| h.row_holds(row, i)));
}

/// The other process of `two_processes_share_one_keyspace` (ignored when run
/// directly).
#[test]
#[ignore]
fn child() {
    let (Ok(url), Ok(prefix)) = (
        std::env::var("KVTIER_CHILD_URL"),
        std::env::var("KVTIER_CHILD_PREFIX"),
    ) else {
        return;
    };
    let mut config = redis_config_at(&url, 16, BB);
    config.set("sharing", "shared").unwrap();
    config.set("namespace", "shared-test").unwrap();
    config.set("key_prefix", &prefix).unwrap();
    let h = Harness::new(&config, 16, BB);
    let ids: Vec<u64> = (100..110).collect();
    let first = h.lookup(&ids);
    assert!(
        first.iter().all(|&s| s == Pending),
        "unseen keys are probed: {first:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.lookup(&ids).iter().any(|&s| s != Hit) {
        assert!(Instant::now() < deadline, "never found the parent's blocks");
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = h.load(1, &ids, &(0..10).collect::<Vec<_>>());
    assert!(r.is_ok(), "{r:?}");
    assert!(ids.iter().enumerate().all(|(row, &i)| h.row_holds(row, i)));
    println!("child: loaded {} blocks", ids.len());
    h.store_all(2, &(200..205).collect::<Vec<_>>());
}

/// Slots move between masters while jobs run (MOVED and ASK redirections):
/// every load is byte-exact or fails cleanly, and once the move is over every
/// stored block loads.
#[test]
fn resharding_in_progress_moves_no_wrong_bytes() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let config = redis_config_at(&cluster.url(), 1024, BB);
    let h = Harness::new(&config, 64, BB);
    let ids: Vec<u64> = (0..192).collect();
    for chunk in ids.chunks(32) {
        h.store_all(chunk[0] + 10_000, chunk);
    }
    let masters = cluster.masters();
    let (from, to) = (&masters[0], &masters[1]);
    let seed = format!("127.0.0.1:{}", to.port);
    let (from_id, to_id) = (from.id.clone(), to.id.clone());
    let mover = std::thread::scope(|scope| {
        let mover = scope.spawn(|| {
            std::process::Command::new("redis-cli")
                .args(["--cluster", "reshard", &seed, "--cluster-from", &from_id])
                .args(["--cluster-to", &to_id, "--cluster-slots", "2000"])
                .args(["--cluster-yes", "--cluster-pipeline", "10"])
                .output()
                .expect("redis-cli --cluster reshard")
        });
        let mut job = 0u64;
        while !mover.is_finished() {
            for chunk in ids.chunks(16) {
                job += 1;
                let rows: Vec<i64> = (32..48).collect();
                let r = h.load(job, chunk, &rows);
                let good = r.num_done as usize;
                for (row, &i) in rows.iter().zip(chunk).take(good) {
                    assert!(h.row_holds(*row as usize, i), "block {i}: wrong bytes");
                }
                assert!(
                    r.is_ok() || r.error == Some(ErrorKind::Io),
                    "during the move: {r:?}"
                );
            }
        }
        mover.join().unwrap()
    });
    assert!(
        mover.status.success(),
        "{}",
        String::from_utf8_lossy(&mover.stdout)
    );
    let r = h.load(1, &ids[..64], &(0..64).collect::<Vec<_>>());
    assert!(r.is_ok(), "after the move: {r:?}");
    assert!(ids[..64]
        .iter()
        .enumerate()
        .all(|(row, &i)| h.row_holds(row, i)));
    // The tier's own pipelines met the move: its slot map named the old
    // master for a moved block at least once (it is read again only after
    // a redirection), and such blocks were sent again where it pointed.
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    let to_now = cluster
        .masters()
        .into_iter()
        .find(|m| m.id == to.id)
        .unwrap();
    if ids[..64]
        .iter()
        .any(|&i| from.serves(slot_of(i)) && to_now.serves(slot_of(i)))
    {
        assert!(described_count(&h, " blocks rerouted") > 0);
        assert!(described_count(&h, " times;") > 1);
    }
}

/// A master with a replica dies: its blocks fail cleanly (never wrong bytes)
/// until the replica takes over, then load from the promoted replica.
#[test]
fn a_replica_takes_over_a_dead_masters_blocks() {
    let mut cluster = redis_or_skip!(RedisCluster::start(3, 1));
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("io_timeout_ms", "500").unwrap();
    let h = Harness::new(&config, 64, BB);
    let ids: Vec<u64> = (0..48).collect();
    h.store_all(1, &ids);
    // Replication is asynchronous: wait until every replica has its master's keys.
    let replicas: Vec<u16> = cluster
        .nodes()
        .iter()
        .filter(|n| n.role == common::redis::Role::Replica)
        .map(|n| n.port)
        .collect();
    assert_eq!(replicas.len(), 3);
    let on_replicas = || -> u64 {
        replicas
            .iter()
            .map(|&p| {
                cluster
                    .cli_at(p, &["DBSIZE"])
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0)
            })
            .sum()
    };
    assert!(
        common::redis::wait_until(Duration::from_secs(10), || on_replicas() == 48),
        "replicas hold {} of 48 keys",
        on_replicas()
    );
    let dead = cluster.kill9_master(0);
    let slot_of = |i: u64| common::redis::key_slot(hash_tag(i).as_bytes());
    let lost: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|&i| dead.serves(slot_of(i)))
        .collect();
    assert!(!lost.is_empty());
    // One try during the failover: it fails cleanly or already works.
    let r = h.load(2, &lost[..1], &[50]);
    assert!(r.is_ok() || r.error == Some(ErrorKind::Io), "{r:?}");
    if r.is_ok() {
        assert!(h.row_holds(50, lost[0]));
    }
    // Failed over: another node is the master of the dead one's slots.
    let first = dead.slots[0].0;
    cluster.wait_for_nodes("a replica promoted", Duration::from_secs(30), |nodes| {
        nodes.iter().any(|n| {
            n.role == common::redis::Role::Master
                && !n.failed
                && n.port != dead.port
                && n.serves(first)
        })
    });
    cluster.wait_for_state("ok", Duration::from_secs(30));
    let rows: Vec<i64> = (0..lost.len() as i64).collect();
    let r = h.load(10, &lost, &rows);
    assert!(r.is_ok(), "the promoted replica serves the blocks: {r:?}");
    assert!(lost.iter().enumerate().all(|(row, &i)| h.row_holds(row, i)));
}

/// A filling tier's job split into more tasks than there are connections
/// still fails about one deadline after a server hangs: the tasks that
/// could not send wait for a connection no longer than that (and are then
/// failed at once, unsent), instead of each waiting a deadline of its own
/// in turn (4 rounds of 2 connections here: 2 s).
#[test]
fn a_filling_job_spread_over_few_connections_fails_within_a_deadline_on_a_hung_server() {
    let server = redis_or_skip!();
    let mut config = redis_config_at(&server.url(), 64, BB);
    config.set("io_timeout_ms", "500").unwrap();
    config.set("io_threads", "8").unwrap();
    config.set("connections", "2").unwrap();
    let h = Harness::new(&config, 16, BB);
    h.store_all(1, &[100]);
    server.freeze();
    let started = Instant::now();
    let ids: Vec<u64> = (0..16).collect();
    let rows: Vec<i64> = (0..16).collect();
    let r = h.store(2, &ids, &rows);
    let took = started.elapsed();
    server.thaw();
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?} for a 500 ms deadline"
    );
    // The block stored before the hang loads once the server answers.
    load_once_answering(&h, 3, 100, 0);
}
