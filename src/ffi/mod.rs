//! The C ABI: a thin unsafe shell over the safe core.
//!
//! Every export converts its raw arguments through [`boundary`] (NULL checks,
//! slices, the panic boundary, the thread's last error) and calls the core. The
//! header `include/kvtier.h` is generated from this module by cbindgen.

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)] // each export's safety rules are in its header docs

mod api;
mod api_items;
mod api_jobs;
mod api_observe;
mod boundary;
mod types;

pub use api::*;
pub use api_items::*;
pub use api_jobs::*;
pub use api_observe::*;
pub use types::*;

#[cfg(test)]
mod tests;
