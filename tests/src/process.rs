//! This process's CPU time, for the benchmarks that report CPU per operation.

use std::time::Duration;

/// Clock ticks per second, for `/proc/self/stat` (`getconf CLK_TCK`; 100 if that fails).
pub fn clock_tick() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The CPU time (user + system) this process has used so far, in `tick`s per second.
pub fn cpu_time(tick: f64) -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .unwrap_or_else(|e| panic!("cannot read /proc/self/stat: {e}"));
    // After the command name in parentheses: field 3 (state) is the first; utime and stime are
    // fields 14 and 15.
    let (_, rest) = stat
        .rsplit_once(')')
        .unwrap_or_else(|| panic!("unexpected /proc/self/stat: {stat}"));
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> u64 {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("unexpected /proc/self/stat: {stat}"))
    };
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / tick)
}

/// Sends `signal` (`-STOP`, `-CONT`, `-TERM`, …) to process `pid` with `kill`: whether it was
/// delivered (false for a process that is gone).
pub fn signal(pid: u32, signal: &str) -> bool {
    std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill: {e}"))
        .success()
}

/// Kills the kit's `child` (SIGKILL), if it runs, and reaps it.
pub(crate) fn kill(child: &mut Option<std::process::Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Sends `signal` to the kit's `child`, which must take it (a server paused or thawed).
pub(crate) fn signal_child(child: Option<&std::process::Child>, what: &str, signal: &str) {
    let Some(child) = child else {
        panic!("{what} is not running");
    };
    assert!(self::signal(child.id(), signal), "kill {signal} {what} failed");
}
