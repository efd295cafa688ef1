//! Training with the dashboard: `lockstep train --dashboard` trains on a background thread
//! while the window shows it live, and the window's New run starts more runs the same way. A
//! Stop (or closing the window) stops a run after its current step; its checkpoint callback
//! saves first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use lockstep_core::train::ChannelListener;

use super::{Args, Hooks};
use crate::dashboard::{self, Launcher, RunControl, Source};

/// Records the window may fall behind by before step and device records are dropped.
const CHANNEL_CAPACITY: usize = 16_384;

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(reason) = dashboard::no_display_reason() {
        anyhow::bail!(
            "--dashboard: {reason}; drop --dashboard, or add --metrics-out FILE and watch the run with `lockstep dashboard --follow FILE` where there is a display"
        );
    }
    let screenshot = dashboard::parse_screenshot(&args.screenshot_after)?;
    let (source, training) = start(args);
    let stop = source.control.as_ref().map(|c| (c.stop.clone(), c.pause.clone()));
    let shown = dashboard::show(vec![source], screenshot, Some(launcher()));
    // However the window ended, the run stops after its current step (a data-parallel one at
    // its next logged step) and checkpoints.
    if let Some((stop, pause)) = stop {
        stop.store(true, Ordering::Relaxed);
        pause.store(false, Ordering::Relaxed);
    }
    let trained = training
        .join()
        .map_err(|_| anyhow::anyhow!("the training thread panicked"))?;
    shown.and(trained)
}

/// Starts `lockstep train` arguments (without the program name) from the window.
pub fn launcher() -> Launcher {
    Box::new(|argv: Vec<String>| {
        let args = Args::try_parse_from(std::iter::once("train".to_string()).chain(argv))
            .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim()))?;
        args.validate()?;
        let (mut source, thread) = start(args);
        if let Some(control) = &mut source.control {
            control.thread = Some(thread);
        }
        Ok(source)
    })
}

/// `mlp 17:48:03`: the model and the start time (UTC), so runs started one after another can be
/// told apart in a legend.
fn run_label(model: &str, at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
    format!("{model} {:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Starts the run on a background thread; the source feeds the window.
fn start(mut args: Args) -> (Source, JoinHandle<anyhow::Result<()>>) {
    if args.checkpoint_dir.is_none() {
        // A run stopped from the window keeps its weights.
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        args.checkpoint_dir = Some(format!("runs/{}-{secs}", args.model).into());
    }
    let (events, rx) = ChannelListener::new(CHANNEL_CAPACITY);
    let (stop, pause) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let single = args.devices.len() <= 1;
    let control = RunControl {
        stop: stop.clone(),
        pause: pause.clone(),
        pausable: single,
        finished: Arc::new(Mutex::new(None)),
        thread: None,
    };
    let finished = control.finished.clone();
    let hooks = Hooks {
        events: Some(events),
        // Stop reaches every replica of a data-parallel run (they agree on the step); pause
        // only a single device's.
        interrupted: (!single).then(|| stop.clone()),
        controls: single.then_some((stop, pause)),
    };
    let name = run_label(&args.model, SystemTime::now());
    let training = std::thread::spawn(move || {
        let result = super::train(args, hooks);
        *finished.lock().unwrap_or_else(|p| p.into_inner()) = Some(match &result {
            Ok(()) => "finished".to_string(),
            Err(e) => format!("failed: {e:#}"),
        });
        result
    });
    (Source::live(&name, rx, control), training)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, UNIX_EPOCH};

    #[test]
    fn runs_are_labelled_by_model_and_start_time() {
        let at = UNIX_EPOCH + Duration::from_secs(86_400 * 3 + 3600 * 17 + 60 * 48 + 3);
        assert_eq!(super::run_label("mlp", at), "mlp 17:48:03");
    }

    #[test]
    fn a_bad_flag_from_the_form_is_refused_before_anything_starts() {
        let err = match super::launcher()(vec!["--batch-size".into(), "zero".into()]) {
            Ok(_) => panic!("a bad batch size started a run"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("--batch-size"), "{err}");
    }

    #[test]
    fn a_run_that_fails_reports_why_in_the_window() {
        let dir = std::env::temp_dir().join(format!("lockstep-launch-{}", std::process::id()));
        let args = [
            "--data",
            "/nonexistent/mnist",
            "--checkpoint-dir",
            dir.to_str().unwrap(),
        ];
        let source = super::launcher()(args.iter().map(|s| s.to_string()).collect()).expect("starts");
        let control = source.control.as_ref().expect("a launched run has controls");
        let deadline = Instant::now() + Duration::from_secs(30);
        let outcome = loop {
            if let Some(o) = control.outcome() {
                break o;
            }
            assert!(Instant::now() < deadline, "the run never ended");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            outcome.starts_with("failed:") && outcome.contains("MNIST not found in /nonexistent/mnist"),
            "{outcome}"
        );
    }
}
