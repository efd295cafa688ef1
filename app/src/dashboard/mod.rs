//! The desktop dashboard (egui/eframe): live loss curves, validation, learning rate and
//! throughput for one or more runs, a per-device panel (utilization over time, memory), and a
//! run panel with pause / resume / stop for runs this window launched.
//!
//! Data flows one way: training emits records on a bounded channel (or into a metrics log that
//! `--follow` reads), each frame folds what arrived into `RunData`, and the plots draw smoothed,
//! decimated copies. Nothing here blocks training, and nothing in core knows about egui.

mod app;
mod devices;
mod new_run;
mod plots;
mod run_panel;
pub mod runs;
mod screenshot;
pub mod series;
pub mod source;

#[cfg(test)]
mod first_run_tests;
#[cfg(test)]
#[path = "../../tests/support/http.rs"]
#[allow(dead_code)]
mod test_http;
#[cfg(test)]
#[path = "../../../testdata/mnist.rs"]
#[allow(dead_code)]
mod test_mnist;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use new_run::Launcher;
pub use source::{RunControl, Source};

/// Why no window can open here, if so (checked before any work starts).
pub fn no_display_reason() -> Option<String> {
    if cfg!(target_os = "linux")
        && std::env::var_os("DISPLAY").is_none()
        && std::env::var_os("WAYLAND_DISPLAY").is_none()
    {
        return Some("no display: neither DISPLAY nor WAYLAND_DISPLAY is set".into());
    }
    None
}

/// glow (OpenGL, works in software) unless a hardware GPU is there for wgpu;
/// `LOCKSTEP_RENDERER=glow|wgpu` decides instead.
fn renderer() -> eframe::Renderer {
    match std::env::var("LOCKSTEP_RENDERER").as_deref() {
        Ok("wgpu") => return eframe::Renderer::Wgpu,
        Ok("glow") => return eframe::Renderer::Glow,
        _ => {}
    }
    let hardware_gpu = lockstep_core::device::list_devices()
        .iter()
        .any(|d| d.location.starts_with("wgpu:") && !d.software);
    if hardware_gpu {
        eframe::Renderer::Wgpu
    } else {
        eframe::Renderer::Glow
    }
}

/// Opens the window on these sources and returns when it is closed (after the runs it started
/// have stopped and checkpointed). `launcher` lets the window start runs of its own.
pub fn show(
    sources: Vec<Source>,
    screenshot: Option<(f64, PathBuf)>,
    launcher: Option<Launcher>,
) -> anyhow::Result<()> {
    if let Some(reason) = no_display_reason() {
        anyhow::bail!(
            "cannot open the dashboard: {reason}; follow a run's metrics log from a machine with a display instead (`lockstep dashboard --follow FILE`)"
        );
    }
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_inner_size([1280.0, 820.0])
            .with_min_inner_size([640.0, 420.0])
            .with_title("Lockstep"),
        renderer: renderer(),
        ..Default::default()
    };
    let error: Arc<Mutex<Option<String>>> = Arc::default();
    let shot = screenshot.map(|(secs, path)| screenshot::Screenshot::after(Duration::from_secs_f64(secs), path));
    let dashboard = app::Dashboard::new(sources, shot, launcher, error.clone());
    eframe::run_native("Lockstep", options, Box::new(move |_cc| Ok(Box::new(dashboard))))
        .map_err(|e| anyhow::anyhow!("the dashboard window failed: {e}"))?;
    if let Some(e) = error.lock().unwrap_or_else(|p| p.into_inner()).take() {
        anyhow::bail!(e);
    }
    Ok(())
}

pub use lockstep_flags::dashboard::parse_screenshot;
