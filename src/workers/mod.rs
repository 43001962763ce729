//! The I/O workers: the work queue (`queue`: lanes in order of service, one
//! idle worker polling, the rest asleep) and the pool of threads that drain
//! it (`pool`), each handing its work to an [`Executor`] (the engine).

mod pool;
mod queue;

pub(crate) use self::pool::{Executor, Pool};
pub(crate) use self::queue::{Lane, Work, WorkQueue};
