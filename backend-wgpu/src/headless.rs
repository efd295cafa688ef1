//! Keeps Mesa's display probe quiet on machines with no display session.

/// Turns off Mesa's Vulkan device-select layer when no Wayland display can be reached, and says
/// whether it did.
///
/// The layer asks libwayland for the default display on every `vkEnumeratePhysicalDevices`
/// (wgpu calls it twice), and without `XDG_RUNTIME_DIR` libwayland prints "error:
/// XDG_RUNTIME_DIR is invalid or not set in the environment." each time: two alarming lines on
/// every headless run. With no session there is no display to choose a device by, and Lockstep
/// orders the adapters itself, so the layer's own switch (`NODEVICE_SELECT=1`) loses nothing.
/// Changing the environment is only sound while no other thread runs, so this does nothing once
/// the process has a second thread: call it first thing in `main`.
pub fn quiet_display_probe_without_session() -> bool {
    let env = |name| std::env::var_os(name);
    let absolute = |name| env(name).is_some_and(|v| v.to_string_lossy().starts_with('/'));
    let wayland_reachable =
        env("WAYLAND_SOCKET").is_some() || absolute("WAYLAND_DISPLAY") || absolute("XDG_RUNTIME_DIR");
    if wayland_reachable || env("NODEVICE_SELECT").is_some() || !single_threaded() {
        return false;
    }
    // SAFETY: `single_threaded` saw this thread alone in the process, so no other thread can
    // read or write the environment while it changes (std's set_var contract).
    unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    true
}

/// Whether the process has exactly one thread (Linux's `/proc/self/status`; elsewhere, no
/// answer counts as no).
fn single_threaded() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .any(|line| line.strip_prefix("Threads:").is_some_and(|n| n.trim() == "1"))
}
