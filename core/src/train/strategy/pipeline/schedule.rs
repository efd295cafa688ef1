//! Pipeline schedules as data: for each stage, the forward and backward passes of each
//! micro-batch in the order that stage runs them. GPipe and 1F1B are pure generators, checked
//! by one validator and run by one executor (as `torch.distributed.pipelining` writes `1F0` for
//! stage 1's forward of micro-batch 0).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Which pass of a micro-batch an `Action` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    /// The stage's forward pass, written `F`; it needs the previous stage's activations.
    Forward,
    /// The stage's backward pass, written `B`; it needs the next stage's gradient.
    Backward,
}

/// One pass of one micro-batch through one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Action {
    /// The stage that runs it, from 0.
    pub stage: usize,
    /// Forward or backward (the `F` or `B` of `1F0`).
    pub pass: Pass,
    /// The micro-batch, from 0 (the batch's first samples first).
    pub micro: usize,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pass = match self.pass {
            Pass::Forward => 'F',
            Pass::Backward => 'B',
        };
        write!(f, "{}{pass}{}", self.stage, self.micro)
    }
}

/// The schedules built in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// Every micro-batch's forward, then every backward: a stage holds M micro-batches'
    /// activations.
    GPipe,
    /// After a warm-up of (stages − 1 − stage) forwards, one forward then one backward: a stage
    /// holds at most (stages − stage) micro-batches' activations, the same bubble as GPipe.
    OneFOneB,
}

impl ScheduleKind {
    /// The lowercase name that `FromStr` reads back: `gpipe` or `1f1b`.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
        }
    }
}

impl FromStr for ScheduleKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<ScheduleKind> {
        match s.to_ascii_lowercase().as_str() {
            "gpipe" => Ok(ScheduleKind::GPipe),
            "1f1b" => Ok(ScheduleKind::OneFOneB),
            other => Err(Error::invalid(
                "pipeline schedule",
                format!("unknown schedule `{other}`; choose gpipe or 1f1b"),
            )),
        }
    }
}

/// Each stage's actions, in the order it runs them.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Pipeline stages (P), at least 1.
    pub stages: usize,
    /// Micro-batches each batch is cut into (M), at least 1.
    pub micro_batches: usize,
    /// `actions[s]` is stage `s`'s actions, in the order it runs them.
    pub actions: Vec<Vec<Action>>,
}

impl Schedule {
    /// `kind` for `stages` stages and `micro_batches` micro-batches (both at least 1).
    pub fn new(kind: ScheduleKind, stages: usize, micro_batches: usize) -> Result<Schedule> {
        if stages == 0 || micro_batches == 0 {
            return Err(Error::invalid(
                "pipeline schedule",
                format!("{stages} stages and {micro_batches} micro-batches: both must be at least 1"),
            ));
        }
        let actions = (0..stages)
            .map(|stage| {
                let warmup = match kind {
                    ScheduleKind::GPipe => micro_batches,
                    ScheduleKind::OneFOneB => (stages - 1 - stage).min(micro_batches),
                };
                interleave(stage, micro_batches, warmup)
            })
            .collect();
        Ok(Schedule {
            stages,
            micro_batches,
            actions,
        })
    }
}

/// `warmup` forwards, then one forward and one backward while forwards remain, then the
/// remaining backwards; micro-batches in order in each pass.
fn interleave(stage: usize, micro_batches: usize, warmup: usize) -> Vec<Action> {
    let forward = |micro| Action {
        stage,
        pass: Pass::Forward,
        micro,
    };
    let backward = |micro| Action {
        stage,
        pass: Pass::Backward,
        micro,
    };
    let mut out: Vec<Action> = (0..warmup).map(forward).collect();
    let mut done_backward = 0;
    for micro in warmup..micro_batches {
        out.push(forward(micro));
        out.push(backward(done_backward));
        done_backward += 1;
    }
    out.extend((done_backward..micro_batches).map(backward));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(actions: &[Action]) -> String {
        actions.iter().map(Action::to_string).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn gpipe_runs_every_forward_then_every_backward() {
        let s = Schedule::new(ScheduleKind::GPipe, 2, 3).unwrap();
        assert_eq!(written(&s.actions[0]), "0F0 0F1 0F2 0B0 0B1 0B2");
        assert_eq!(written(&s.actions[1]), "1F0 1F1 1F2 1B0 1B1 1B2");
    }

    #[test]
    fn one_f_one_b_warms_up_by_the_distance_to_the_last_stage() {
        let s = Schedule::new(ScheduleKind::OneFOneB, 3, 4).unwrap();
        assert_eq!(written(&s.actions[0]), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3");
        assert_eq!(written(&s.actions[1]), "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3");
        assert_eq!(written(&s.actions[2]), "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3");
        // Fewer micro-batches than the warm-up: all forwards first.
        let short = Schedule::new(ScheduleKind::OneFOneB, 4, 2).unwrap();
        assert_eq!(written(&short.actions[0]), "0F0 0F1 0B0 0B1");
    }

    #[test]
    fn names_parse_and_sizes_are_checked() {
        assert_eq!("1F1B".parse::<ScheduleKind>().unwrap(), ScheduleKind::OneFOneB);
        assert_eq!("gpipe".parse::<ScheduleKind>().unwrap().name(), "gpipe");
        let err = "zigzag".parse::<ScheduleKind>().unwrap_err().to_string();
        assert!(err.contains("gpipe or 1f1b"), "{err}");
        let err = Schedule::new(ScheduleKind::GPipe, 2, 0).unwrap_err().to_string();
        assert!(err.contains("at least 1"), "{err}");
    }
}
