//! Grouping a step's tensors by device, so each device's backend gets one multi-tensor call.

use crate::device::Device;

/// `items` grouped by device, devices in order of first appearance, items in their order.
pub(super) fn by_device<T>(items: impl IntoIterator<Item = (Device, T)>) -> Vec<(Device, Vec<T>)> {
    let mut groups: Vec<(Device, Vec<T>)> = Vec::new();
    for (device, item) in items {
        match groups.iter_mut().find(|(d, _)| *d == device) {
            Some((_, list)) => list.push(item),
            None => groups.push((device, vec![item])),
        }
    }
    groups
}
