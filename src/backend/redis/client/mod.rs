//! kvtier's Redis client: what speaks to the servers, below the backend
//! (which keeps the value format, sealing, verification and adoption).
//! One client for a single server and a cluster alike: a single server is
//! a slot map of one node.
//!
//! - `url`: `redis://` and `rediss://` URLs;
//! - `transport`: the connection to one server (`RespConn`) over TCP or
//!   TLS: the stream and the request's deadline;
//! - `connect`: opening a connection (TLS handshake, AUTH, SELECT);
//! - `send` and `receive`: socket writes and reads (into the read buffer or
//!   straight into a row, TLS records, the socket's wake-up mark);
//! - `reply`: RESP2 replies (`parse_head` over a byte slice, whole replies);
//! - `frame`: RESP framing; `command`: whole commands off the data path;
//! - `tls`: the rustls client configuration;
//! - `conn`: the connection pool, its leases and stall detection;
//! - `routes`: the slot map, a pass's groups, redirections;
//! - `cluster`: the router (the map and a pool per node, read again);
//! - `fanout`: one pass of a job over its nodes;
//! - `job`: a job's passes (redirections, failovers).

pub(super) mod cluster;
pub(super) mod command;
pub(super) mod conn;
mod connect;
#[cfg(test)]
pub(super) mod fake;
pub(super) mod fanout;
pub(super) mod frame;
pub(super) mod job;
mod receive;
pub(super) mod reply;
pub(super) mod routes;
mod send;
pub(super) mod tls;
pub(super) mod transport;
pub(super) mod url;
