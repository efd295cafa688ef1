//! `lockstep`: the command line. Its flags live in `lockstep_flags` (flags/), parsed and checked
//! before anything starts; each subcommand runs in its own module under `cli/`.

// The flags' doc comments are their --help text, written for a terminal (`runs/<model>-<time>/`).
#![allow(rustdoc::invalid_html_tags)]

/// `eprintln!` in one write: the ranks of a job share one terminal, and `eprintln!` writes each
/// piece of its format separately, so two ranks' lines would interleave mid-word.
macro_rules! eprintln_whole {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($arg)*));
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

mod cli;
mod dashboard;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::CommandFactory;
use lockstep_flags::{Cli, Command, Invocation};

fn run(cli: Cli) -> anyhow::Result<()> {
    let Some(command) = cli.command else {
        // No subcommand: the dashboard where there is a display, else the help.
        if let Some(reason) = dashboard::no_display_reason() {
            eprintln!("{reason}, so no dashboard; the command line:");
            Cli::command().print_help()?;
            return Ok(());
        }
        return cli::dashboard::run(Default::default());
    };
    match command {
        Command::Devices(args) => cli::devices::run(args),
        Command::Bench(args) => cli::bench::run(args),
        Command::Sample(args) => cli::sample::run(args),
        Command::Train(args) => cli::train::run(args),
        Command::Launch(args) => cli::launch::run(args),
        Command::Check(args) => cli::check::run(args),
        Command::Schedule(args) => cli::schedule::run(args),
        Command::Dashboard(args) => cli::dashboard::run(args),
    }
}

fn main() -> ExitCode {
    // Before any thread starts: it may set an environment variable.
    lockstep_wgpu::quiet_display_probe_without_session();
    lockstep_wgpu::register();
    lockstep_cuda::register();
    let cli = match lockstep_flags::parse(std::env::args_os().collect(), &lockstep_flags::config_file::read) {
        Ok(Invocation::Run(cli)) => cli,
        Ok(Invocation::PrintConfig(toml)) => {
            print!("{toml}");
            return ExitCode::SUCCESS;
        }
        Err(e) => match e.downcast::<clap::Error>() {
            // Usage errors, --help and --version, printed as clap prints them.
            Ok(usage) => usage.exit(),
            Err(e) => {
                eprintln_whole!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        },
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` joins the context chain into one line: "what we did: why it failed".
            eprintln_whole!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
