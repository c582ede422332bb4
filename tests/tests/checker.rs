//! The multi-process checker (`src/bin/checker.rs`) with modest defaults: 3 processes × 4 tasks
//! on 3 keys for 12 s, with every fault injected once. By hand, bigger:
//! `cargo run -p lock-tests --bin checker -- --processes 6 --tasks 8 --keys 4 --seconds 120`.

use std::process::Command;

/// The number after `"name":` in the checker's JSON report.
fn field(report: &str, name: &str) -> u64 {
    let start = report
        .find(&format!("\"{name}\":"))
        .unwrap_or_else(|| panic!("no {name} in {report}"))
        + name.len()
        + 3;
    report[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e} in {report}"))
}

#[test]
fn the_checker_finds_no_overlap_no_stale_write_and_no_lost_update_under_faults() {
    let output = Command::new(env!("CARGO_BIN_EXE_checker"))
        .args(["--seconds", "12", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run the checker: {e}"));
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}");
    assert!(
        output.status.success(),
        "{}\n{report}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(field(&report, "overlaps"), 0);
    assert_eq!(field(&report, "stale_writes_accepted"), 0);
    assert_eq!(field(&report, "lost_updates"), 0);
    assert!(field(&report, "completed") > 100, "the run did work: {report}");
    assert_eq!(report.matches("\"fault\"").count(), 5, "every fault was injected");
    assert_eq!(field(&report, "other_errors"), 0, "{report}");
    // Fencing refuses only a holder that lost its lock mid-section (a fault hit it): rare. Many
    // refusals would mean tokens went backwards, as after a restart without the clock floor.
    assert!(
        field(&report, "refused_by_fencing") * 20 <= field(&report, "critical_sections"),
        "{report}"
    );
}
