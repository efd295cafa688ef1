//! `lockstep dashboard`: the window on runs started elsewhere: `--follow` a metrics log as it
//! grows (another process, another machine's log mounted or copied), `--open` finished runs
//! to compare.

use crate::dashboard::{self, Source, runs};
pub use lockstep_flags::dashboard::Args;

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
