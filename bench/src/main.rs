//! The `kvtier-bench` binary: the benchmark of `lib.rs` with this process's
//! arguments (`kvtier bench` runs the same one).

fn main() -> std::process::ExitCode {
    bench::run(std::env::args_os())
}
