//! One module per subcommand, plus the small helpers they share.

pub mod bench;
pub mod check;
pub mod dashboard;
pub mod devices;
mod interrupt;
pub mod launch;
pub mod sample;
pub mod schedule;
mod table;
mod threads;
pub mod train;
