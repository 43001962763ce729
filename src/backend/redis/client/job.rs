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
        for (i, how) in &trouble.redirected {
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
