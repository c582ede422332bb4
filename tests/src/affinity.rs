//! CPU affinity through `taskset` (util-linux), for the benchmarks that pin the client and the
//! server: one request at a time on a small VM is otherwise a lottery of where the two run.

use std::process::Command;

/// A process's CPU affinity list as `taskset -p -c` prints it ("pid 42's current affinity list:
/// 0-3,6" gives "0-3,6"); `None` without `taskset`.
pub fn of(pid: u32) -> Option<String> {
    let out = Command::new("taskset")
        .args(["-p", "-c", &pid.to_string()])
        .output()
        .ok()?;
    let out = String::from_utf8(out.stdout).ok()?;
    Some(out.rsplit_once(": ")?.1.trim().to_owned())
}

/// Every thread of `pid` (`taskset -a`) onto the CPUs of list `cpus`; why not, if it failed.
pub fn set(pid: u32, cpus: &str) -> Result<(), String> {
    match Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "taskset -a -p -c {cpus} {pid} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => Err(format!("cannot run taskset: {e}")),
    }
}

/// The CPUs of an affinity list such as "0-3,6".
pub fn cpus(list: &str) -> Vec<usize> {
    list.split(',')
        .filter_map(|part| match part.split_once('-') {
            Some((first, last)) => Some(first.trim().parse().ok()?..=last.trim().parse().ok()?),
            None => {
                let cpu = part.trim().parse().ok()?;
                Some(cpu..=cpu)
            }
        })
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_affinity_list_names_its_cpus() {
        assert_eq!(super::cpus("0-3,6"), [0, 1, 2, 3, 6]);
        assert_eq!(super::cpus("1"), [1]);
        assert!(super::cpus("").is_empty());
    }
}
