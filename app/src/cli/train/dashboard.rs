//! `lockstep train --dashboard`: the run trains on a background thread while the window shows
//! it live; the window's Stop (or closing it) stops the run after its current step, and the
//! run's checkpoint callback saves first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use lockstep_core::train::ChannelListener;

use super::{Args, Hooks};
use crate::dashboard::{self, RunControl, Source};

/// Records the window may fall behind by before step and device records are dropped.
const CHANNEL_CAPACITY: usize = 16_384;

pub fn run(mut args: Args) -> anyhow::Result<()> {
    if let Some(reason) = dashboard::no_display_reason() {
        anyhow::bail!(
            "--dashboard: {reason}; drop --dashboard, or add --metrics-out FILE and watch the run with `lockstep dashboard --follow FILE` where there is a display"
        );
    }
    let screenshot = dashboard::parse_screenshot(&args.screenshot_after)?;
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
        finished: Arc::new(Mutex::new(None)),
    };
    let finished = control.finished.clone();
    let hooks = Hooks {
        events: Some(events),
        controls: single.then(|| (stop.clone(), pause.clone())),
    };
    let name = format!("{} (this run)", args.model);
    let training = std::thread::spawn(move || {
        let result = super::train(args, hooks);
        *finished.lock().unwrap_or_else(|p| p.into_inner()) = Some(match &result {
            Ok(()) => "finished".to_string(),
            Err(e) => format!("failed: {e:#}"),
        });
        result
    });
    let shown = dashboard::show(vec![Source::live(&name, rx, control)], screenshot);
    // However the window ended, the run stops after its current step (and checkpoints).
    stop.store(true, Ordering::Relaxed);
    pause.store(false, Ordering::Relaxed);
    if !single {
        eprintln!("the window closed; a data-parallel run goes on until it ends (Ctrl-C aborts it)");
    }
    let trained = training
        .join()
        .map_err(|_| anyhow::anyhow!("the training thread panicked"))?;
    shown.and(trained)
}
