//! `kvtier`: the operator's command for a kvtier store, a disk directory
//! (a tier's `path`: shared or not, live or closed) or a Redis or Redis
//! Cluster keyspace (URL and `key_prefix`): `inspect`, `verify`, `gc`,
//! `clear`, and `bench` (the benchmark, `kvtier-bench`). Formats are read
//! through `kvtier::admin`; docs/cli.md is the reference.
//!
//! Exit status: 0 when the store is clean or the command did what it was
//! asked, 1 when `verify` found problems (that `--repair` did not remove) or
//! the command could not do what it was asked, 2 on bad usage.

mod disk;
mod progress;
mod redis;
mod report;

use clap::{Args, Parser, Subcommand};
use report::{Outcome, PROBLEMS, USAGE};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Inspect, verify, garbage-collect and clear a kvtier store: a disk tier's
/// directory (its `path`) or a Redis keyspace (`redis://host:port`, several
/// comma-separated for a cluster's seeds, with --key-prefix).
#[derive(Parser)]
#[command(name = "kvtier", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Namespaces (and the identity that named them where known), blocks and
    /// bytes per namespace and tenant, formats, ages, temporary debris, the
    /// manifest's and journals' state, and who holds each directory.
    Inspect {
        #[command(flatten)]
        store: StoreArgs,
        /// only this namespace (its name, as tiers were configured)
        #[arg(long, value_name = "N")]
        namespace: Option<String>,
        /// disk: list and stat every file even where a trusted manifest
        /// would give the counts
        #[arg(long)]
        scan: bool,
    },
    /// Reads every block and checks header and checksum; reports damaged,
    /// foreign and orphan files, and blocks of generations a clear left.
    Verify {
        #[command(flatten)]
        store: StoreArgs,
        /// only this namespace
        #[arg(long, value_name = "N")]
        namespace: Option<String>,
        /// remove what a tier may remove (docs/reliability-rules.md):
        /// damaged blocks, stale generations, orphan temporaries
        #[arg(long)]
        repair: bool,
        /// then time raw reads (disk: O_DIRECT; Redis: GETs) of the same
        /// blocks against checks of them, alternating, this many times each
        #[arg(long, value_name = "RUNS", num_args = 0..=1, default_missing_value = "3")]
        bench: Option<usize>,
    },
    /// Brings the store under a budget, least recently used blocks first,
    /// while tiers keep using it.
    Gc {
        #[command(flatten)]
        store: StoreArgs,
        /// the budget: bytes or KiB/MiB/GiB/TiB
        #[arg(long, value_name = "B", value_parser = budget)]
        max_bytes: u64,
        /// only this namespace's blocks count and go
        #[arg(long, value_name = "N")]
        namespace: Option<String>,
    },
    /// Removes one namespace's blocks for every tier at once (its clear
    /// generation raised, as a tier's clear() raises it).
    Clear {
        #[command(flatten)]
        store: StoreArgs,
        /// the namespace, exactly as tiers were configured
        #[arg(long, value_name = "N")]
        namespace: String,
        /// the fleet's largest probe_ttl_ms: clear returns two of them after
        /// the generation was raised, when no tier still serves old blocks
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        probe_ttl_ms: u32,
        /// a sealed tenant's key file: its generation is raised through a
        /// tier of that key too (repeatable)
        #[arg(long, value_name = "PATH")]
        seal_key_file: Vec<PathBuf>,
    },
    /// The benchmark (kvtier-bench): `kvtier bench --help` for its flags.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

#[derive(Args)]
struct StoreArgs {
    /// a disk tier's path, or redis://host:port[,redis://...] (rediss:// for TLS)
    store: String,
    /// Redis: the tiers' key_prefix
    #[arg(long, value_name = "P", default_value = "kvtier")]
    key_prefix: String,
    /// print one JSON object instead of lines of text
    #[arg(long)]
    json: bool,
    /// no progress bar (there is none unless stderr is a terminal)
    #[arg(long)]
    no_progress: bool,
    /// threads listing and reading the store
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
}

/// What every subcommand takes besides its own arguments.
pub struct Common {
    pub threads: usize,
    pub progress: bool,
}

fn budget(text: &str) -> Result<u64, String> {
    kvtier::parse_size("max-bytes", text).map_err(|e| e.message().to_string())
}

/// Where the store is.
enum Store<'a> {
    Disk(&'a Path),
    Redis {
        seeds: Vec<&'a str>,
        key_prefix: &'a str,
    },
}

impl StoreArgs {
    fn store(&self) -> Store<'_> {
        if self.store.starts_with("redis://") || self.store.starts_with("rediss://") {
            Store::Redis {
                seeds: self.store.split(',').map(str::trim).collect(),
                key_prefix: &self.key_prefix,
            }
        } else {
            Store::Disk(Path::new(&self.store))
        }
    }

    fn common(&self) -> Common {
        Common {
            threads: self.threads as usize,
            progress: !self.no_progress && !self.json,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (store, result) = match &cli.command {
        Command::Bench { args } => {
            let argv = std::iter::once(OsString::from("kvtier bench")).chain(args.iter().cloned());
            return bench::run(argv);
        }
        Command::Inspect {
            store,
            namespace,
            scan,
        } => (
            store,
            match store.store() {
                Store::Disk(root) => {
                    disk::inspect::run(root, namespace.as_deref(), *scan, &store.common())
                }
                Store::Redis { seeds, key_prefix } => {
                    redis::inspect::run(&seeds, key_prefix, namespace.as_deref(), &store.common())
                }
            },
        ),
        Command::Verify {
            store,
            namespace,
            repair,
            bench,
        } => (
            store,
            match store.store() {
                Store::Disk(root) => {
                    disk::verify::run(root, namespace.as_deref(), *repair, *bench, &store.common())
                }
                Store::Redis { seeds, key_prefix } => redis::verify::run(
                    &seeds,
                    key_prefix,
                    namespace.as_deref(),
                    *repair,
                    *bench,
                    &store.common(),
                ),
            },
        ),
        Command::Gc {
            store,
            max_bytes,
            namespace,
        } => (
            store,
            match store.store() {
                Store::Disk(root) => {
                    disk::gc::run(root, namespace.as_deref(), *max_bytes, &store.common())
                }
                Store::Redis { seeds, key_prefix } => redis::gc::run(
                    &seeds,
                    key_prefix,
                    namespace.as_deref(),
                    *max_bytes,
                    &store.common(),
                ),
            },
        ),
        Command::Clear {
            store,
            namespace,
            probe_ttl_ms,
            seal_key_file,
        } => {
            if namespace.trim().is_empty() {
                eprintln!("kvtier clear: --namespace must name the namespace to clear");
                return ExitCode::from(USAGE);
            }
            let args = disk::clear::ClearArgs {
                namespace,
                probe_ttl_ms: *probe_ttl_ms,
                seal_key_files: seal_key_file,
            };
            (
                store,
                match store.store() {
                    Store::Disk(root) => disk::clear::run(root, &args, &store.common()),
                    Store::Redis { seeds, key_prefix } => {
                        redis::clear::run(&store.store, &seeds, key_prefix, &args, &store.common())
                    }
                },
            )
        }
    };
    match result {
        Ok(outcome) => print(store, outcome),
        Err(e) => {
            eprintln!("kvtier: {e}");
            if store.json {
                println!("{}", serde_json::json!({ "error": e }));
            }
            ExitCode::from(PROBLEMS)
        }
    }
}

fn print(store: &StoreArgs, outcome: Outcome) -> ExitCode {
    if store.json {
        println!("{}", outcome.json);
    } else {
        print!("{}", outcome.text);
    }
    ExitCode::from(outcome.status)
}
