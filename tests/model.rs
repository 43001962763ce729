//! Randomized model test: random sequences of store / load / lookup / touch /
//! poll / clear / run-a-job on a tier whose jobs run only when the test says
//! so, checked step by step against a plain reference model of the contract.
//!
//! Because the test decides when each job's copy runs, every interleaving the
//! workers could produce is reachable and the expected outcome is exact: result
//! order and fields, lookup states, LRU victims (recency follows stores,
//! touches and loads), pins, bytes in rows, stats, and the block events.

mod common;

use common::*;
use kvtier::TierConfig;
use kvtier::{ErrorKind, EventKind, JobKind, JobResult, LookupState, RemovedReason, StoredReason};
use std::collections::{HashMap, VecDeque};

const BB: usize = 64;
const KEYS: u64 = 12;
const DEST_ROWS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    Storing,
    Ready,
}

#[derive(Clone, Debug)]
struct Entry {
    id: u64,
    key: u64,
    state: State,
    pins: u32,
    linked: bool,
}

#[derive(Debug)]
struct Job {
    kind: JobKind,
    keys: Vec<u64>,
    rows: Vec<i64>,
    /// (position, entry id) of blocks to copy.
    items: Vec<(u32, u64)>,
    /// Store: entries of keys found present, pinned until completion.
    pinned: Vec<u64>,
    deps: usize,
    expected: JobResult,
}

#[derive(Default)]
struct Model {
    capacity: usize,
    entries: Vec<Entry>,
    next_entry: u64,
    /// Ready, linked keys, least recent first.
    lru: Vec<u64>,
    jobs: HashMap<u64, Job>,
    runnable: Vec<u64>,
    completed: VecDeque<JobResult>,
    evictions: u64,
    /// Block events not yet polled: (kind, key).
    events: Vec<(EventKind, u64)>,
}

impl Model {
    fn linked(&self, key: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.linked && e.key == key)
    }

    fn by_id(&self, id: u64) -> usize {
        self.entries.iter().position(|e| e.id == id).expect("entry")
    }

    fn expected(kind: JobKind, job: u64, n: usize) -> JobResult {
        JobResult {
            job_id: job,
            kind,
            error: None,
            reason: kvtier::FailReason::None,
            num_blocks: n as u32,
            num_done: n as u32,
            bytes: 0,
            elapsed_ns: 0,
            io_ns: 0,
        }
    }

    fn store(&mut self, job: u64, keys: &[u64], rows: &[i64]) {
        let mut expected = Self::expected(JobKind::Store, job, keys.len());
        let mut present = 0;
        let mut new: Vec<u64> = Vec::new();
        for &k in keys {
            if self.linked(k).is_some() {
                present += 1;
            } else if !new.contains(&k) {
                new.push(k);
            }
        }
        let pinned: Vec<u64> = keys
            .iter()
            .filter_map(|&k| self.linked(k).map(|e| self.entries[e].id))
            .collect();
        let free = self.capacity - self.entries.len();
        if new.len() > free {
            let victims: Vec<u64> = self
                .lru
                .iter()
                .copied()
                .filter(|k| !keys.contains(k) && self.entries[self.linked(*k).unwrap()].pins == 0)
                .take(new.len() - free)
                .collect();
            if victims.len() < new.len() - free {
                expected.error = Some(ErrorKind::NoSpace);
                expected.reason = kvtier::FailReason::NoSpace;
                expected.num_done = present;
                self.completed.push_back(expected);
                return;
            }
            for v in victims {
                let e = self.linked(v).unwrap();
                self.entries.remove(e);
                self.lru.retain(|&k| k != v);
                self.evictions += 1;
                self.events
                    .push((EventKind::Removed(RemovedReason::Evicted), v));
            }
        }
        expected.bytes = (new.len() * BB) as u64;
        if new.is_empty() {
            self.completed.push_back(expected);
            return;
        }
        for &id in &pinned {
            let e = self.by_id(id);
            self.entries[e].pins += 1;
        }
        let mut items = Vec::new();
        for k in new {
            let pos = keys.iter().position(|&x| x == k).unwrap() as u32;
            self.next_entry += 1;
            self.entries.push(Entry {
                id: self.next_entry,
                key: k,
                state: State::Storing,
                pins: 0,
                linked: true,
            });
            items.push((pos, self.next_entry));
        }
        self.jobs.insert(
            job,
            Job {
                kind: JobKind::Store,
                keys: keys.to_vec(),
                rows: rows.to_vec(),
                items,
                pinned,
                deps: 0,
                expected,
            },
        );
        self.runnable.push(job);
    }

    fn load(&mut self, job: u64, keys: &[u64], rows: &[i64]) {
        let mut expected = Self::expected(JobKind::Load, job, keys.len());
        let mut items = Vec::new();
        let mut deps = 0;
        for (pos, &k) in keys.iter().enumerate() {
            let Some(e) = self.linked(k) else {
                expected.error = Some(ErrorKind::NotFound);
                expected.reason = kvtier::FailReason::NotFound;
                expected.num_done = pos as u32;
                break;
            };
            self.entries[e].pins += 1;
            if self.entries[e].state == State::Storing {
                deps += 1;
            }
            items.push((pos as u32, self.entries[e].id));
        }
        expected.bytes = (items.len() * BB) as u64;
        if items.is_empty() {
            self.completed.push_back(expected);
            return;
        }
        self.jobs.insert(
            job,
            Job {
                kind: JobKind::Load,
                keys: keys.to_vec(),
                rows: rows.to_vec(),
                items,
                pinned: Vec::new(),
                deps,
                expected,
            },
        );
        if deps == 0 {
            self.runnable.push(job);
        }
    }

    /// Job positions whose key is in the tier (stored or being stored).
    fn present(&self, keys: &[u64]) -> u32 {
        keys.iter().filter(|&&k| self.linked(k).is_some()).count() as u32
    }

    /// The job ran: apply its completion. Returns it for row checks.
    fn run(&mut self, job_id: u64) -> Job {
        self.runnable.retain(|&j| j != job_id);
        let mut job = self.jobs.remove(&job_id).expect("job");
        match job.kind {
            JobKind::Store => {
                for &(_, id) in job.items.iter().rev() {
                    let e = self.by_id(id);
                    self.entries[e].state = State::Ready;
                    if self.entries[e].linked {
                        let key = self.entries[e].key;
                        self.lru.push(key);
                    } else if self.entries[e].pins == 0 {
                        self.entries.remove(e);
                    }
                    // Loads waiting on this block lose a dependency.
                    let mut woken = Vec::new();
                    for (&j, waiting) in self.jobs.iter_mut() {
                        if waiting.kind == JobKind::Load && waiting.deps > 0 {
                            let n = waiting.items.iter().filter(|&&(_, i)| i == id).count();
                            waiting.deps -= n;
                            if n > 0 && waiting.deps == 0 {
                                woken.push(j);
                            }
                        }
                    }
                    woken.sort_unstable();
                    self.runnable.extend(woken);
                }
                // Announced in key order, unless a clear came first.
                for &(_, id) in &job.items {
                    if let Some(e) = self.entries.iter().find(|e| e.id == id && e.linked) {
                        self.events
                            .push((EventKind::Stored(StoredReason::Written), e.key));
                    }
                }
            }
            JobKind::Delete => unreachable!("the model submits no deletes"),
            JobKind::Load => {
                // A read is a use: copied blocks become most recent, the
                // job's first key most recent of all.
                for &(_, id) in job.items.iter().rev() {
                    let e = self.by_id(id);
                    if self.entries[e].linked && self.entries[e].state == State::Ready {
                        let key = self.entries[e].key;
                        self.lru.retain(|&k| k != key);
                        self.lru.push(key);
                    }
                }
                for &(_, id) in &job.items {
                    let e = self.by_id(id);
                    self.entries[e].pins -= 1;
                    if self.entries[e].pins == 0 && !self.entries[e].linked {
                        self.entries.remove(e);
                    }
                }
            }
        }
        if job.kind == JobKind::Store {
            // What the job leaves behind: a clear meanwhile leaves nothing.
            job.expected.num_done = self.present(&job.keys);
            for &id in &job.pinned {
                let e = self.by_id(id);
                self.entries[e].pins -= 1;
                if self.entries[e].pins == 0
                    && !self.entries[e].linked
                    && self.entries[e].state == State::Ready
                {
                    self.entries.remove(e);
                }
            }
        }
        self.completed.push_back(job.expected);
        job
    }

    fn lookup(&self, key: u64) -> LookupState {
        match self.linked(key).map(|e| self.entries[e].state) {
            Some(State::Ready) => LookupState::Hit,
            Some(State::Storing) => LookupState::Pending,
            None => LookupState::Miss,
        }
    }

    fn touch(&mut self, keys: &[u64]) {
        for &k in keys.iter().rev() {
            if self.lookup(k) == LookupState::Hit {
                self.lru.retain(|&x| x != k);
                self.lru.push(k);
            }
        }
    }

    fn clear(&mut self) {
        for e in &mut self.entries {
            if e.linked && e.state == State::Ready {
                self.events
                    .push((EventKind::Removed(RemovedReason::Cleared), e.key));
            }
            e.linked = false;
        }
        self.entries
            .retain(|e| !(e.state == State::Ready && e.pins == 0));
        self.lru.clear();
    }
}

/// Events with each clear's removals (one run of CLEARED events, in no
/// promised order) sorted by key.
fn normalized(mut events: Vec<(EventKind, u64)>) -> Vec<(EventKind, u64)> {
    let cleared = EventKind::Removed(RemovedReason::Cleared);
    for run in events.chunk_by_mut(|a, b| a.0 == cleared && b.0 == cleared) {
        run.sort_unstable_by_key(|&(_, k)| k);
    }
    events
}

fn random_keys(rng: &mut Rng, max: u64) -> Vec<u64> {
    (0..rng.below(max + 1)).map(|_| rng.below(KEYS)).collect()
}

/// A tier configuration for (capacity in blocks, block bytes).
type Backend = fn(usize, usize) -> TierConfig;

fn memory(capacity: usize, block_bytes: usize) -> TierConfig {
    TierConfig {
        capacity_bytes: (capacity * block_bytes) as u64,
        ..TierConfig::default()
    }
}

fn run_one(seed: u64, steps: usize, backend: Backend) {
    let mut rng = Rng::new(seed);
    let capacity = 1 + rng.below(7) as usize;
    let config = with_events(backend(capacity, BB), 1 << 12);
    // Source row of key k is row k and always holds k's pattern; loads go to
    // rows KEYS.. .
    let h = Harness::manual(&config, KEYS as usize + DEST_ROWS, BB);
    for k in 0..KEYS {
        h.fill(k as usize, k);
    }
    let mut m = Model {
        capacity,
        ..Model::default()
    };
    let mut next_job = 1u64;
    let ctx = |step: usize, what: &str| format!("seed {seed} step {step}: {what}");
    for step in 0..steps {
        let t = h.tier();
        match rng.below(100) {
            0..=24 => {
                let ks = random_keys(&mut rng, 4);
                let rows: Vec<i64> = ks.iter().map(|&k| k as i64).collect();
                t.submit_store(next_job, &keys(&ks), KEY_LEN, &rows)
                    .unwrap();
                m.store(next_job, &ks, &rows);
                next_job += 1;
            }
            25..=39 => {
                let ks = random_keys(&mut rng, 4);
                // Distinct destination rows within a job.
                let first = rng.below(DEST_ROWS as u64) as usize;
                let rows: Vec<i64> = (0..ks.len())
                    .map(|p| (KEYS as usize + (first + p) % DEST_ROWS) as i64)
                    .collect();
                t.submit_load(next_job, &keys(&ks), KEY_LEN, &rows).unwrap();
                m.load(next_job, &ks, &rows);
                next_job += 1;
            }
            40..=59 => {
                if !m.runnable.is_empty() {
                    let job_id = m.runnable[rng.below(m.runnable.len() as u64) as usize];
                    assert!(
                        t.run_queued_job(job_id),
                        "{}",
                        ctx(step, &format!("job {job_id} not runnable"))
                    );
                    let job = m.run(job_id);
                    if job.kind == JobKind::Load {
                        for (pos, &k) in job
                            .keys
                            .iter()
                            .enumerate()
                            .take(job.expected.num_done as usize)
                        {
                            assert!(
                                h.row_holds(job.rows[pos] as usize, k),
                                "{}",
                                ctx(step, &format!("load {job_id} pos {pos} key {k}"))
                            );
                        }
                    }
                }
            }
            60..=71 => {
                let ks = random_keys(&mut rng, 6);
                let got = h.lookup(&ks);
                let want: Vec<LookupState> = ks.iter().map(|&k| m.lookup(k)).collect();
                assert_eq!(got, want, "{}", ctx(step, &format!("lookup {ks:?}")));
            }
            72..=79 => {
                let ks = random_keys(&mut rng, 3);
                h.touch(&ks);
                m.touch(&ks);
            }
            80..=91 => {
                let max = 1 + rng.below(3) as usize;
                for got in t.poll(max) {
                    let mut want = m
                        .completed
                        .pop_front()
                        .unwrap_or_else(|| panic!("{}", ctx(step, "extra result")));
                    // Copying is part of the job's life, so it cannot last longer.
                    assert!(got.io_ns <= got.elapsed_ns, "{}", ctx(step, "io_ns"));
                    want.elapsed_ns = got.elapsed_ns;
                    want.io_ns = got.io_ns;
                    assert_eq!(got, want, "{}", ctx(step, "result"));
                }
            }
            92..=93 => {
                t.clear().unwrap();
                m.clear();
            }
            94 => {
                // Release evicted storage now, possibly after the same key was
                // stored again: the new block must survive.
                t.run_background();
            }
            _ => {
                // Reusing the id of a job not yet polled is rejected, no result.
                if let Some(&busy) = m.jobs.keys().next() {
                    let err = t
                        .submit_store(busy, &keys(&[0]), KEY_LEN, &[0])
                        .unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::DuplicateJob, "{}", ctx(step, "dup"));
                }
            }
        }
        let got: Vec<(EventKind, u64)> = t
            .poll_events(usize::MAX)
            .unwrap()
            .iter()
            .map(|e| (e.kind, id_of(e.key())))
            .collect();
        assert_eq!(
            normalized(got),
            normalized(std::mem::take(&mut m.events)),
            "{}",
            ctx(step, "events")
        );
        let s = t.stats();
        let want = (
            m.lru.len() as u64,
            (m.entries.len() * BB) as u64,
            m.evictions,
        );
        assert_eq!(
            (s.num_blocks, s.used_bytes, s.evictions),
            want,
            "{}",
            ctx(step, "stats")
        );
        assert_eq!(
            s.jobs_in_flight,
            m.jobs.len() as u64,
            "{}",
            ctx(step, "in flight")
        );
        assert_eq!(
            s.results_queued,
            m.completed.len() as u64,
            "{}",
            ctx(step, "queued")
        );
    }
    // Finish everything: every accepted job is reported exactly once.
    while let Some(&job_id) = m.runnable.first() {
        assert!(h.tier().run_queued_job(job_id));
        m.run(job_id);
    }
    assert!(
        m.jobs.is_empty(),
        "seed {seed}: jobs stuck waiting: {:?}",
        m.jobs.keys()
    );
    let rest = h.tier().poll(usize::MAX);
    assert_eq!(rest.len(), m.completed.len(), "seed {seed}");
    for (got, want) in rest.iter().zip(&m.completed) {
        assert_eq!(
            (got.job_id, got.error, got.num_done),
            (want.job_id, want.error, want.num_done)
        );
    }
    let s = h.tier().stats();
    assert_eq!(
        (s.jobs_in_flight, s.used_bytes),
        (0, (m.entries.len() * BB) as u64)
    );
}

fn seeds(default: u64) -> u64 {
    std::env::var("KVTIER_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_sequences_match_the_model() {
    for seed in 0..seeds(400) {
        run_one(seed, 300, memory);
    }
}

#[test]
fn random_sequences_match_the_model_on_disk() {
    for seed in 0..seeds(400) / 8 {
        run_one(seed, 300, disk_config);
    }
}

#[test]
fn random_sequences_match_the_model_on_redis() {
    if !(common::redis::redis_available() && common::redis::shared_server().is_some()) {
        return;
    }
    for seed in 0..seeds(400) / 8 {
        run_one(seed, 300, common::redis::standalone_config);
    }
}

#[test]
fn random_sequences_match_the_model_on_a_redis_cluster() {
    if !(common::redis::redis_available() && common::redis::shared_cluster().is_some()) {
        return;
    }
    for seed in 0..seeds(400) / 16 {
        run_one(seed, 300, common::redis::cluster_config);
    }
}
