//! A run's flags as a TOML file, Lightning CLI's `--config` and `--print_config`:
//! `lockstep train --config run.toml` reads every key as the flag of that name (the command line
//! overrides it), and `--print-config` prints the flags a run would use, as such a file.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, bail};
use clap::{Arg, ArgAction, ArgMatches, Command};

/// The flags that configure the file itself, or say what the command does instead of training
/// (--estimate-memory): never keys in it, so a saved config never turns a run into an estimate.
const OWN_FLAGS: [&str; 3] = ["config", "print_config", "estimate_memory"];

/// How a config file's text is read: `read` on a real run, the fuzzer's bytes under fuzzing.
pub type Reader<'a> = &'a dyn Fn(&Path) -> anyhow::Result<String>;

/// The largest config file read: a run's flags take a few KiB; a path to a device or a huge file
/// is refused instead of read into memory.
pub const MAX_BYTES: u64 = 1 << 20;

/// The text of the config file at `path`, refused past `MAX_BYTES`.
pub fn read(path: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path).with_context(|| format!("cannot read the config file {shown}"))?;
    let mut bytes = Vec::new();
    // One byte more than the bound tells a file at the bound from a longer one.
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read the config file {shown}"))?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_BYTES,
        "the config file {shown} is over {} KiB; a run's flags take a few lines (`lockstep train --print-config` writes one)",
        MAX_BYTES >> 10
    );
    String::from_utf8(bytes).with_context(|| format!("the config file {shown} is not UTF-8 text"))
}

/// `argv` with the keys of `--config FILE` (read by `read_config`) inserted as flags right after
/// `subcommand`, except those the command line gives itself: it wins. Unchanged without
/// `--config`.
pub fn expand(
    command: &Command,
    subcommand: &str,
    argv: Vec<OsString>,
    read_config: Reader,
) -> anyhow::Result<Vec<OsString>> {
    if argv.get(1).and_then(|a| a.to_str()) != Some(subcommand) {
        return Ok(argv);
    }
    let Some(path) = config_path(&argv[2..])? else {
        return Ok(argv);
    };
    let sub = command
        .find_subcommand(subcommand)
        .with_context(|| format!("no `{subcommand}` command"))?;
    let given = given_flags(&argv[2..]);
    let flags = flags_from_file(sub, Path::new(&path), &given, read_config)?;
    let mut out = argv[..2].to_vec();
    out.extend(flags);
    out.extend_from_slice(&argv[2..]);
    Ok(out)
}

/// The long flags named on the command line (`--lr 0.1` and `--lr=0.1` both give `lr`).
fn given_flags(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|a| a.to_string_lossy())
        .take_while(|a| a != "--")
        .filter_map(|a| {
            a.strip_prefix("--")
                .map(|f| f.split('=').next().unwrap_or(f).to_string())
        })
        .collect()
}

/// The value of `--config FILE` or `--config=FILE` among `args`.
fn config_path(args: &[OsString]) -> anyhow::Result<Option<OsString>> {
    let mut found = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        if text == "--" {
            break;
        }
        let value = if text == "--config" {
            Some(
                args.next()
                    .cloned()
                    .context("--config needs a file: --config run.toml")?,
            )
        } else {
            text.strip_prefix("--config=").map(OsString::from)
        };
        if let Some(value) = value {
            if found.is_some() {
                bail!("--config is given twice; merge the files into one");
            }
            found = Some(value);
        }
    }
    Ok(found)
}

/// The flags a config file stands for, each key checked against `command`'s flags; keys whose
/// flag is among `given` are left to the command line.
fn flags_from_file(
    command: &Command,
    path: &Path,
    given: &[String],
    read_config: Reader,
) -> anyhow::Result<Vec<OsString>> {
    let shown = path.display().to_string();
    let text = read_config(path)?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("{shown} is not valid TOML (keys are flag names: batch_size = 64)"))?;
    let mut flags = Vec::new();
    for (key, value) in &table {
        let flag = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()) && !OWN_FLAGS.contains(&a.get_id().as_str()))
            .with_context(|| {
                format!(
                    "{shown}: `{key}` is not a flag of `lockstep {}` (`lockstep {} --print-config` lists them all)",
                    command.get_name(),
                    command.get_name()
                )
            })?;
        let values = scalars(value).with_context(|| format!("{shown}: `{key}`"))?;
        if given.contains(&flag) {
            continue;
        }
        push_flag(&mut flags, arg, &flag, values).with_context(|| format!("{shown}: `{key}`"))?;
    }
    Ok(flags)
}

/// A TOML value as the command-line strings it stands for (an array: one per element).
fn scalars(value: &toml::Value) -> anyhow::Result<Vec<String>> {
    Ok(match value {
        toml::Value::String(s) => vec![s.clone()],
        toml::Value::Integer(i) => vec![i.to_string()],
        toml::Value::Float(f) => vec![f.to_string()],
        toml::Value::Boolean(b) => vec![b.to_string()],
        toml::Value::Array(items) => {
            let mut all = Vec::new();
            for item in items {
                match item {
                    toml::Value::Array(_) | toml::Value::Table(_) => bail!("arrays hold plain values"),
                    _ => all.extend(scalars(item)?),
                }
            }
            all
        }
        other => bail!("a {} cannot be a flag's value", other.type_str()),
    })
}

fn push_flag(flags: &mut Vec<OsString>, arg: &Arg, flag: &str, values: Vec<String>) -> anyhow::Result<()> {
    let long = OsString::from(format!("--{flag}"));
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        match values.as_slice() {
            [v] if v == "true" => flags.push(long),
            [v] if v == "false" => {}
            _ => bail!("a switch takes true or false"),
        }
        return Ok(());
    }
    if values.is_empty() {
        return Ok(());
    }
    flags.push(long);
    if arg.get_value_delimiter().is_some() {
        // `hidden = [256, 128]` is `--hidden 256,128`.
        flags.push(values.join(",").into());
    } else {
        flags.extend(values.into_iter().map(OsString::from));
    }
    Ok(())
}

/// Whether `matches` asked for `--print-config`.
pub fn wants_print(matches: &ArgMatches) -> bool {
    matches
        .try_get_one::<bool>("print_config")
        .ok()
        .flatten()
        .copied()
        .unwrap_or(false)
}

/// Every flag of `command` with the value `matches` gives it, as a TOML file that `--config`
/// reads back to the same run; flags without a value are listed commented out.
pub fn print(command: &Command, matches: &ArgMatches) -> String {
    let mut table = toml::Table::new();
    let mut unset = Vec::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else { continue };
        if OWN_FLAGS.contains(&id) || matches!(arg.get_action(), ArgAction::Help | ArgAction::Version) {
            continue;
        }
        let key = long.replace('-', "_");
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            table.insert(key, toml::Value::Boolean(matches.get_flag(id)));
            continue;
        }
        let raw: Vec<String> = matches
            .get_raw(id)
            .map(|values| values.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        match raw.as_slice() {
            [] => unset.push(key),
            [one] if arg.get_num_args().is_none_or(|n| n.max_values() == 1) && arg.get_value_delimiter().is_none() => {
                table.insert(key, typed(one));
            }
            many => {
                table.insert(key, toml::Value::Array(many.iter().map(|v| typed(v)).collect()));
            }
        }
    }
    let mut text = toml::to_string(&table).unwrap_or_default();
    for key in unset {
        text.push_str(&format!("# {key} = (not set)\n"));
    }
    text
}

/// A flag's text as the TOML value that reads back to the same text.
fn typed(raw: &str) -> toml::Value {
    if let Ok(i) = raw.parse::<i64>() {
        return toml::Value::Integer(i);
    }
    let looks_numeric = raw.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c));
    match raw.parse::<f64>() {
        Ok(f) if looks_numeric && f.is_finite() => toml::Value::Float(f),
        _ => toml::Value::String(raw.to_string()),
    }
}
