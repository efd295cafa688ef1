//! The desktop app's first run, driven as a user drives it: egui_kittest finds the widgets by
//! their accessible labels and clicks them, frame by frame, in the real window code (rendered
//! with wgpu for the pictures). With an empty data home the New-run form says MNIST is not there
//! and ticks the download; Start downloads it from a loopback mirror and trains, and the plots
//! fill. With the download unticked the run fails: one short red line, no empty plots.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};

use super::app::Dashboard;
use super::new_run::{Launcher, NewRun};
use super::test_http::{Reply, Server};
use super::test_mnist::{MNIST_FILES, full_mnist};

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("lockstep-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The window with no run (so it opens on the form), its form's data directory in the empty
/// `home`, and runs started with `extra` flags after the form's (the mirror, a scratch
/// checkpoint directory).
fn window(home: &Path, extra: Vec<String>) -> Harness<'static, Dashboard> {
    let start = crate::cli::train::launcher();
    let launcher: Launcher = Box::new(move |mut args: Vec<String>| {
        args.extend(extra.iter().cloned());
        start(args)
    });
    let mut dashboard = Dashboard::new(Vec::new(), None, Some(launcher), Arc::default());
    dashboard.new_run = NewRun::with_data_dir(home.join("mnist").display().to_string());
    dashboard.new_run.open();
    Harness::builder()
        .with_size([1280.0, 820.0])
        .wgpu()
        .build_ui_state(|ui, d: &mut Dashboard| d.show(ui), dashboard)
}

fn click(h: &mut Harness<'static, Dashboard>, label: &str) {
    h.get_by_label(label).click();
    h.run_steps(2);
}

/// Types `text` into the field labelled `label`.
fn type_into(h: &mut Harness<'static, Dashboard>, label: &str, text: &str) {
    h.get_by_label(label).click();
    h.run_steps(1);
    h.get_by_label(label).type_text(text);
    h.run_steps(2);
}

/// Frames until the first run ends; its outcome.
fn until_the_run_ends(h: &mut Harness<'static, Dashboard>) -> String {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        h.step();
        let outcome = h.state().sources.first().and_then(|s| s.control.as_ref()?.outcome());
        if let Some(outcome) = outcome {
            // The records sent before the end are folded in over the next frames.
            h.run_steps(5);
            return outcome;
        }
        assert!(Instant::now() < deadline, "the run did not end in 300 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn checkbox_ticked(h: &Harness<'static, Dashboard>, label: &str) -> bool {
    let node = h.get_by_label(label);
    node.accesskit_node().toggled() == Some(egui::accesskit::Toggled::True)
}

/// Renders the window to `name`.png in the temporary directory's `lockstep-window`, kept for
/// a look (docs/ has copies); None (said loudly) without a wgpu adapter, a failure under
/// LOCKSTEP_EXPECT_WGPU=1.
fn picture(h: &mut Harness<'static, Dashboard>, name: &str) -> Option<image::RgbaImage> {
    match h.render() {
        Ok(image) => {
            let dir = std::env::temp_dir().join("lockstep-window");
            std::fs::create_dir_all(&dir).expect("a directory for the pictures");
            let path = dir.join(format!("{name}.png"));
            image.save(&path).expect("the picture saves");
            eprintln!("the window: {}", path.display());
            Some(image)
        }
        Err(e) => {
            assert!(
                std::env::var("LOCKSTEP_EXPECT_WGPU").as_deref() != Ok("1"),
                "LOCKSTEP_EXPECT_WGPU=1 but the window cannot be rendered: {e}"
            );
            eprintln!("\n*** SKIPPED the picture: no wgpu adapter to render the window ({e}) ***\n");
            None
        }
    }
}

/// Pixels of the first run's colour (`run_color(0)`) in the plots' part of the window (right of
/// the run panel) and rows `rows` (fractions of the height).
fn run_pixels(image: &image::RgbaImage, rows: std::ops::Range<f64>) -> usize {
    let [r, g, b, _] = super::plots::run_color(0).to_array();
    let (w, h) = (image.width() as f64, image.height() as f64);
    image
        .enumerate_pixels()
        .filter(|(x, y, _)| *x as f64 > 0.3 * w && (rows.start * h..rows.end * h).contains(&(*y as f64)))
        .filter(|(_, _, p)| p.0[0].abs_diff(r) <= 12 && p.0[1].abs_diff(g) <= 12 && p.0[2].abs_diff(b) <= 12)
        .count()
}

#[test]
fn the_first_start_downloads_mnist_and_trains() {
    // The download must pass the published checksums: the committed subset would not.
    let Some(mnist) = full_mnist("the window's first-run download") else {
        return;
    };
    let routes: HashMap<String, Reply> = MNIST_FILES
        .iter()
        .map(|n| {
            let bytes = std::fs::read(mnist.join(format!("{n}.gz"))).expect("an MNIST file");
            (format!("/mnist/{n}.gz"), Reply::ok(bytes))
        })
        .collect();
    let mirror = Server::start(routes);
    let home = Scratch::new("first-run-window");
    let extra = vec![
        "--download-url".into(),
        mirror.url("mnist/"),
        "--checkpoint-dir".into(),
        home.0.join("ckpt").display().to_string(),
        "--hidden".into(),
        "64".into(),
        "--log-every".into(),
        "2".into(),
    ];
    let mut h = window(&home.0, extra);
    // The window opens on the form, which says the data is missing and offers the download,
    // ticked.
    h.get_by_label("MNIST is not there yet");
    assert!(checkbox_ticked(&h, "download it there (about 11 MB)"));
    type_into(&mut h, "max steps", "40");
    picture(&mut h, "first-run-form");
    click(&mut h, "Start");
    let outcome = until_the_run_ends(&mut h);
    assert_eq!(outcome, "finished");
    for n in MNIST_FILES {
        assert!(
            home.0.join("mnist").join(format!("{n}.gz")).is_file(),
            "{n} was not downloaded"
        );
    }
    let run = &h.state().sources[0].run;
    assert_eq!(run.step, 40);
    let (_, accuracy) = run.test.expect("the run tested");
    assert!(accuracy > 0.8, "test accuracy {accuracy} after 40 steps");
    if let Some(image) = picture(&mut h, "first-run-trained") {
        let curve = run_pixels(&image, 0.05..0.45);
        assert!(curve > 150, "only {curve} pixels of the loss curve");
    }
}

#[test]
fn a_failed_first_run_shows_one_short_line_and_no_empty_plots() {
    let home = Scratch::new("failed-run-window");
    let extra = vec!["--checkpoint-dir".into(), home.0.join("ckpt").display().to_string()];
    let mut h = window(&home.0, extra);
    // Unticked: the run may not fetch, so it fails on the missing files.
    click(&mut h, "download it there (about 11 MB)");
    assert!(!checkbox_ticked(&h, "download it there (about 11 MB)"));
    click(&mut h, "Start");
    let outcome = until_the_run_ends(&mut h);
    assert!(outcome.starts_with("failed: MNIST not found in"), "{outcome}");
    // The window: the short line (in the run panel and in place of the plots), no plots.
    let short = format!("failed: MNIST not found in {}", home.0.join("mnist").display());
    assert!(
        h.query_all_by_label_contains(&short).count() >= 2,
        "the short line is missing"
    );
    assert!(h.query_by_label("Training loss").is_none(), "empty plots are drawn");
    h.get_by_label_contains("the whole message is under “details”");
    if let Some(image) = picture(&mut h, "first-run-failed") {
        assert_eq!(run_pixels(&image, 0.05..0.8), 0, "a run line is drawn");
    }
}
