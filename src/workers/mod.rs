//! The I/O workers: the work queue (`queue`: lanes in order of service, one
//! idle worker polling, the rest asleep), the threads that drain it and the
//! watchdog (`pool`), each handing its work to an [`Executor`] (the engine),
//! and their accounting and deadlines (`crew`).

mod crew;
mod pool;
mod queue;

pub(crate) use self::crew::{Crew, Worker};
pub(crate) use self::pool::{Executor, Pool};
pub(crate) use self::queue::{Lane, Work, WorkQueue};
