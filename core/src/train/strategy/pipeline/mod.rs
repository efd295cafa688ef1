//! Pipeline parallelism: a layer sequence split into stages on several devices, micro-batches
//! flowing through them on a schedule: schedules as data (`schedule`), checked and simulated
//! without devices (`timeline`), run by one executor (a thread per stage), behind the
//! `Pipeline` strategy.

mod executor;
mod processes;
mod schedule;
mod strategy;
mod ties;
mod timeline;

pub use executor::{StageCompute, StepProfile};
pub use processes::ProcessStages;
pub use schedule::{Action, Pass, Schedule, ScheduleKind};
pub use strategy::Pipeline;
pub(in crate::train::strategy) use strategy::staged;
pub use timeline::{PassCosts, Timeline};
