//! A job's passes over the servers: the first by the slot map, then up to
//! `MAX_PASSES` in all for the blocks that came back redirected or whose
//! node failed. MOVED sends a block to the node it names and has the map
//! read again; ASK sends it there behind `ASKING`; TRYAGAIN and CLUSTERDOWN
//! send it again after a pause (10 ms, doubling); a failed node's blocks go
//! again if the map read again gives their slots to another node (a
//! promoted replica). Every pass runs on the target nodes' own pools
//! (`fanout`), so a redirection meets the same deadline and stall breaker
//! as a first try, and all passes share the job's deadline.

use super::cluster::Router;
use super::fanout::{past, run_pass, Pass};
use super::routes::{Aim, Node, Redirection, Routes};
use crate::error::{Error, ErrorKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Passes of one job, the first included: a slot that keeps moving fails
/// its blocks rather than holding the worker until the deadline.
const MAX_PASSES: usize = 5;

/// The first pause before sending again what TRYAGAIN or CLUSTERDOWN
/// refused (doubled at each pass).
const FIRST_PAUSE: Duration = Duration::from_millis(10);

fn redirected_too_often() -> Error {
    Error::new(
        ErrorKind::Io,
        format!("redis: redirected on each of {MAX_PASSES} passes (slots moving)"),
    )
}

/// Runs `pass` for the blocks of `slots` (block i's slot is `slots[i]`)
/// by the `deadline`, following redirections and failovers (see the
/// file's comment). Blocks still to send when the deadline passes are
/// `Pass::late`; after the last pass, `Pass::failed`.
pub(in crate::backend::redis) fn run_job<P: Pass>(
    router: &Router,
    slots: &[u16],
    deadline: Instant,
    pass: &mut P,
) {
    let n = slots.len();
    let mut again: Option<Vec<bool>> = None;
    // Sized on the first redirection: a job without any allocates none.
    let mut aims: Vec<Aim> = Vec::new();
    let mut pause = FIRST_PAUSE;
    for pass_number in 1..=MAX_PASSES {
        let map = router.map();
        let routes = match &again {
            None => Routes::new(&map, slots, |_| true, &aims),
            Some(again) => Routes::new(&map, slots, |i| again[i], &aims),
        };
        pass.arrange(&routes.order);
        let trouble = run_pass(&routes, deadline, pass);
        if trouble.is_clear() {
            return;
        }
        let mut next = vec![false; n];
        if aims.is_empty() && !trouble.redirected.is_empty() {
            aims.resize(n, Aim::Slot);
        }
        let mut refresh = !trouble.failed.is_empty() || !trouble.unrouted.is_empty();
        let mut wait = false;
        let mut rerouted = trouble.redirected.len();
        let (mut moved, mut asked) = (0, 0);
        for (i, how) in &trouble.redirected {
            match how {
                Redirection::Moved(_) => moved += 1,
                Redirection::Ask(_) => asked += 1,
                Redirection::TryAgain => {}
            }
            next[*i] = true;
            aims[*i] = match how {
                Redirection::Moved(at) => {
                    refresh = true;
                    match at {
                        Some((host, port)) => Aim::At {
                            node: router.node(host, *port),
                            asking: false,
                        },
                        None => Aim::Slot,
                    }
                }
                Redirection::Ask(Some((host, port))) => Aim::At {
                    node: router.node(host, *port),
                    asking: true,
                },
                Redirection::Ask(None) => {
                    refresh = true;
                    Aim::Slot
                }
                Redirection::TryAgain => {
                    wait = true;
                    Aim::Slot
                }
            };
        }
        router.note_redirections(moved, asked);
        if refresh {
            let avoid: Vec<Arc<Node>> = trouble
                .failed
                .iter()
                .filter_map(|&g| routes.groups[g].node.clone())
                .collect();
            router.refresh(&avoid, deadline);
            let now = router.map();
            let lost = trouble.failed.iter().chain(&trouble.unrouted);
            for &g in lost {
                for &i in &routes.order[routes.groups[g].range.clone()] {
                    if now.moved_since(&map, slots[i]) {
                        next[i] = true;
                        if let Some(aim) = aims.get_mut(i) {
                            *aim = Aim::Slot;
                        }
                    }
                }
            }
            rerouted += trouble
                .unrouted
                .iter()
                .map(|&g| routes.groups[g].range.len())
                .sum::<usize>();
        }
        let retry: Vec<usize> = (0..n).filter(|&i| next[i]).collect();
        if retry.is_empty() {
            return;
        }
        router.note_rerouted(rerouted);
        if pass_number == MAX_PASSES {
            pass.failed(&retry, &redirected_too_often());
            return;
        }
        if wait {
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause *= 2;
        }
        if past(deadline) {
            pass.late(&retry);
            return;
        }
        again = Some(next);
    }
}

#[cfg(test)]
mod tests {
    use super::super::calls::Calls;
    use super::super::command;
    use super::super::fake::{all_slots_at, is, router_at, serve_commands};
    use super::super::reply::{Value, SMALL_REPLY};
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const T: Duration = Duration::from_secs(2);

    /// `GET <name>` for each name.
    fn get_commands(names: &[&str]) -> Vec<Vec<u8>> {
        names
            .iter()
            .map(|name| {
                let mut out = Vec::new();
                command::encode(&mut out, &[b"GET", name.as_bytes()]);
                out
            })
            .collect()
    }

    #[test]
    fn tryagain_is_sent_again_after_a_pause_that_doubles() {
        let gets = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&gets);
        let port = Arc::new(AtomicUsize::new(0));
        let own = Arc::clone(&port);
        let p = serve_commands(move |args, _| {
            if is(args, b"CLUSTER") {
                return all_slots_at(own.load(Ordering::SeqCst) as u16);
            }
            match seen.fetch_add(1, Ordering::SeqCst) {
                0 => b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n".to_vec(),
                1 => b"-CLUSTERDOWN The cluster is down\r\n".to_vec(),
                _ => b"$1\r\nv\r\n".to_vec(),
            }
        });
        port.store(p as usize, Ordering::SeqCst);
        let router = router_at(p);
        let commands = get_commands(&["k"]);
        let mut pass = Calls::new("GET pipeline", &commands, SMALL_REPLY);
        let started = Instant::now();
        run_job(&router, &[7], started + T, &mut pass);
        let took = started.elapsed();
        let replies = pass.into_replies();
        assert_eq!(replies[0], Ok(Value::BulkString(b"v".to_vec())));
        assert_eq!(gets.load(Ordering::SeqCst), 3);
        // Paused 10 ms, then 20.
        assert!(took >= FIRST_PAUSE * 3, "{took:?}");
        assert!(
            router.describe().contains(" 2 blocks rerouted"),
            "{}",
            router.describe()
        );
    }

    #[test]
    fn a_slot_that_keeps_moving_fails_after_the_last_pass() {
        let port = Arc::new(AtomicUsize::new(0));
        let own = Arc::clone(&port);
        let p = serve_commands(move |args, _| {
            if is(args, b"CLUSTER") {
                return all_slots_at(own.load(Ordering::SeqCst) as u16);
            }
            b"-TRYAGAIN slot moving\r\n".to_vec()
        });
        port.store(p as usize, Ordering::SeqCst);
        let router = router_at(p);
        let commands = get_commands(&["k", "l"]);
        let mut pass = Calls::new("GET pipeline", &commands, SMALL_REPLY);
        let started = Instant::now();
        run_job(&router, &[7, 8], started + T, &mut pass);
        let took = started.elapsed();
        for reply in pass.into_replies() {
            let e = reply.unwrap_err();
            assert!(
                e.message().contains("redirected on each of 5 passes"),
                "{e}"
            );
        }
        // Paused 10, 20, 40 and 80 ms between the five passes.
        assert!(took >= FIRST_PAUSE * 15 && took < T, "{took:?}");
    }

    #[test]
    fn ask_goes_to_the_node_named_behind_asking_and_the_map_stays() {
        let b = serve_commands(|args, previous| {
            let asked = previous.is_some_and(|p| is(p, b"ASKING"));
            if is(args, b"ASKING") {
                b"+OK\r\n".to_vec()
            } else if asked {
                b"$6\r\nfrom b\r\n".to_vec()
            } else {
                b"-ERR not behind ASKING\r\n".to_vec()
            }
        });
        let a_port = Arc::new(AtomicUsize::new(0));
        let own = Arc::clone(&a_port);
        let a = serve_commands(move |args, _| {
            if is(args, b"CLUSTER") {
                return all_slots_at(own.load(Ordering::SeqCst) as u16);
            }
            format!("-ASK 7 127.0.0.1:{b}\r\n").into_bytes()
        });
        a_port.store(a as usize, Ordering::SeqCst);
        let router = router_at(a);
        let commands = get_commands(&["k", "l", "m"]);
        let mut pass = Calls::new("GET pipeline", &commands, SMALL_REPLY);
        run_job(&router, &[7, 7, 7], Instant::now() + T, &mut pass);
        for reply in pass.into_replies() {
            assert_eq!(reply, Ok(Value::BulkString(b"from b".to_vec())));
        }
        // ASK leaves the map as it was: read once, at open.
        assert!(
            router
                .describe()
                .contains("read 1 times; 3 blocks rerouted"),
            "{}",
            router.describe()
        );
    }
}
