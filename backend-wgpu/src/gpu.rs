//! One opened adapter: the wgpu device and queue, what the adapter can do, and the errors wgpu
//! reports out of band (validation, out of memory, device lost), kept until the next call can
//! return them as errors naming the device instead of panicking.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use lockstep_core::{Error, Result};

use crate::cooperative::Cooperative;
use crate::fault::{Fault, Faults};
use crate::scope;

pub struct Gpu {
    pub location: String,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    /// The cooperative-matrix shape the device was opened for, if the adapter offers one (the
    /// backend's self-test still decides whether products use it).
    pub cooperative: Option<Cooperative>,
    /// The first error wgpu reported outside an error scope, or the reason the device was lost.
    failure: Arc<Mutex<Option<String>>>,
    faults: Faults,
}

/// What loses a device, for its error messages.
const LOSS_CAUSES: &str = "usually a driver reset, a GPU hang or crash";

fn request(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    limits: &wgpu::Limits,
) -> std::result::Result<(wgpu::Device, wgpu::Queue), wgpu::RequestDeviceError> {
    let experimental = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        // SAFETY: the one experimental feature asked for is the cooperative matrices, used only
        // by matmul_coop.wgsl on shapes the adapter lists, behind a self-test at device open.
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    };
    pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("lockstep"),
        required_features: features,
        required_limits: limits.clone(),
        experimental_features: experimental,
        ..Default::default()
    }))
}

impl Gpu {
    /// Opens `adapter` as `location` with `limits`, asking for the features the backend uses.
    pub fn open(location: String, adapter: &wgpu::Adapter, limits: wgpu::Limits) -> Result<Gpu> {
        let info = adapter.get_info();
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        let features = adapter.features() & wanted;
        // With the cooperative matrices where the adapter offers a usable shape; a driver that
        // refuses them still opens without.
        let mut cooperative = Cooperative::of(adapter);
        let opened = match cooperative {
            Some(tier) => request(
                adapter,
                features | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | tier.translation.features(),
                &limits,
            )
            .or_else(|_| {
                cooperative = None;
                request(adapter, features, &limits)
            }),
            None => request(adapter, features, &limits),
        };
        let (device, queue) = opened.map_err(|e| Error::Device {
            device: location.clone(),
            msg: format!("could not open {} ({:?}): {e}", info.name, info.backend),
        })?;
        let features = device.features();
        let failure: Arc<Mutex<Option<String>>> = Arc::default();
        let on_error = failure.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            on_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e.to_string());
        }));
        let on_lost = failure.clone();
        device.set_device_lost_callback(move |reason, msg| {
            let detail = if msg.is_empty() {
                format!("{reason:?}")
            } else {
                format!("{reason:?}: {msg}")
            };
            on_lost
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(format!("the device was lost ({detail}; {LOSS_CAUSES})"));
        });
        // What the device grants, which may differ from what was asked.
        let limits = device.limits();
        Ok(Gpu {
            location,
            device,
            queue,
            info,
            limits,
            features,
            cooperative,
            failure,
            faults: Faults::default(),
        })
    }

    pub fn has_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }

    pub fn error(&self, msg: impl Into<String>) -> Error {
        Error::Device {
            device: self.location.clone(),
            msg: msg.into(),
        }
    }

    /// An error wgpu reported since the last check (it stays: a lost device stays lost).
    pub fn check(&self) -> Result<()> {
        match &*self.failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(msg) => Err(self.error(format!(
                "{msg} (on {}; results computed since may be wrong: restart the run, from its last checkpoint)",
                self.info.name
            ))),
            None => Ok(()),
        }
    }

    /// Runs `f` inside error scopes of every kind and turns what they catch into an error naming
    /// the device.
    pub fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        match scope::catching(&self.device, f) {
            (value, None) => Ok(value),
            (_, Some(e)) => Err(self.error(format!("{what}: {e}"))),
        }
    }

    /// Waits for all submitted work.
    pub fn wait(&self) -> Result<()> {
        self.wait_until(None)
    }

    /// Waits for `submission` and the work submitted before it (back-pressure: see `InFlight`).
    pub fn wait_for(&self, submission: wgpu::SubmissionIndex) -> Result<()> {
        self.wait_until(Some(submission))
    }

    /// Waits for `submission`, or for all submitted work.
    fn wait_until(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<()> {
        // Polling a lost device fails its fence wait, which wgpu 30 turns into a panic.
        self.check()?;
        // A loss the device has not reported yet still panics inside wgpu; that panic unwinds
        // out of wgpu's poll after it released its locks, so nothing is left half-updated.
        let polled = panic::catch_unwind(AssertUnwindSafe(|| {
            if self.faults.reset() {
                panic!("Error in Device::poll: Parent device is lost (an injected driver reset)");
            }
            self.device.poll(wgpu::PollType::Wait {
                submission_index: submission,
                timeout: None,
            })
        }));
        match polled {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(self.error(format!("waiting for the GPU failed: {e}"))),
            Err(panic) => self.lost(&panic_message(panic.as_ref())),
        }
        self.check()?;
        self.faults.waited();
        Ok(())
    }

    /// Records that the device was lost: every later call returns an error instead of using it.
    fn lost(&self, detail: &str) {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(format!(
                "the device was lost while waiting for it ({detail}; {LOSS_CAUSES})"
            ));
    }

    /// Makes `fault` happen (tests only).
    pub fn inject(&self, fault: Fault) {
        self.faults.arm(fault);
        if matches!(fault, Fault::Destroyed | Fault::ResetDuringWait) {
            self.device.destroy();
        }
    }

    /// Whether an injected fault holds the memory a new buffer needs (see `Fault`).
    pub fn memory_held(&self) -> bool {
        self.faults.memory_held()
    }
}

/// The text a panic carries (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic inside wgpu".into())
}
