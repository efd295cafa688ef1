//! `Backend::profile_kernels` on CUDA: while on, every kernel launch and cuBLAS product is
//! bracketed by two timed events on the compute stream and waited for, so each is timed alone
//! (slow: for finding where a step's time goes, not for measuring the step), and its device
//! time is tallied under its name.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaEvent, CudaStream, sys::CUevent_flags};

use lockstep_core::Result;
use lockstep_core::backend::KernelTime;

use crate::error::driver_error;

#[derive(Default)]
pub(crate) struct Profiler {
    on: AtomicBool,
    /// Launches and seconds by kernel name.
    tally: Mutex<BTreeMap<&'static str, (u64, f64)>>,
}

/// The start of one timed launch; `None` while profiling is off (costs one atomic read).
pub(crate) struct Timing(Option<CudaEvent>);

impl Profiler {
    /// Starts (clearing the tally) or stops timing.
    pub(crate) fn set(&self, on: bool) {
        if on {
            self.tally.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        self.on.store(on, Ordering::Relaxed);
    }

    /// Before a launch on `stream`: an event after everything queued so far.
    pub(crate) fn start(&self, location: &str, stream: &CudaStream) -> Result<Timing> {
        if !self.on.load(Ordering::Relaxed) {
            return Ok(Timing(None));
        }
        let start = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error(location, "profiling event", e))?;
        Ok(Timing(Some(start)))
    }

    /// After the launch of `name`: waits for it and adds its device time to the tally.
    pub(crate) fn finish(&self, timing: Timing, name: &'static str, location: &str, stream: &CudaStream) -> Result<()> {
        let Timing(Some(start)) = timing else { return Ok(()) };
        let fail = |e| driver_error(location, "profiling event", e);
        let end = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(fail)?;
        end.synchronize().map_err(fail)?;
        let ms = start.elapsed_ms(&end).map_err(fail)?;
        let mut tally = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        let entry = tally.entry(name).or_default();
        entry.0 += 1;
        entry.1 += f64::from(ms) * 1e-3;
        Ok(())
    }

    /// The tally, longest first (ties by name, so the order is fixed).
    pub(crate) fn times(&self) -> Vec<KernelTime> {
        let tally = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        let mut times: Vec<KernelTime> = tally
            .iter()
            .map(|(name, &(launches, seconds))| KernelTime {
                name: name.to_string(),
                launches,
                seconds,
            })
            .collect();
        times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.name.cmp(&b.name)));
        times
    }
}
