//! Pipeline parallelism: a layer sequence split into stages on several devices, micro-batches
//! flowing through them on a schedule. This far: the schedules, their validator and simulator.

mod schedule;
mod timeline;

pub use schedule::{Action, Pass, Schedule, ScheduleKind};
pub use timeline::{PassCosts, Timeline};
