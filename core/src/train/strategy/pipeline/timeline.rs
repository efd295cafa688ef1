//! Checking and simulating a schedule without devices: every stage runs its actions in order,
//! a forward waits for the previous stage's forward of the same micro-batch, a backward for the
//! next stage's backward. A schedule that would hang (a stage waiting for something that never
//! comes) is rejected before any device runs it.

use std::collections::HashMap;
use std::fmt::Write;

use super::schedule::{Action, Pass, Schedule};
use crate::error::{Error, Result};

/// What each pass costs in the simulation, in any unit (measured seconds or 1 and 2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassCosts {
    /// Cost of one stage's forward pass of one micro-batch.
    pub forward: f64,
    /// Cost of one stage's backward pass of one micro-batch (twice the forward by default).
    pub backward: f64,
}

impl Default for PassCosts {
    /// Backward costs about twice forward (two matmuls per matmul).
    fn default() -> PassCosts {
        PassCosts {
            forward: 1.0,
            backward: 2.0,
        }
    }
}

/// When each action ran, by stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// Per stage, (action, start, end) in order.
    pub spans: Vec<Vec<(Action, f64, f64)>>,
    /// When the last action ends: the step's length, in the costs' unit.
    pub makespan: f64,
}

impl Schedule {
    /// An error naming the first fault: an action on the wrong stage, a micro-batch missing or
    /// run twice, a backward before its forward, or stages whose order would hang.
    pub fn validate(&self) -> Result<()> {
        self.simulate(PassCosts::default()).map(drop)
    }

    /// Runs the schedule with `costs` (after validating its structure).
    pub fn simulate(&self, costs: PassCosts) -> Result<Timeline> {
        self.check_structure()?;
        let mut finished: HashMap<Action, f64> = HashMap::new();
        let mut next = vec![0usize; self.stages];
        let mut spans = vec![Vec::new(); self.stages];
        let mut free_at = vec![0.0f64; self.stages];
        loop {
            let mut progressed = false;
            for stage in 0..self.stages {
                while let Some(&action) = self.actions[stage].get(next[stage]) {
                    let Some(ready) = self.dependency(action).map_or(Some(0.0), |d| finished.get(&d).copied()) else {
                        break;
                    };
                    let start = ready.max(free_at[stage]);
                    let end = start
                        + match action.pass {
                            Pass::Forward => costs.forward,
                            Pass::Backward => costs.backward,
                        };
                    finished.insert(action, end);
                    spans[stage].push((action, start, end));
                    free_at[stage] = end;
                    next[stage] += 1;
                    progressed = true;
                }
            }
            if next.iter().zip(&self.actions).all(|(&n, a)| n == a.len()) {
                break;
            }
            if !progressed {
                return Err(self.deadlock(&next));
            }
        }
        let makespan = free_at.iter().copied().fold(0.0, f64::max);
        Ok(Timeline { spans, makespan })
    }

    /// The most micro-batches whose activations each stage holds at once (forwarded, not yet
    /// backwarded): M for GPipe, stages − stage for 1F1B.
    pub fn peak_activations(&self) -> Vec<usize> {
        self.actions
            .iter()
            .map(|actions| {
                let (mut held, mut peak) = (0usize, 0usize);
                for a in actions {
                    match a.pass {
                        Pass::Forward => held += 1,
                        Pass::Backward => held = held.saturating_sub(1),
                    }
                    peak = peak.max(held);
                }
                peak
            })
            .collect()
    }

    /// The action on another stage that `action` waits for.
    fn dependency(&self, action: Action) -> Option<Action> {
        let Action { stage, pass, micro } = action;
        match pass {
            Pass::Forward if stage > 0 => Some(Action {
                stage: stage - 1,
                pass,
                micro,
            }),
            Pass::Backward if stage + 1 < self.stages => Some(Action {
                stage: stage + 1,
                pass,
                micro,
            }),
            _ => None,
        }
    }

    fn check_structure(&self) -> Result<()> {
        let fault = |what: String| Error::invalid("pipeline schedule", what);
        if self.actions.len() != self.stages {
            return Err(fault(format!(
                "{} action lists for {} stages",
                self.actions.len(),
                self.stages
            )));
        }
        for (stage, actions) in self.actions.iter().enumerate() {
            let mut seen: HashMap<(Pass, usize), usize> = HashMap::new();
            for (i, a) in actions.iter().enumerate() {
                if a.stage != stage || a.micro >= self.micro_batches {
                    return Err(fault(format!(
                        "{a} is in stage {stage}'s list, which runs stages {stage}'s micro-batches 0..{}",
                        self.micro_batches
                    )));
                }
                if seen.insert((a.pass, a.micro), i).is_some() {
                    return Err(fault(format!("{a} runs twice")));
                }
                if a.pass == Pass::Backward && !seen.contains_key(&(Pass::Forward, a.micro)) {
                    return Err(fault(format!("{a} comes before its forward")));
                }
            }
            for micro in 0..self.micro_batches {
                for pass in [Pass::Forward, Pass::Backward] {
                    let a = Action { stage, pass, micro };
                    if !seen.contains_key(&(pass, micro)) {
                        return Err(fault(format!("{a} is missing from stage {stage}")));
                    }
                }
            }
        }
        Ok(())
    }

    fn deadlock(&self, next: &[usize]) -> Error {
        let waits: Vec<String> = (0..self.stages)
            .filter_map(|stage| {
                let action = *self.actions[stage].get(next[stage])?;
                let on = self.dependency(action)?;
                Some(format!("{action} waits for {on}"))
            })
            .collect();
        Error::invalid(
            "pipeline schedule",
            format!("the stages would wait for each other forever: {}", waits.join(", ")),
        )
    }
}

impl Timeline {
    /// The share of stage-time spent idle: (P−1)/(M+P−1) for GPipe and 1F1B at uniform costs.
    pub fn bubble_fraction(&self) -> f64 {
        let busy: f64 = self.spans.iter().flatten().map(|(_, start, end)| end - start).sum();
        let capacity = self.spans.len() as f64 * self.makespan;
        if capacity > 0.0 { 1.0 - busy / capacity } else { 0.0 }
    }

    /// One row per stage, one cell of `unit` time per column: the action's name where it
    /// runs, `.` where the stage waits.
    pub fn render(&self, unit: f64) -> String {
        let columns = (self.makespan / unit).round() as usize;
        let mut out = String::new();
        for (stage, spans) in self.spans.iter().enumerate() {
            let mut cells = vec![" . ".to_string(); columns];
            for (action, start, end) in spans {
                let (first, last) = ((start / unit).round() as usize, (end / unit).round() as usize);
                let pass = if action.pass == Pass::Forward { 'F' } else { 'B' };
                let label = format!("{pass}{}", action.micro);
                for cell in cells.iter_mut().take(last).skip(first) {
                    *cell = format!("{label:<3}");
                }
            }
            let _ = writeln!(out, "stage {stage} | {}", cells.concat().trim_end());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::schedule::ScheduleKind;
    use super::*;

    fn theory(p: usize, m: usize) -> f64 {
        (p - 1) as f64 / (m + p - 1) as f64
    }

    #[test]
    fn both_schedules_have_the_textbook_bubble() {
        for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
            for (p, m) in [(2, 1), (2, 8), (4, 4), (4, 8), (3, 5)] {
                let s = Schedule::new(kind, p, m).unwrap();
                let t = s.simulate(PassCosts::default()).unwrap();
                assert!(
                    (t.bubble_fraction() - theory(p, m)).abs() < 1e-12,
                    "{kind:?} P={p} M={m}: {}",
                    t.bubble_fraction()
                );
                assert_eq!(t.makespan, 3.0 * (m + p - 1) as f64);
            }
        }
    }

    #[test]
    fn one_f_one_b_holds_fewer_activations_than_gpipe() {
        let (p, m) = (4, 8);
        let gpipe = Schedule::new(ScheduleKind::GPipe, p, m).unwrap();
        assert_eq!(gpipe.peak_activations(), vec![8; 4]);
        let ofob = Schedule::new(ScheduleKind::OneFOneB, p, m).unwrap();
        assert_eq!(ofob.peak_activations(), vec![4, 3, 2, 1]);
    }

    #[test]
    fn broken_schedules_are_rejected() {
        let good = Schedule::new(ScheduleKind::OneFOneB, 2, 2).unwrap();
        good.validate().unwrap();
        let err_of = |s: &Schedule| s.validate().unwrap_err().to_string();

        let mut twice = good.clone();
        twice.actions[0][1] = twice.actions[0][0];
        assert!(err_of(&twice).contains("0F0 runs twice"), "{}", err_of(&twice));

        let mut backward_first = good.clone();
        backward_first.actions[1].swap(0, 1);
        assert!(err_of(&backward_first).contains("1B0 comes before its forward"));

        let mut missing = good.clone();
        missing.actions[1].pop();
        assert!(err_of(&missing).contains("1B1 is missing"));

        let mut elsewhere = good.clone();
        elsewhere.actions[0][0].stage = 1;
        assert!(err_of(&elsewhere).contains("stage 0's list"));

        // Stage 0 runs micro-batch 1 first and stage 1 micro-batch 0: each forward is correct
        // on its own, but stage 1 waits for 0F0 behind 0B1, which waits for 1B1.
        let mut crossed = good.clone();
        crossed.actions[0] = ["0F1", "0B1", "0F0", "0B0"].map(parse).to_vec();
        let err = err_of(&crossed);
        assert!(
            err.contains("wait for each other forever") && err.contains("1F0 waits for 0F0"),
            "{err}"
        );
    }

    fn parse(s: &str) -> Action {
        let b = s.as_bytes();
        Action {
            stage: usize::from(b[0] - b'0'),
            pass: if b[1] == b'F' { Pass::Forward } else { Pass::Backward },
            micro: usize::from(b[2] - b'0'),
        }
    }

    #[test]
    fn the_timeline_shows_each_stage_working_and_waiting() {
        let s = Schedule::new(ScheduleKind::GPipe, 2, 2).unwrap();
        let costs = PassCosts {
            forward: 1.0,
            backward: 1.0,
        };
        let text = s.simulate(costs).unwrap().render(1.0);
        assert_eq!(
            text, "stage 0 | F0 F1  .  . B0 B1\nstage 1 |  . F0 F1 B0 B1  .\n",
            "\n{text}"
        );
    }
}
