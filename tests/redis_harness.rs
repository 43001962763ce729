//! The Redis test harness (tests/common/redis.rs) against real servers: a
//! standalone server starts, answers, dies and comes back empty, refuses
//! clients without the password, and is gone after drop (also after a
//! panic); a cluster forms, routes keys between nodes, and its nodes see a
//! killed master fail, come back, and a replica take over; a TLS-only
//! cluster forms and announces its TLS ports.
//!
//! Skips (with a printed reason) without redis-server, unless
//! KVTIER_REQUIRE_REDIS=1.

mod common;

use common::redis::{key_slot, raw_ping, wait_until, RedisCluster, RedisServer, Role};
use std::time::Duration;

const STATE_TIMEOUT: Duration = Duration::from_secs(20);

fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn standalone_answers_ping_set_get() {
    let server = redis_or_skip!();
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(raw_ping(server.port()).as_deref(), Some("+PONG"));
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.cli(&["SET", "greeting", "hello"]), "OK");
    assert_eq!(server.cli(&["GET", "greeting"]), "hello");
    // Loopback only, nothing on disk.
    assert_eq!(server.cli(&["CONFIG", "GET", "bind"]), "bind\n127.0.0.1");
    assert_eq!(server.cli(&["CONFIG", "GET", "save"]), "save", "save \"\"");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );
}

#[test]
fn kill9_then_restart_comes_back_empty_on_the_same_port() {
    let mut server = redis_or_skip!();
    let port = server.port();
    assert_eq!(server.cli(&["SET", "k", "v"]), "OK");
    let pid = server.pid().unwrap();

    server.kill9();
    assert!(!server.is_running());
    assert!(!process_exists(pid), "the killed server was reaped");
    assert_eq!(raw_ping(port), None, "nothing answers on the port");

    server.restart();
    assert_eq!(server.port(), port);
    assert!(server.is_running());
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.cli(&["GET", "k"]), "", "nil: the data is gone");
    assert_eq!(server.cli(&["DBSIZE"]), "0");
}

#[test]
fn requirepass_rejects_unauthenticated_commands() {
    let server = redis_or_skip!(RedisServer::start_with(&[("requirepass", "s3cret")]));
    assert_eq!(server.password(), Some("s3cret"));
    assert!(raw_ping(server.port()).unwrap().starts_with("-NOAUTH"));
    assert!(server.cli(&["SET", "k", "v"]).starts_with("NOAUTH"));
    // A wrong password: redis-cli reports WRONGPASS on stderr, then PING is refused.
    assert!(server
        .cli(&["-a", "wrong", "--no-auth-warning", "PING"])
        .starts_with("NOAUTH"));
    assert_eq!(server.cli_authed(&["SET", "k", "v"]), "OK");
    assert_eq!(server.cli_authed(&["GET", "k"]), "v");
}

#[test]
fn acl_user_and_memory_settings_reach_the_server() {
    let server = redis_or_skip!(RedisServer::start_with(&[
        ("user", "kv on >kvpass ~* +@all"),
        ("user", "default off"),
        ("maxmemory", "8mb"),
        ("maxmemory-policy", "allkeys-lru"),
    ]));
    assert!(server.cli(&["PING"]).starts_with("NOAUTH"));
    let as_kv = |args: &[&str]| {
        let mut all = vec!["--user", "kv", "--pass", "kvpass", "--no-auth-warning"];
        all.extend_from_slice(args);
        server.cli(&all)
    };
    assert_eq!(as_kv(&["PING"]), "PONG");
    assert_eq!(as_kv(&["CONFIG", "GET", "maxmemory"]), "maxmemory\n8388608");
    assert_eq!(
        as_kv(&["CONFIG", "GET", "maxmemory-policy"]),
        "maxmemory-policy\nallkeys-lru"
    );
}

#[test]
fn drop_kills_the_server_and_removes_its_directory_even_on_panic() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (pid, dir) = (server.pid().unwrap(), server.dir().to_path_buf());
    assert!(process_exists(pid) && dir.is_dir());
    let unwound = std::panic::catch_unwind(move || {
        let _owned = server;
        panic!("a test fails while it owns a server");
    });
    assert!(unwound.is_err());
    assert!(!process_exists(pid), "server {pid} still runs");
    assert!(!dir.exists(), "{} still exists", dir.display());
}

#[test]
fn cluster_of_three_masters_forms_and_routes_keys() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let ports = cluster.ports();
    assert_eq!(ports.len(), 3);
    assert_eq!(
        cluster.url(),
        ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    for &p in &ports {
        assert_eq!(cluster.state(p), "ok");
    }
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let covered: u32 = masters
        .iter()
        .flat_map(|m| &m.slots)
        .map(|&(a, b)| u32::from(b - a) + 1)
        .sum();
    assert_eq!(covered, 16384);
    assert_eq!(masters[0].slots[0].0, 0);

    // Keys spread over the masters, written through one node and read
    // through the others (redis-cli -c follows MOVED).
    let keys: Vec<String> = (0..12).map(|i| format!("key-{i}")).collect();
    for k in &keys {
        let slot = cluster.cli(&["CLUSTER", "KEYSLOT", k]);
        assert_eq!(slot, key_slot(k.as_bytes()).to_string(), "key_slot({k})");
        assert_eq!(
            key_slot(format!("{{{k}}}.suffix").as_bytes()).to_string(),
            slot
        );
        assert_eq!(
            cluster.cli_at(ports[0], &["SET", k, &format!("v-{k}")]),
            "OK"
        );
    }
    for &p in &ports[1..] {
        for k in &keys {
            assert_eq!(cluster.cli_at(p, &["GET", k]), format!("v-{k}"));
        }
    }
    let holders = masters
        .iter()
        .filter(|m| cluster.server(m.port).cli(&["DBSIZE"]) != "0")
        .count();
    assert_eq!(holders, 3, "12 keys land on every master");
}

/// A TLS-only cluster: no node answers plaintext on its port, every node
/// announces its TLS port (`CLUSTER SLOTS` asked over TLS names the ports
/// the harness started), and redis-cli -c routes keys over TLS.
#[test]
fn tls_cluster_forms_announces_its_tls_ports_and_routes_keys() {
    let Some(certs) = common::redis::TestCerts::make() else {
        return;
    };
    let cluster = redis_or_skip!(RedisCluster::start_tls(3, 0, &certs));
    let ports = cluster.ports();
    assert_eq!(
        cluster.url(),
        ports
            .iter()
            .map(|p| format!("rediss://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    for &p in &ports {
        assert_ne!(raw_ping(p).as_deref(), Some("+PONG"), "plaintext on {p}");
        assert_eq!(cluster.state(p), "ok");
    }
    let mut announced: Vec<u16> = cluster
        .cli(&["CLUSTER", "SLOTS"])
        .lines()
        .filter_map(|l| l.trim().parse::<u16>().ok())
        .filter(|p| ports.contains(p))
        .collect();
    announced.sort_unstable();
    let mut sorted = ports.clone();
    sorted.sort_unstable();
    assert_eq!(announced, sorted, "CLUSTER SLOTS names the TLS ports");
    assert_eq!(cluster.masters().len(), 3);
    let keys: Vec<String> = (0..12).map(|i| format!("key-{i}")).collect();
    for k in &keys {
        assert_eq!(cluster.cli_at(ports[0], &["SET", k, "v"]), "OK");
        assert_eq!(cluster.cli_at(ports[2], &["GET", k]), "v");
    }
    let holders = ports
        .iter()
        .filter(|&&p| cluster.server(p).cli(&["DBSIZE"]) != "0")
        .count();
    assert_eq!(holders, 3, "12 keys land on every master");
}

#[test]
fn cluster_sees_a_killed_master_fail_and_rejoin_empty() {
    let mut cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let key = cluster.masters()[1].key_with_prefix("k");
    assert_eq!(cluster.cli(&["SET", &key, "v"]), "OK");

    let victim = cluster.kill9_master(1);
    assert!(!cluster.server_mut(victim.port).is_running());
    cluster.wait_for_nodes("the killed master flagged fail", STATE_TIMEOUT, |nodes| {
        nodes.iter().any(|n| n.id == victim.id && n.failed)
    });
    // No replica: its slots are uncovered and the cluster refuses service.
    cluster.wait_for_state("fail", STATE_TIMEOUT);
    assert_eq!(cluster.masters().len(), 2);

    cluster.restart(victim.port);
    cluster.wait_for_state("ok", STATE_TIMEOUT);
    assert_eq!(cluster.masters().len(), 3);
    assert_eq!(cluster.masters()[1].id, victim.id, "same identity");
    assert_eq!(cluster.cli(&["GET", &key]), "", "the data is gone");
}

#[test]
fn cluster_with_replicas_fails_over_to_a_replica() {
    let mut cluster = redis_or_skip!(RedisCluster::start(3, 1));
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for m in &masters {
        let replicas = nodes
            .iter()
            .filter(|n| n.role == Role::Replica && n.master_id.as_deref() == Some(&m.id))
            .count();
        assert_eq!(replicas, 1, "master {} has one replica: {nodes:#?}", m.port);
    }

    let victim = cluster.masters()[0].clone();
    let key = victim.key_with_prefix("k");
    assert_eq!(cluster.cli(&["SET", &key, "kept"]), "OK");
    // The write reaches the replica before the master dies.
    let replica = nodes
        .iter()
        .find(|n| n.master_id.as_deref() == Some(&victim.id))
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || cluster
        .server(replica.port)
        .cli(&["DBSIZE"])
        == "1"));

    cluster.kill9_master(0);
    cluster.wait_for_nodes("a replica promoted", STATE_TIMEOUT, |nodes| {
        nodes.iter().any(|n| {
            n.id != victim.id && n.role == Role::Master && n.slots.first() == victim.slots.first()
        })
    });
    cluster.wait_for_state("ok", STATE_TIMEOUT);
    let promoted = cluster.masters()[0].clone();
    assert_ne!(promoted.port, victim.port);
    assert_eq!(cluster.cli(&["GET", &key]), "kept");
    assert!(wait_until(Duration::from_secs(1), || cluster
        .nodes()
        .iter()
        .any(|n| n.id == victim.id && n.failed)));
}
