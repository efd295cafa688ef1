//! `lockstep`: the command line. Each subcommand lives in its own module under `cli/`; adding one
//! means one variant below, one arm in `run`, and one file.

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

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Lockstep: parallel deep-learning training on any device"
)]
struct Cli {
    /// Without a subcommand, `lockstep` opens the dashboard.
    #[command(subcommand)]
    command: Option<Command>,
}

// Parsed once per process: the size of the `train` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// List the devices this build can use.
    Devices(cli::devices::Args),
    /// Run the backend conformance suite on a device and print a report.
    Check(cli::check::Args),
    /// Train a built-in model: on MNIST by default, CIFAR, a folder of images, or text.
    Train(cli::train::Args),
    /// Start the processes of a data-parallel job on this machine (torchrun's variables; CPU and
    /// wgpu devices through mpirun) and stop them all when one fails.
    Launch(cli::launch::Args),
    /// Generate text from a language model's checkpoint (lockstep train --model gpt-tiny …).
    Sample(cli::sample::Args),
    /// Measure GEMM and MLP training throughput, optionally beside a peer framework.
    Bench(cli::bench::Args),
    /// Simulate a pipeline schedule without devices: timeline, bubble, activations held.
    Schedule(cli::schedule::Args),
    /// Open the dashboard on runs started elsewhere (--follow a metrics log, --open finished ones).
    Dashboard(cli::dashboard::Args),
}

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

/// The command line with `train --config FILE` read in; None when it was only to print the
/// configuration (`train --print-config`, done here: it needs clap's view of every flag).
fn parse_command_line() -> anyhow::Result<Option<Cli>> {
    let command = Cli::command();
    let argv = cli::config_file::expand(&command, "train", std::env::args_os().collect())?;
    let matches = command.clone().get_matches_from(argv);
    if let Some(("train", train)) = matches.subcommand()
        && cli::config_file::wants_print(train)
        && let Some(train_command) = command.find_subcommand("train")
    {
        print!("{}", cli::config_file::print(train_command, train));
        return Ok(None);
    }
    Ok(Some(Cli::from_arg_matches(&matches)?))
}

fn main() -> ExitCode {
    // Before any thread starts: it may set an environment variable.
    lockstep_wgpu::quiet_display_probe_without_session();
    lockstep_wgpu::register();
    lockstep_cuda::register();
    let cli = match parse_command_line() {
        Ok(Some(cli)) => cli,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln_whole!("error: {e:#}");
            return ExitCode::FAILURE;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bench_arguments_parse() {
        let cli = Cli::try_parse_from([
            "lockstep",
            "bench",
            "gemm",
            "--threads",
            "4",
            "--peer",
            "pytorch",
            "--json",
            "out.json",
        ]);
        assert!(cli.is_ok());
        assert!(Cli::try_parse_from(["lockstep", "bench", "--threads", "0"]).is_err());
        assert!(Cli::try_parse_from(["lockstep", "bench", "conv"]).is_err());
        assert!(Cli::try_parse_from(["lockstep", "devices"]).is_ok());
    }

    #[test]
    fn launch_takes_the_command_after_the_double_dash() {
        let cli = Cli::try_parse_from([
            "lockstep",
            "launch",
            "--nproc-per-node",
            "2",
            "--",
            "train",
            "--lr",
            "0.1",
        ]);
        match cli.map(|c| c.command) {
            Ok(Some(Command::Launch(args))) => assert_eq!(args.command, ["train", "--lr", "0.1"]),
            _ => panic!("`lockstep launch … -- train …` did not parse as a launch"),
        }
    }
}
