//! `lockstep devices`: every device this build can open, with its memory, and with `--details`
//! each device's vendor, driver, features and limits.

use lockstep_core::device::list_devices;

use super::table;
pub use lockstep_flags::devices::Args;

pub fn run(args: Args) -> anyhow::Result<()> {
    let devices = list_devices();
    let rows: Vec<Vec<String>> = devices
        .iter()
        .map(|d| {
            vec![
                d.location.clone(),
                d.name.clone(),
                d.api.clone(),
                kind(d),
                d.total_memory_bytes.map_or_else(|| "unknown".into(), gib),
            ]
        })
        .collect();
    println!(
        "{}",
        table::render(&["LOCATION", "NAME", "API", "KIND", "MEMORY"], &rows)
    );
    if args.details {
        for d in devices.iter().filter(|d| !d.details.is_empty()) {
            println!("\n{}", d.location);
            print!("{}", format_details(&d.details));
        }
    }
    Ok(())
}

/// `  label: value` lines, labels aligned.
pub fn format_details(details: &[(String, String)]) -> String {
    let width = details.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    details.iter().map(|(k, v)| format!("  {k:<width$}  {v}\n")).collect()
}

/// Software or hardware, and which device this one repeats through another API (wgpu lists
/// one GPU once per API it speaks).
fn kind(d: &lockstep_core::backend::DeviceInfo) -> String {
    let kind = if d.software { "software" } else { "hardware" };
    match d.details.iter().find(|(k, _)| k == "same GPU as") {
        Some((_, first)) => format!("{kind} (same GPU as {first})"),
        None => kind.into(),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_reads_in_gib() {
        assert_eq!(super::gib(3 << 29), "1.5 GiB");
    }

    #[test]
    fn details_are_aligned() {
        let d = [
            ("a".to_string(), "1".to_string()),
            ("long".to_string(), "2".to_string()),
        ];
        assert_eq!(super::format_details(&d), "  a     1\n  long  2\n");
    }
}
