//! Redis faults at the edges of the keyspace's contract, on real servers
//! started by the tests: a cluster joined while one master is down, and
//! values that are not kvtier blocks (another type, no header) under a
//! tier's names. See docs/reliability-rules.md.

mod common;

use common::redis::{redis_config_at, RedisCluster};
use common::*;
use kvtier::{ErrorKind, EventKind, LookupState::*, RemovedReason, TierConfig};

const BB: usize = 4096;

fn hex_of(i: u64) -> String {
    key(i).iter().map(|b| format!("{b:02x}")).collect()
}

/// What `tamper` leaves under block 1's name makes its load fail Corrupt at
/// once (not a transient Io), the key a MISS with a Removed(Corrupt) event,
/// and (owned keyspace) the value deleted.
fn a_foreign_value_is_corrupt(config: TierConfig, cli: &dyn Fn(&[&str]) -> String) {
    let config = with_events(config, 64);
    let h = Harness::new(&config, 8, BB);
    let prefix = config.redis.key_prefix.clone();
    let headerless = "z".repeat(BB + 64);
    let tampers: [(&str, &[&str]); 5] = [
        ("a list", &["RPUSH", "{name}", "x", "y"]),
        ("a hash", &["HSET", "{name}", "f", "v"]),
        ("a set", &["SADD", "{name}", "m"]),
        ("an empty string", &["SET", "{name}", ""]),
        ("a string without a header", &["SET", "{name}", &headerless]),
    ];
    for (n, (what, tamper)) in tampers.iter().enumerate() {
        let id = 1 + n as u64;
        let job = 10 * id;
        h.store_all(job, &[id]);
        let pattern = format!("{prefix}:*{}}}", hex_of(id));
        let name = cli(&["--scan", "--pattern", &pattern]);
        assert!(!name.is_empty() && !name.contains('\n'), "{name:?}");
        cli(&["DEL", &name]);
        let args: Vec<&str> = tamper
            .iter()
            .map(|a| if *a == "{name}" { name.as_str() } else { a })
            .collect();
        cli(&args);
        let _ = h.events();
        let r = h.load(job + 1, &[id], &[1]);
        assert_eq!(r.error, Some(ErrorKind::Corrupt), "{what}: {r:?}");
        assert_eq!(h.lookup(&[id]), [Miss], "{what}");
        let corrupt = EventKind::Removed(RemovedReason::Corrupt);
        assert_eq!(h.events(), [(corrupt, id)], "{what}");
        assert_eq!(cli(&["EXISTS", &name]), "0", "{what}: deleted (owned)");
        // The name is usable again.
        h.store_all(job + 2, &[id]);
        let r = h.load(job + 3, &[id], &[1]);
        assert!(r.is_ok() && h.row_holds(1, id), "{what}: {r:?}");
    }
}

#[test]
fn a_value_of_another_type_or_without_a_header_is_corrupt_on_a_server() {
    let server = redis_or_skip!();
    let config = redis_config_at(&server.url(), 64, BB);
    a_foreign_value_is_corrupt(config, &|args| server.cli(args));
}

#[test]
fn a_value_of_another_type_or_without_a_header_is_corrupt_on_a_cluster() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 64, BB);
    config.set("cluster", "on").unwrap();
    a_foreign_value_is_corrupt(config, &|args| {
        if args[0] == "--scan" {
            // A scan of every master: the name lives on one of them.
            cluster
                .masters()
                .iter()
                .map(|m| cluster.cli_at(m.port, args))
                .filter(|out| !out.is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            cluster.cli(args)
        }
    });
}
