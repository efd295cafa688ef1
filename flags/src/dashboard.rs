//! `lockstep dashboard`'s flags: the runs to watch or compare.

use std::path::PathBuf;

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

impl Args {
    pub fn validate(&self) -> anyhow::Result<()> {
        parse_screenshot(&self.screenshot_after).map(drop)
    }
}

/// The two values of `--screenshot-after SECONDS PATH` (of `dashboard` and `train --dashboard`).
pub fn parse_screenshot(values: &[String]) -> anyhow::Result<Option<(f64, PathBuf)>> {
    match values {
        [] => Ok(None),
        [secs, path] => {
            let most = crate::bounds::MOST_SECONDS as f64;
            let secs: f64 = secs
                .parse()
                .ok()
                .filter(|s: &f64| (0.0..=most).contains(s))
                .ok_or_else(|| {
                    anyhow::anyhow!("--screenshot-after: `{secs}` is not a number of seconds from 0 to {most}")
                })?;
            Ok(Some((secs, PathBuf::from(path))))
        }
        _ => anyhow::bail!("--screenshot-after takes two values: SECONDS PATH"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn screenshot_flags_parse_or_say_what_is_wrong() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(super::parse_screenshot(&v(&[])).unwrap(), None);
        let (secs, path) = super::parse_screenshot(&v(&["2.5", "a.png"])).unwrap().unwrap();
        assert_eq!((secs, path.to_str().unwrap()), (2.5, "a.png"));
        let err = super::parse_screenshot(&v(&["soon", "a.png"])).unwrap_err();
        assert!(err.to_string().contains("`soon` is not a number"), "{err}");
        assert!(
            super::parse_screenshot(&v(&["1e300", "a.png"])).is_err(),
            "a deadline that overflows"
        );
    }
}
