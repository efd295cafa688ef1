//! One opened adapter: the wgpu device and queue, what the adapter can do, and the errors wgpu
//! reports out of band (validation, out of memory, device lost), kept until the next call can
//! return them as errors naming the device instead of panicking.

use std::sync::{Arc, Mutex};

use lockstep_core::{Error, Result};

pub struct Gpu {
    pub location: String,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    /// The first error wgpu reported outside an error scope, or the reason the device was lost.
    failure: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    /// Opens `adapter` as `location`, asking for everything it offers that the backend uses.
    pub fn open(location: String, adapter: &wgpu::Adapter) -> Result<Gpu> {
        let info = adapter.get_info();
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        let features = adapter.features() & wanted;
        // The adapter's own limits, not WebGPU's defaults: those cap buffers at 256 MiB.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("lockstep"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| Error::Device {
            device: location.clone(),
            msg: format!("could not open {} ({:?}): {e}", info.name, info.backend),
        })?;
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
            on_lost
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(format!("the device was lost ({reason:?}): {msg}"));
        });
        Ok(Gpu {
            location,
            device,
            queue,
            info,
            limits,
            features,
            failure,
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
                "{msg} (on {}; results computed since may be wrong, restart the run)",
                self.info.name
            ))),
            None => Ok(()),
        }
    }

    /// Runs `f` inside an error scope and turns what it catches into an error naming the device.
    pub fn scoped<T>(&self, filter: wgpu::ErrorFilter, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        let scope = self.device.push_error_scope(filter);
        let value = f();
        match pollster::block_on(scope.pop()) {
            None => Ok(value),
            Some(e) => Err(self.error(format!("{what}: {e}"))),
        }
    }

    /// Waits for all submitted work.
    pub fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.error(format!("waiting for the GPU failed: {e}")))?;
        self.check()
    }
}
