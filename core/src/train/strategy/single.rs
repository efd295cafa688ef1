//! One model on one device.

use super::replica_reports::device_stats;
use super::{StepReports, Strategy};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::train::TrainingSetup;
use crate::train::config::TrainerConfig;
use crate::train::events::StepTimes;
use crate::train::step::{self, MicroBatch};

/// The default strategy: forward and backward on `TrainingSetup::device`, nothing to agree on.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleDevice;

impl Strategy for SingleDevice {
    fn setup(&mut self, setup: &mut TrainingSetup, config: &TrainerConfig) -> Result<Vec<String>> {
        step::check_precision(config.precision, &setup.device)?;
        step::check_no_replica_check(config, "a run on one device")?;
        Ok(vec![setup.device.location().to_string()])
    }

    fn forward_backward(
        &mut self,
        setup: &TrainingSetup,
        micro: &MicroBatch<'_>,
        times: &mut StepTimes,
    ) -> Result<Tensor> {
        step::forward_backward(setup, micro, micro.weight, times)
    }

    fn step_reports(&mut self, setup: &TrainingSetup, _mine: &StepTimes) -> Result<StepReports> {
        let name = setup.device.location().to_string();
        Ok(StepReports {
            worker_times: Vec::new(),
            devices: vec![device_stats(&setup.device, &name)],
        })
    }
}
