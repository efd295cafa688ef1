//! What rank 0 reports for every replica of a data-parallel run: the devices' names once at
//! the start, and at each logged step each rank's step times and device counters. They are
//! gathered through the gradients' communicator, so replicas on threads and on processes (and
//! machines) report alike.

use crate::backend::Communicator;
use crate::device::Device;
use crate::distributed::{all_gather_strings, all_gather_values};
use crate::error::Result;
use crate::train::events::{DeviceStats, StepTimes};

/// The counters of `device`, named `name`.
pub fn device_stats(device: &Device, name: &str) -> DeviceStats {
    let (stats, info) = (device.backend().memory_stats(), device.info());
    DeviceStats {
        device: name.to_string(),
        utilization: stats.utilization,
        memory_allocated: stats.allocated_bytes,
        memory_reserved: stats.reserved_bytes,
        memory_peak: stats.peak_allocated_bytes,
        memory_total: info.total_memory_bytes,
    }
}

/// Every replica's device, by rank. Where a name repeats (`cuda:0` on two machines) every name
/// carries its rank, so each device keeps its own row in a display.
pub fn replica_names(comm: &dyn Communicator, device: &Device) -> Result<Vec<String>> {
    let names = all_gather_strings(comm, device, device.location())?;
    Ok(distinct(names, "rank"))
}

/// `names`, each with its index (`cuda:0 (rank 1)`) where one repeats, so every worker keeps
/// its own row in a display.
pub(super) fn distinct(names: Vec<String>, worker: &str) -> Vec<String> {
    let unique = names.iter().collect::<std::collections::BTreeSet<_>>().len() == names.len();
    if unique {
        return names;
    }
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| format!("{name} ({worker} {i})"))
        .collect()
}

/// Every replica's step times and device counters, by rank; `names` are `replica_names`'.
pub fn gather_reports(
    comm: &dyn Communicator,
    device: &Device,
    times: &StepTimes,
    names: &[String],
) -> Result<Vec<(StepTimes, DeviceStats)>> {
    let n_times = times.values().len();
    let mut mine: Vec<f32> = times.values().iter().map(|&v| v as f32).collect();
    mine.extend(counters(&device_stats(device, "")).map(|v| v as f32));
    // f32: every collective engine carries it (byte counts keep 7 significant digits).
    let width = mine.len();
    let all = all_gather_values(comm, device, mine)?;
    Ok(all
        .chunks_exact(width)
        .zip(names)
        .map(|(values, name)| {
            let v: Vec<f64> = values.iter().map(|&x| f64::from(x)).collect();
            let (t, d) = v.split_at(n_times);
            let times = StepTimes::from_values(std::array::from_fn(|i| t[i]));
            (times, from_counters(name, d))
        })
        .collect())
}

/// The numbers of `stats`; -1 stands for "unknown".
fn counters(stats: &DeviceStats) -> [f64; 5] {
    [
        stats.utilization.unwrap_or(-1.0),
        stats.memory_allocated as f64,
        stats.memory_reserved as f64,
        stats.memory_peak as f64,
        stats.memory_total.map_or(-1.0, |t| t as f64),
    ]
}

fn from_counters(name: &str, v: &[f64]) -> DeviceStats {
    let known = |x: f64| (x >= 0.0).then_some(x);
    DeviceStats {
        device: name.to_string(),
        utilization: known(v[0]),
        memory_allocated: v[1] as u64,
        memory_reserved: v[2] as u64,
        memory_peak: v[3] as u64,
        memory_total: known(v[4]).map(|t| t as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_device_names_carry_their_ranks() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            distinct(names(&["cuda:0", "cuda:1"]), "rank"),
            names(&["cuda:0", "cuda:1"])
        );
        assert_eq!(
            distinct(names(&["cuda:0", "cuda:0"]), "rank"),
            names(&["cuda:0 (rank 0)", "cuda:0 (rank 1)"])
        );
    }

    #[test]
    fn counters_round_trip_with_unknowns() {
        let stats = DeviceStats {
            device: "wgpu:0".into(),
            utilization: None,
            memory_allocated: 3 << 20,
            memory_reserved: 5 << 20,
            memory_peak: 4 << 20,
            memory_total: Some(8 << 30),
        };
        assert_eq!(from_counters("wgpu:0", &counters(&stats)), stats);
        let busy = DeviceStats {
            utilization: Some(0.25),
            memory_total: None,
            ..stats
        };
        assert_eq!(from_counters("wgpu:0", &counters(&busy)), busy);
    }
}
