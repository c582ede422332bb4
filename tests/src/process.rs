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
