//! The dashboard window for real, under Xvfb: `train --dashboard` and `dashboard --follow` save
//! screenshots through eframe that show the loss curve and the device panel with data; without
//! a display, `lockstep` says so in one line and shows the help.

mod support;

use std::path::Path;
use std::process::{Child, Command};

use support::{TempDir, assert_fails_with, assert_succeeds, full_mnist, lockstep, mnist_dir, real_mirror, run};

/// The colour of the first run's lines (`run_color(0)` in the dashboard).
const RUN_BLUE: [u8; 3] = [86, 156, 255];

/// An X display for the window: $DISPLAY, or a private Xvfb started here.
struct Display {
    name: String,
    xvfb: Option<Child>,
    /// Xvfb's stdout, kept open while it runs: were it closed, a later write by Xvfb would
    /// kill it with SIGPIPE and the window would find no X server.
    _xvfb_stdout: Option<std::io::BufReader<std::process::ChildStdout>>,
    /// Xvfb's own messages, shown when a window fails to connect.
    xvfb_log: Option<std::path::PathBuf>,
}

impl Display {
    /// What Xvfb said, for a failure message.
    fn log(&self) -> String {
        self.xvfb_log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        if let Some(x) = &mut self.xvfb {
            let _ = x.kill();
            let _ = x.wait();
        }
        if let Some(log) = &self.xvfb_log {
            let _ = std::fs::remove_file(log);
        }
    }
}

/// None (said loudly) when there is neither a display nor Xvfb; with `LOCKSTEP_EXPECT_XVFB=1`
/// (CI installs Xvfb) that is a failure.
fn display() -> Option<Display> {
    if let Some(name) = std::env::var("DISPLAY").ok().filter(|d| !d.is_empty()) {
        return Some(Display {
            name,
            xvfb: None,
            _xvfb_stdout: None,
            xvfb_log: None,
        });
    }
    // Xvfb picks a free display itself and writes its number to fd 1 (tests run in parallel).
    // -noreset: by default the server resets when its last client disconnects, and a window
    // connecting during that reset finds no server (the binary probes the display first).
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = std::env::temp_dir().join(format!("lockstep-xvfb-{}-{n}.log", std::process::id()));
    let stderr = std::fs::File::create(&log)
        .map(std::process::Stdio::from)
        .unwrap_or(std::process::Stdio::null());
    let started = Command::new("Xvfb")
        .args([
            "-displayfd",
            "1",
            "-screen",
            "0",
            "1280x860x24",
            "-nolisten",
            "tcp",
            "-noreset",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn();
    let mut xvfb = match started {
        Ok(child) => child,
        Err(e) => {
            assert!(
                std::env::var("LOCKSTEP_EXPECT_XVFB").as_deref() != Ok("1"),
                "LOCKSTEP_EXPECT_XVFB=1 but Xvfb does not start: {e}"
            );
            eprintln!("\n*** SKIPPED: no display and no Xvfb ({e}); install xvfb to run the dashboard tests ***\n");
            return None;
        }
    };
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(xvfb.stdout.take().expect("piped"));
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("Xvfb reports its display");
    let number: u32 = line.trim().parse().unwrap_or_else(|_| panic!("Xvfb reported `{line}`"));
    Some(Display {
        name: format!(":{number}"),
        xvfb: Some(xvfb),
        _xvfb_stdout: Some(stdout),
        xvfb_log: Some(log),
    })
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// Pixels of the run's colour in the rows `rows` (fractions of the height) of a screenshot.
fn run_pixels(png: &Path, rows: std::ops::Range<f64>) -> usize {
    let image = image::open(png).expect("the screenshot is a PNG").to_rgb8();
    let (w, h) = image.dimensions();
    assert!(w >= 600 && h >= 400, "a {w}x{h} screenshot");
    let (top, bottom) = ((rows.start * h as f64) as u32, (rows.end * h as f64) as u32);
    (top..bottom)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let p = image.get_pixel(x, y).0;
            p.iter().zip(RUN_BLUE).all(|(&a, b)| a.abs_diff(b) <= 12)
        })
        .count()
}

#[test]
fn train_dashboard_screenshot_shows_the_loss_curve_and_the_devices() {
    let Some(display) = display() else { return };
    let dir = TempDir::new("dashboard-train");
    let shot = dir.join("shot.png");
    let checkpoints = dir.join("ckpt");
    let data = mnist_dir();
    let out = run(lockstep(&[
        "train",
        "--dashboard",
        "--data",
        path_str(&data),
        "--hidden",
        "64",
        "--max-steps",
        "150",
        "--log-every",
        "5",
        "--no-val",
        "--headless",
        "--checkpoint-dir",
        path_str(&checkpoints),
        "--screenshot-after",
        "5",
        path_str(&shot),
    ])
    .env("DISPLAY", &display.name)
    .env("LOCKSTEP_RENDERER", "glow"));
    if !out.status.success() {
        eprintln!("Xvfb {} said:\n{}", display.name, display.log());
    }
    assert_succeeds(&out);
    // The loss plot (upper half) and the device panel's utilization sparkline (bottom) are drawn.
    let curve = run_pixels(&shot, 0.05..0.45);
    assert!(curve > 150, "only {curve} pixels of the loss curve");
    let devices = run_pixels(&shot, 0.8..1.0);
    eprintln!("run-coloured pixels: {curve} in the plots, {devices} in the device panel");
    assert!(devices > 80, "only {devices} pixels in the device panel");
    // However the window ended, the run kept its weights.
    assert!(
        checkpoints.join("last.safetensors").exists(),
        "no checkpoint in {checkpoints:?}"
    );
}

/// A short headless run's metrics log in `dir`.
fn metrics_log(dir: &TempDir, name: &str) -> std::path::PathBuf {
    let log = dir.join(name);
    let data = mnist_dir();
    let trained = run(&mut lockstep(&[
        "train",
        "--data",
        path_str(&data),
        "--hidden",
        "32",
        "--max-steps",
        "60",
        "--log-every",
        "2",
        "--no-val",
        "--headless",
        "--metrics-out",
        path_str(&log),
    ]));
    assert_succeeds(&trained);
    log
}

/// `lockstep dashboard <args> --screenshot-after SECS shot` with `renderer`; the shot's path.
fn dashboard_shot(display: &Display, dir: &TempDir, renderer: &str, args: &[&str]) -> std::path::PathBuf {
    let shot = dir.join(&format!("{renderer}.png"));
    let mut all = vec!["dashboard"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--screenshot-after", "3", path_str(&shot)]);
    let out = run(lockstep(&all)
        .env("DISPLAY", &display.name)
        .env("LOCKSTEP_RENDERER", renderer));
    assert_succeeds(&out);
    shot
}

#[test]
fn dashboard_follows_a_log_written_by_another_process() {
    let Some(display) = display() else { return };
    let dir = TempDir::new("dashboard-follow");
    let log = metrics_log(&dir, "metrics.jsonl");
    // A half-written last line, as a live run leaves it, is waited for, not an error.
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"t\":9.0,\"event\":\"step\",\"ep");
    std::fs::write(&log, text).unwrap();
    let shot = dashboard_shot(&display, &dir, "glow", &["--follow", path_str(&log)]);
    let curve = run_pixels(&shot, 0.05..0.45);
    assert!(curve > 100, "only {curve} pixels of the followed run's loss curve");
}

#[test]
fn the_wgpu_renderer_draws_the_same_dashboard() {
    let Some(display) = display() else { return };
    let devices = run(&mut lockstep(&["devices"]));
    if !String::from_utf8_lossy(&devices.stdout).contains("wgpu:0") {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_WGPU").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_WGPU=1 but there is no wgpu adapter for the renderer"
        );
        eprintln!("\n*** SKIPPED: no wgpu adapter for the wgpu renderer ***\n");
        return;
    }
    let dir = TempDir::new("dashboard-wgpu");
    let log = metrics_log(&dir, "run.jsonl");
    let shot = dashboard_shot(&display, &dir, "wgpu", &["--open", path_str(&log)]);
    let curve = run_pixels(&shot, 0.05..0.45);
    assert!(
        curve > 100,
        "only {curve} pixels of the loss curve with the wgpu renderer"
    );
}

#[test]
fn without_a_display_lockstep_shows_the_help_in_one_line() {
    let out = run(lockstep(&[]).env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY"));
    assert_succeeds(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no display"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
}

#[test]
fn train_dashboard_without_a_display_says_what_to_do() {
    let data = mnist_dir();
    let out = run(lockstep(&["train", "--dashboard", "--data", path_str(&data)])
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY"));
    assert_fails_with(&out, &["--dashboard", "no display", "--follow"]);
}

/// `xdotool args…`: whether it succeeded.
fn xdotool(display: &Display, args: &[&str]) -> bool {
    Command::new("xdotool")
        .args(args)
        .env("DISPLAY", &display.name)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The desktop app's first run, for real: `lockstep dashboard` on a machine whose data home is
/// empty opens on the New-run form with the download ticked and Start focused; Enter (pressed
/// through the X server, as a user's key) starts the run, which downloads MNIST from a loopback
/// mirror and trains; the window's own screenshot shows the loss curve.
#[test]
fn the_first_start_in_the_window_downloads_mnist_and_trains() {
    let Some(display) = display() else { return };
    // The download must pass the published checksums: the committed subset would not.
    let Some(_) = full_mnist("the window's first-run download") else {
        return;
    };
    if !xdotool(&display, &["version"]) {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_XVFB").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_XVFB=1 but xdotool is missing (apt install xdotool)"
        );
        eprintln!("\n*** SKIPPED: no xdotool to press keys in the window (apt install xdotool) ***\n");
        return;
    }
    let home = TempDir::new("dashboard-first-run");
    let mirror = real_mirror();
    let shot = home.join("first-run.png");
    let window = lockstep(&["dashboard", "--screenshot-after", "20", path_str(&shot)])
        .env("DISPLAY", &display.name)
        .env("LOCKSTEP_RENDERER", "glow")
        .env("LOCKSTEP_DATA", home.path())
        .env("LOCKSTEP_DOWNLOAD_URL", mirror.url("mnist/"))
        .current_dir(home.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the window starts");
    // Once the window is there, give it the keyboard (no window manager does) and press Enter.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !xdotool(&display, &["search", "--name", "^Lockstep$"]) {
        assert!(std::time::Instant::now() < deadline, "no Lockstep window appeared");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(xdotool(
        &display,
        &[
            "search",
            "--name",
            "^Lockstep$",
            "windowfocus",
            "--sync",
            "key",
            "Return"
        ]
    ));
    let out = window.wait_with_output().expect("the window ends");
    if !out.status.success() {
        eprintln!("Xvfb {} said:\n{}", display.name, display.log());
    }
    assert_succeeds(&out);
    for name in support::ALL {
        assert!(
            home.join("mnist").join(format!("{name}.gz")).is_file(),
            "{name} was not downloaded:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let curve = run_pixels(&shot, 0.05..0.45);
    assert!(curve > 150, "only {curve} pixels of the loss curve");
    // Kept for a look, beside the form tests' pictures.
    let keep = std::env::temp_dir().join("lockstep-window");
    if std::fs::create_dir_all(&keep).is_ok() {
        let _ = std::fs::copy(&shot, keep.join("first-run-xvfb.png"));
    }
}
