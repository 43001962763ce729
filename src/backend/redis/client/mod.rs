//! kvtier's Redis client: what speaks to the servers, below the backend
//! (which keeps the value format, sealing, verification and adoption).
//! One client for a single server and a cluster alike: a single server is
//! a slot map of one node. The backend sees only what this file re-exports
//! (its modules are private), so it cannot reach past the front.
//!
//! - `url`: `redis://` and `rediss://` URLs;
//! - `transport`: the connection to one server (`RespConn`) over TCP or
//!   TLS: the stream and the request's deadline;
//! - `connect`: opening a connection (TLS handshake, AUTH, SELECT);
//! - `send` and `receive`: socket writes and reads (into the read buffer or
//!   straight into a row, TLS records, the socket's wake-up mark);
//! - `reply`: RESP2 replies (`parse_head` over a byte slice, whole replies);
//! - `refusal`: a server's error reply, typed (redirections, WRONGTYPE...);
//! - `frame`: RESP framing; `command`: whole commands off the data path;
//! - `tls`: the rustls client configuration;
//! - `conn`: the connection pool, its leases and stall detection;
//! - `routes`: the slot map, a pass's groups, redirections;
//! - `cluster`: the router (the map and a pool per node, read again);
//! - `fanout`: one pass of a job over its nodes (`Pass`), redirected
//!   blocks kept for the next;
//! - `job`: a job's passes (redirections, failovers);
//! - `calls`: whole commands sent as a job.

mod calls;
mod cluster;
mod command;
mod conn;
mod connect;
#[cfg(test)]
mod fake;
mod fanout;
mod frame;
mod job;
mod receive;
mod refusal;
mod reply;
mod routes;
mod send;
mod tls;
mod transport;
mod url;

pub(super) use self::calls::call_each;
pub(super) use self::cluster::Router;
pub(super) use self::conn::io_error;
#[cfg(test)]
pub(super) use self::fake::{redirecting_pair, serve, Turn};
pub(super) use self::fanout::{unsettled, Pass};
pub(super) use self::frame::{frame_bulk, frame_bulk_len, frame_command};
pub(super) use self::job::run_job;
pub(super) use self::refusal::{Problem, ServerError};
pub(super) use self::reply::{Head, Value, MAP_REPLY, SMALL_REPLY};
pub(super) use self::routes::slots_of;
pub(super) use self::tls::SharedConfig;
pub(super) use self::transport::RespConn;
pub(super) use self::url::{parse as parse_url, Endpoint};
