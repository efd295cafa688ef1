//! `lockstep devices`: every device this build can open, with its memory.

use lockstep_core::device::list_devices;

use super::table;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = list_devices()
        .into_iter()
        .map(|d| {
            vec![
                d.location,
                d.name,
                d.api,
                d.total_memory_bytes.map_or_else(|| "unknown".into(), gib),
            ]
        })
        .collect();
    println!("{}", table::render(&["LOCATION", "NAME", "API", "MEMORY"], &rows));
    Ok(())
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
}
