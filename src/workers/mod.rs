//! The I/O workers: the work queue (`queue`: lanes in order of service, one
//! idle worker polling, the rest asleep), the threads that drain it and the
//! watchdog (`pool`), each handing its work to an [`Executor`] (the engine),
//! and their accounting and deadlines (`crew`).
//!
//! The workers know nothing of the engine above them: the queue is generic
//! over its copy task (a [`CopyTask`] says only its kind and job id), and the
//! crew over what a storage call copies for; the engine names both types.

mod crew;
mod pool;
mod queue;

pub(crate) use self::crew::{Crew, Worker};
pub(crate) use self::pool::{Executor, Pool};
pub(crate) use self::queue::{CopyTask, Lane, Work, WorkQueue};
