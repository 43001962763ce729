//! A fake Redis server on 127.0.0.1 for the tests of what a tier does when
//! replies are hostile or broken: it keeps values in memory and answers the
//! commands kvtier sends as a server would (PING, INFO, CLUSTER SLOTS and
//! NODES, SET, GET, DEL, EXISTS, TOUCH, SCAN, GETRANGE, AUTH, SELECT,
//! ASKING), unless the test's script says otherwise for a command: other
//! bytes, the normal reply and a surplus one, a pause, a stream, silence.
//! Needs no redis-server, so these tests never skip.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the fake answers one command with.
pub enum Answer {
    /// What a server would answer (the values updated as it would).
    Normal,
    /// These bytes instead.
    Bytes(Vec<u8>),
    /// These bytes after a pause (a slow node's answer).
    BytesAfter(Vec<u8>, Duration),
    /// The normal reply, then these bytes: a reply nobody asked for.
    NormalThen(Vec<u8>),
    /// The normal reply, then these bytes after a pause: a reply nobody
    /// asked for that arrives while the connection is idle or in use again.
    NormalThenLater(Vec<u8>, Duration),
    /// The normal reply after this pause.
    Delayed(Duration),
    /// `head`, then `piece` again and again (a pause between) while the
    /// client reads: a declared length streamed.
    Stream { head: Vec<u8>, piece: Vec<u8> },
    /// Nothing, ever (the connection stays open).
    Silence,
}

/// What the fake knows: its values and every command it was sent.
#[derive(Default)]
pub struct FakeState {
    pub values: HashMap<Vec<u8>, Vec<u8>>,
    /// Every command received, in order, its name upper-cased.
    pub commands: Vec<Vec<Vec<u8>>>,
}

impl FakeState {
    /// How many commands named `name` (upper case) were received.
    pub fn count(&self, name: &str) -> usize {
        self.commands
            .iter()
            .filter(|c| c[0] == name.as_bytes())
            .count()
    }

    /// How many `<name> <sub>` commands (`CLUSTER SLOTS`) were received.
    pub fn count_sub(&self, name: &str, sub: &str) -> usize {
        self.commands
            .iter()
            .filter(|c| c[0] == name.as_bytes())
            .filter(|c| {
                c.get(1)
                    .is_some_and(|a| a.eq_ignore_ascii_case(sub.as_bytes()))
            })
            .count()
    }
}

type Script = dyn Fn(&[Vec<u8>], &FakeState) -> Answer + Send + Sync;

/// A running fake server; it stops accepting when dropped (connections in
/// use end with their client).
pub struct FakeRedis {
    port: u16,
    pub state: Arc<Mutex<FakeState>>,
    stop: Arc<AtomicBool>,
}

impl FakeRedis {
    /// A single server whose answers `script` chooses (given the command,
    /// its name upper-cased, and what the fake knows).
    pub fn start(
        script: impl Fn(&[Vec<u8>], &FakeState) -> Answer + Send + Sync + 'static,
    ) -> FakeRedis {
        Self::start_as(false, script)
    }

    /// A cluster of one master serving every slot.
    pub fn start_cluster(
        script: impl Fn(&[Vec<u8>], &FakeState) -> Answer + Send + Sync + 'static,
    ) -> FakeRedis {
        Self::start_as(true, script)
    }

    fn start_as(
        cluster: bool,
        script: impl Fn(&[Vec<u8>], &FakeState) -> Answer + Send + Sync + 'static,
    ) -> FakeRedis {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let state = Arc::new(Mutex::new(FakeState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let (st, halt) = (Arc::clone(&state), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        let (st, script, halt) =
                            (Arc::clone(&st), Arc::clone(&script), Arc::clone(&halt));
                        std::thread::spawn(move || {
                            serve(stream, cluster, port, &st, &*script, &halt)
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        FakeRedis { port, state, stop }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// How many commands named `name` (upper case) were received.
    pub fn count(&self, name: &str) -> usize {
        self.state.lock().unwrap().count(name)
    }

    /// How many `<name> <sub>` commands (`CLUSTER SLOTS`) were received.
    pub fn count_sub(&self, name: &str, sub: &str) -> usize {
        self.state.lock().unwrap().count_sub(name, sub)
    }

    /// A copy of the values held.
    pub fn values(&self) -> HashMap<Vec<u8>, Vec<u8>> {
        self.state.lock().unwrap().values.clone()
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One connection: commands read, answered as the script says.
fn serve(
    stream: TcpStream,
    cluster: bool,
    port: u16,
    state: &Mutex<FakeState>,
    script: &Script,
    stop: &AtomicBool,
) {
    let mut out = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    while let Some(mut args) = read_command(&mut r) {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        args[0].make_ascii_uppercase();
        let (answer, normal) = {
            let mut st = state.lock().unwrap();
            st.commands.push(args.clone());
            let answer = script(&args, &st);
            let normal = match answer {
                Answer::Normal
                | Answer::NormalThen(_)
                | Answer::NormalThenLater(..)
                | Answer::Delayed(_) => normal_reply(&args, &mut st, cluster, port),
                _ => Vec::new(),
            };
            (answer, normal)
        };
        let written = match answer {
            Answer::Normal => out.write_all(&normal),
            Answer::Bytes(bytes) => out.write_all(&bytes),
            Answer::BytesAfter(bytes, pause) => {
                std::thread::sleep(pause);
                out.write_all(&bytes)
            }
            Answer::NormalThen(more) => out.write_all(&normal).and_then(|()| {
                out.flush()?;
                out.write_all(&more)
            }),
            Answer::NormalThenLater(more, pause) => out.write_all(&normal).and_then(|()| {
                out.flush()?;
                std::thread::sleep(pause);
                out.write_all(&more)
            }),
            Answer::Delayed(pause) => {
                std::thread::sleep(pause);
                out.write_all(&normal)
            }
            Answer::Stream { head, piece } => {
                let mut w = out.write_all(&head);
                while w.is_ok() && !stop.load(Ordering::Relaxed) {
                    w = out.write_all(&piece);
                    std::thread::sleep(Duration::from_millis(1));
                }
                return;
            }
            Answer::Silence => {
                // Read on (and drop) whatever comes until the client goes.
                let mut sink = [0u8; 4096];
                while matches!(r.read(&mut sink), Ok(n) if n > 0) {}
                return;
            }
        };
        if written.is_err() {
            return;
        }
    }
}

/// One command (an array of bulk strings); None when the client is gone.
fn read_command(r: &mut BufReader<TcpStream>) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    let mut number = |r: &mut BufReader<TcpStream>| -> Option<usize> {
        line.clear();
        r.read_line(&mut line).ok().filter(|&n| n > 0)?;
        line[1..].trim_end().parse().ok()
    };
    let argc = number(r)?;
    let mut args = Vec::with_capacity(argc);
    for _ in 0..argc {
        let len = number(r)?;
        let mut arg = vec![0u8; len + 2];
        r.read_exact(&mut arg).ok()?;
        arg.truncate(len);
        args.push(arg);
    }
    Some(args)
}

pub fn bulk(bytes: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
    out
}

fn int(n: usize) -> Vec<u8> {
    format!(":{n}\r\n").into_bytes()
}

/// What a server would answer.
fn normal_reply(args: &[Vec<u8>], st: &mut FakeState, cluster: bool, port: u16) -> Vec<u8> {
    let arg = |i: usize| args.get(i).map(Vec::as_slice).unwrap_or_default();
    let number = |i: usize| -> i64 {
        std::str::from_utf8(arg(i))
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    match args[0].as_slice() {
        b"PING" => b"+PONG\r\n".to_vec(),
        b"AUTH" | b"SELECT" | b"ASKING" => b"+OK\r\n".to_vec(),
        b"INFO" => bulk(format!("# Cluster\r\ncluster_enabled:{}\r\n", cluster as u8).as_bytes()),
        b"CLUSTER" if !cluster => b"-ERR This instance has cluster support disabled\r\n".to_vec(),
        b"CLUSTER" if arg(1).eq_ignore_ascii_case(b"SLOTS") => {
            format!("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:{port}\r\n").into_bytes()
        }
        b"CLUSTER" => bulk(
            format!("f00d 127.0.0.1:{port}@1{port} myself,master - 0 0 1 connected 0-16383\n")
                .as_bytes(),
        ),
        b"SET" => {
            st.values.insert(arg(1).to_vec(), arg(2).to_vec());
            b"+OK\r\n".to_vec()
        }
        b"GET" => match st.values.get(arg(1)) {
            Some(v) => bulk(v),
            None => b"$-1\r\n".to_vec(),
        },
        b"DEL" => int(args[1..]
            .iter()
            .filter(|k| st.values.remove(k.as_slice()).is_some())
            .count()),
        b"EXISTS" | b"TOUCH" => int(args[1..]
            .iter()
            .filter(|k| st.values.contains_key(k.as_slice()))
            .count()),
        b"SCAN" => {
            let prefix = arg(3).strip_suffix(b"*").unwrap_or(arg(3));
            let names: Vec<Vec<u8>> = st
                .values
                .keys()
                .filter(|k| k.starts_with(prefix))
                .map(|k| bulk(k))
                .collect();
            let mut out = format!("*2\r\n$1\r\n0\r\n*{}\r\n", names.len()).into_bytes();
            names.iter().for_each(|n| out.extend_from_slice(n));
            out
        }
        b"GETRANGE" => {
            let v = st.values.get(arg(1)).cloned().unwrap_or_default();
            let end = (number(3).max(0) as usize + 1).min(v.len());
            let start = (number(2).max(0) as usize).min(end);
            bulk(&v[start..end])
        }
        _ => b"-ERR unknown command\r\n".to_vec(),
    }
}

/// Resident memory of this process, in bytes (Linux: /proc/self/status).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}
