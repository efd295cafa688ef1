//! The `command_line` target's harness: `lockstep` argument lists, `train --config` files and
//! launcher variables built from the fuzzer's bytes — the program's real flags (read from its
//! clap definition, so a new flag is fuzzed the day it is added) with hostile values, mixed with
//! garbage — parsed and checked in-process by `lockstep_flags::parse`, as `main` does before
//! anything starts, and the variables read by `WorldEnv::from_vars`. It asserts nothing about
//! what is accepted: only that parsing returns (no panic, abort, hang or allocation past the
//! bound).
//!
//! Its own file, not part of fuzz/src/lib.rs: core's tests include lib.rs, and this harness
//! needs the flags crate (flags/tests/fuzz_regressions.rs includes it instead).

use std::ffi::OsString;
use std::path::Path;

use clap::CommandFactory;
use lockstep_flags::Cli;
use lockstep_flags::world::WorldEnv;

/// Values that have broken number parsers and the arithmetic behind them: the ends of each
/// integer type and one past, floats that overflow a `Duration`, NaN, empty text, lists.
const HOSTILE: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "100000",
    "1000000000",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-1e308",
    "1e-320",
    "NaN",
    "inf",
    "-inf",
    "0.5",
    "",
    "1,1000000000",
    "0,0",
    "cpu:0,cpu:0",
    "cpu:0,cpu:1",
    "last",
    "gpt2",
    "resnet18",
    "text",
    "0-5@cpu:0,6-11@cpu:1",
    "encoder=cpu:0..3,decoder=cpu:4..7",
    "2(x18446744073709551615),1",
];

/// The variables a launcher sets (torchrun, Open MPI, Hydra, Slurm) and the rendezvous' own.
const VARIABLES: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCKSTEP_RDZV_TOKEN",
    "LOCKSTEP_RDZV_TIMEOUT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
];

/// The fuzzer's bytes, read front to back.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    /// Up to 255 bytes (the length is the first), as text.
    fn text(&mut self) -> String {
        let len = usize::from(self.byte().unwrap_or(0)).min(self.0.len());
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8_lossy(text).into_owned()
    }

    /// A hostile value, or text.
    fn value(&mut self) -> String {
        let pick = usize::from(self.byte().unwrap_or(0));
        match HOSTILE.get(pick) {
            Some(value) => value.to_string(),
            None => self.text(),
        }
    }

    fn pick<'t, T>(&mut self, from: &'t [T]) -> Option<&'t T> {
        let i = usize::from(self.byte()?);
        from.get(i % from.len().max(1))
    }
}

pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let cli = Cli::command();
    let subcommands: Vec<&clap::Command> = cli.get_subcommands().collect();
    let Some(sub) = input.pick(&subcommands) else { return };
    let flags: Vec<&clap::Arg> = sub.get_arguments().filter(|a| a.get_long().is_some()).collect();
    let mut argv: Vec<OsString> = vec!["lockstep".into(), sub.get_name().into()];
    let (mut config, mut variables) = (String::new(), Vec::new());
    while let Some(op) = input.byte() {
        match op % 8 {
            // Mostly real flags, each with a value where it takes one.
            0..=3 => {
                let Some(flag) = input.pick(&flags) else { continue };
                argv.push(format!("--{}", flag.get_long().unwrap_or_default()).into());
                if flag.get_action().takes_values() {
                    argv.push(input.value().into());
                }
            }
            4 => argv.push(input.text().into()),
            // A config file's line for a real flag (a TOML value or not), or garbage.
            5 => {
                let Some(flag) = input.pick(&flags) else { continue };
                let key = flag.get_long().unwrap_or_default().replace('-', "_");
                config.push_str(&format!("{key} = {}\n", input.value()));
            }
            6 => config.push_str(&input.text()),
            _ => {
                if let Some(name) = input.pick(VARIABLES) {
                    variables.push((*name, input.value()));
                }
            }
        }
    }
    if !config.is_empty() {
        argv.splice(2..2, ["--config".into(), "fuzzed.toml".into()]);
    }
    let read = |_: &Path| anyhow::Ok(config.clone());
    let _ = lockstep_flags::parse(argv, &read);
    let _ = WorldEnv::from_vars(|name| variables.iter().rev().find(|(n, _)| *n == name).map(|(_, v)| v.clone()));
}

/// What one step of `run` reads, for writing seeds and regressions by name.
pub enum Part<'a> {
    /// A real flag, with its value where it takes one.
    Flag(&'a str, Option<&'a str>),
    /// An argument as it is.
    Raw(&'a str),
    /// A config-file line for a real flag.
    ConfigLine(&'a str, &'a str),
    /// A launcher variable.
    Variable(&'a str, &'a str),
}

/// The input that makes `run` build `lockstep <subcommand>` from `parts`; None where a name is
/// not the program's (or text is over 255 bytes).
pub fn encode(subcommand: &str, parts: &[Part]) -> Option<Vec<u8>> {
    let cli = Cli::command();
    let subcommands: Vec<&clap::Command> = cli.get_subcommands().collect();
    let sub_index = subcommands.iter().position(|s| s.get_name() == subcommand)?;
    let sub = subcommands[sub_index];
    let flags: Vec<&clap::Arg> = sub.get_arguments().filter(|a| a.get_long().is_some()).collect();
    let flag_index = |name: &str| flags.iter().position(|f| f.get_long() == Some(name));
    let text = |out: &mut Vec<u8>, text: &str| -> Option<()> {
        out.push(u8::try_from(text.len()).ok()?);
        out.extend_from_slice(text.as_bytes());
        Some(())
    };
    let value = |out: &mut Vec<u8>, v: &str| -> Option<()> {
        match HOSTILE.iter().position(|h| *h == v) {
            Some(i) => out.push(u8::try_from(i).ok()?),
            None => {
                out.push(u8::MAX);
                text(out, v)?;
            }
        }
        Some(())
    };
    let mut out = vec![u8::try_from(sub_index).ok()?];
    for part in parts {
        match part {
            Part::Flag(name, v) => {
                out.extend([0, u8::try_from(flag_index(name)?).ok()?]);
                if let Some(v) = v {
                    value(&mut out, v)?;
                }
            }
            Part::Raw(arg) => {
                out.push(4);
                text(&mut out, arg)?;
            }
            Part::ConfigLine(name, v) => {
                out.extend([5, u8::try_from(flag_index(name)?).ok()?]);
                value(&mut out, v)?;
            }
            Part::Variable(name, v) => {
                out.extend([7, u8::try_from(VARIABLES.iter().position(|n| n == name)?).ok()?]);
                value(&mut out, v)?;
            }
        }
    }
    Some(out)
}
