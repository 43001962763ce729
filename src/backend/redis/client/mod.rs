//! kvtier's Redis client: what speaks to the servers, below the backend
//! (which keeps the value format, sealing, verification and adoption).
//!
//! - `transport`: the connection to one server (`RespConn`) over TCP or
//!   TLS: the stream, connecting, writing (SIGPIPE-free);
//! - `deadline`: a request's deadline, every read and write bounded by it;
//! - `receive`: reads from the socket, into the read buffer or straight
//!   into a row, TLS records, the socket's wake-up mark;
//! - `reply`: RESP2 replies read (`parse_head` over a byte slice);
//! - `frame`: RESP commands written;
//! - `crate_adapter`: the redis crate's `ConnectionLike` over `RespConn`;
//! - `tls`: the rustls client configuration;
//! - `conn`: the connection pool, its leases and stall detection;
//! - `pipe`: a crate pipeline over either kind of pooled connection;
//! - `cluster`: a cluster's slot map, routes and redirections;
//! - `fanout`: a cluster job's pass over its masters.

pub(super) mod cluster;
pub(super) mod conn;
mod connect;
mod crate_adapter;
#[cfg(test)]
pub(super) mod fake;
pub(super) mod fanout;
pub(super) mod frame;
pub(super) mod pipe;
mod receive;
pub(super) mod reply;
mod send;
pub(super) mod tls;
pub(super) mod transport;
