//! The `lockstep` command line: every subcommand's flags, `train --config FILE`, the launchers'
//! variables, and the bounds every value must keep. Parsed and checked here, before anything
//! starts: no device is opened, no thread started, no file written. The program (`app/`) runs
//! what this crate accepts; the fuzz target `command_line` (fuzz/) feeds it hostile argument
//! lists and config files, in-process.

// The flags' doc comments are their --help text, written for a terminal (`runs/<model>-<time>/`).
#![allow(rustdoc::invalid_html_tags)]

pub mod bench;
pub mod bounds;
pub mod check;
pub mod config_file;
pub mod dashboard;
pub mod devices;
pub mod launch;
pub mod sample;
pub mod schedule;
pub mod train;
pub mod world;

use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "lockstep",
    version,
    about = "Lockstep: parallel deep-learning training on any device"
)]
pub struct Cli {
    /// Without a subcommand, `lockstep` opens the dashboard.
    #[command(subcommand)]
    pub command: Option<Command>,
}

// Parsed once per process: the size of the `train` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List the devices this build can use.
    Devices(devices::Args),
    /// Run the backend conformance suite on a device and print a report.
    Check(check::Args),
    /// Train a built-in model: on MNIST by default, CIFAR, a folder of images, or text.
    Train(train::Args),
    /// Start the processes of a data-parallel job on this machine (torchrun's variables; CPU and
    /// wgpu devices through mpirun) and stop them all when one fails.
    Launch(launch::Args),
    /// Generate text from a language model's checkpoint (lockstep train --model gpt-tiny …).
    Sample(sample::Args),
    /// Measure GEMM and MLP training throughput, optionally beside a peer framework.
    Bench(bench::Args),
    /// Simulate a pipeline schedule without devices: timeline, bubble, activations held.
    Schedule(schedule::Args),
    /// Open the dashboard on runs started elsewhere (--follow a metrics log, --open finished ones).
    Dashboard(dashboard::Args),
}

/// What a command line asks for.
// Made once per process, like `Command`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Invocation {
    /// Run this.
    Run(Cli),
    /// `train --print-config`: print this TOML and stop.
    PrintConfig(String),
}

/// `argv` (the program's name first) parsed, with `train --config FILE` read through
/// `read_config` (`config_file::read` on a real run), and checked against every bound. Errors
/// from clap itself (a usage error, or `--help` and `--version`, which clap reports as errors to
/// print) stay `clap::Error`s inside the `anyhow::Error`: `clap::Error::exit` prints them as
/// clap would.
pub fn parse(argv: Vec<OsString>, read_config: config_file::Reader) -> anyhow::Result<Invocation> {
    let command = Cli::command();
    let argv = config_file::expand(&command, "train", argv, read_config)?;
    let matches = command.clone().try_get_matches_from(argv)?;
    if let Some(("train", train)) = matches.subcommand()
        && config_file::wants_print(train)
        && let Some(train_command) = command.find_subcommand("train")
    {
        return Ok(Invocation::PrintConfig(config_file::print(train_command, train)));
    }
    let cli = Cli::from_arg_matches(&matches)?;
    if let Some(command) = &cli.command {
        validate(command)?;
    }
    Ok(Invocation::Run(cli))
}

/// The checks a subcommand's flags must pass before it starts: each refusal one line that names
/// the flag and what it accepts.
pub fn validate(command: &Command) -> anyhow::Result<()> {
    match command {
        Command::Train(args) => args.validate(),
        Command::Launch(args) => args.validate(),
        Command::Sample(args) => args.validate(),
        Command::Bench(args) => args.validate(),
        Command::Schedule(args) => args.validate(),
        Command::Dashboard(args) => args.validate(),
        Command::Devices(_) | Command::Check(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
