//! `lockstep dashboard`: the window on runs started elsewhere: `--follow` a metrics log as it
//! grows (another process, another machine's log mounted or copied), `--open` finished runs
//! to compare.

use std::path::PathBuf;

use crate::dashboard::{self, Source, runs};

#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// A metrics log (`lockstep train --metrics-out FILE`) to watch as it grows; repeatable.
    #[arg(long, value_name = "FILE")]
    pub follow: Vec<PathBuf>,
    /// Finished runs to compare: a metrics log, or a directory of them (one per run, or run
    /// directories holding one each); repeatable.
    #[arg(long, value_name = "PATH")]
    pub open: Vec<PathBuf>,
    /// Save a PNG of the window after SECONDS, then close it.
    #[arg(long, num_args = 2, value_names = ["SECONDS", "PATH"])]
    pub screenshot_after: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let screenshot = dashboard::parse_screenshot(&args.screenshot_after)?;
    let mut sources: Vec<Source> = args
        .follow
        .iter()
        .map(|p| Source::follow(runs::Follower::new(p)))
        .collect();
    for path in &args.open {
        for log in runs::find_logs(path)? {
            let run = runs::RunData::load(&log)?;
            for w in &run.warnings {
                eprintln_whole!("warning: {}: {w}", log.display());
            }
            sources.push(Source::finished(run));
        }
    }
    dashboard::show(sources, screenshot, Some(super::train::launcher()))
}
