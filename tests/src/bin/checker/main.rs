//! The multi-process checker: P worker processes × T tasks contend on K keys through
//! `#[distributed_lock]` (a 3 s lease, the watchdog, fencing where the store gives tokens, 3 s
//! of waiting: `worker::options`) on one deployment of a lock store,
//! while one kind of fault is injected again and again; the log their writes left in a fenced
//! store is checked afterwards. One run prints one table row; `--matrix` runs every store with
//! the faults that tell most about it (21 cells, `--parallel` at a time) and prints the table.
//!
//! ```text
//! cargo run --release -p lock-tests --bin checker -- --store redis --fault sigstop [--seconds 30]
//!     [--wait-for-replicas N] [--restart-delay-ms MS] [--processes 3] [--tasks 3] [--keys 4]
//!     [--permits N] [--sets] [--fair] [--shared] [--json FILE]
//! cargo run --release -p lock-tests --bin checker -- --matrix [--seconds 60] [--parallel 2]
//!     [--json FILE]
//! ```
//!
//! Stores (`--store`), each spawned with the test kit: `memory` (the in-process backend: the
//! tasks of every "process" run in the checker itself), `redis` (one server), `sentinel` (a
//! primary, two replicas, a sentinel), `cluster` (three primaries with a replica each),
//! `redlock` (five masters), `etcd` (three members), `zookeeper` (three servers), `postgres` (a
//! server of its own), `mysql`
//! (a MariaDB server of its own; sections use only what MySQL offers: a fencing token, no fair
//! mode or read-write lock, which the checker's sections never ask for).
//! `--wait-for-replicas N` makes every acquire and renewal wait for N replicas (Sentinel,
//! Cluster).
//!
//! Faults (`--fault`), each where it means something: `sigstop` (a worker frozen for longer
//! than the lease, then thawed), `sigkill` (a worker killed, then started again), `partition`
//! (a worker's connections to the store go silent for longer than the lease: one Redis, etcd,
//! ZooKeeper, PostgreSQL, MySQL, whose workers connect through fault proxies), `restart` (one Redis
//! restarted empty; PostgreSQL and MariaDB restarted on their data), `failover` (Sentinel and
//! Cluster: the replicas frozen for a second, so that they miss what the primary took then, and
//! the primary killed; etcd and ZooKeeper: the leader killed), `restart-empty` (a RedLock master restarted without its data, at
//! once or `--restart-delay-ms` later).
//!
//! `--permits N` (N > 1) makes every key a semaphore of N permits (not on RedLock, which offers
//! none): each section takes a permit, and each permit's sections write to a resource of their
//! own in the fenced store, so the checks below hold per permit (at most one holder of a
//! permit at a time, hence at most N per key); a permit outside the count is an `other` error.
//!
//! `--fair` makes every lock fair. `--shared` makes half the sections readers of a read-write
//! lock (`LockMode::Shared`): a reader enters and polls with its fencing token, the last
//! writer's, and changes nothing; readers of one writer's token may overlap each other, never a
//! writer (the log's check below takes each writer and the readers after it as one step).
//!
//! `--sets` makes every section a transfer between two of 16 accounts (`--keys`) under one set
//! lock on both (the attribute's `keys = [...]`, so `run_all`): it enters both accounts with
//! each key's fencing token, reads both balances, holds, and writes both new balances in one
//! fenced write that the store applies whole or not at all (`transfer.lua`). Besides the checks
//! below, per account, every accepted transfer must have read the balance the one before it
//! wrote (else it is a lost update), and the sum of every balance must still be 0.
//!
//! Each critical section holds its key's lock for a short time (5–50 ms) or, one in five, a
//! long one (2–5 s, longer than a failover takes), and writes to the fenced store as it
//! goes: when it enters, every 100 ms while it holds, and its read-modify-write of the key's
//! counter at the end. The store accepts a write only with a fencing token at least as high as
//! the highest it has accepted, and logs every write, accepted or not. The row, from the log:
//! - sections: critical sections that entered;
//! - overlaps: sections that entered while another holder of the key was still writing;
//! - late bodies: sections that wrote again after the next holder of the key entered;
//! - stale accepted: such late writes that the store accepted;
//! - fenced refused: writes the store refused for a stale token;
//! - lost updates: increments the counter does not show;
//! - recovery: the longest time from a fault striking until a new section entered on every key
//!   (a fault after which some key saw none before the run ended is counted as unrecovered).
//!
//! RedLock offers no fencing token: its sections run without one (every write carries token
//! 0 and is accepted), so what a lost lock costs there shows as stale writes and lost updates.
//!
//! Exit status 0 when the run held what the library promises for it: no stale write accepted
//! and no lost update wherever sections are fenced, and no overlap and no late body where the store
//! keeps its locks through the fault (see [`Cell::promised`]), and no unexpected error in a
//! worker (a killed worker's tally is lost with it); 1 otherwise.

mod deploy;
mod store;
mod worker;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use deploy::{Deployment, Fault, Kind};
use lock_runtime::LockClient;
use lock_tests::RedisServer;
use store::{Reader, Verdict};
use worker::Tally;

pub type Fallible<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How long a worker stays frozen or cut off: past the lease, so that its locks expire.
const OUT: Duration = Duration::from_millis(4500);
/// How long after a fault struck every key must have been written again.
const RECOVERY_LIMIT: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = if args.first().map(String::as_str) == Some("worker") {
        match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(runtime) => runtime.block_on(worker::main(&args[1..])).map(|()| true),
            Err(e) => Err(e.into()),
        }
    } else {
        options(&args).and_then(|o| if o.matrix { matrix(&o) } else { single(&o) })
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("checker: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Options

/// One run: a deployment, a fault, a load.
#[derive(Clone, Debug)]
struct Cell {
    store: Kind,
    fault: Fault,
    replicas: usize,
    restart_delay: Duration,
    seconds: u64,
    processes: usize,
    tasks: u64,
    keys: u64,
    /// More than 1: the sections take permits of a semaphore on each key.
    permits: u32,
    /// Each section a transfer between two accounts under one set lock.
    sets: bool,
    /// Every lock fair.
    fair: bool,
    /// Half the sections readers of a read-write lock.
    shared: bool,
}

impl Cell {
    /// Whether the library promises no overlap and no late body here: every fault of a worker
    /// (the lease and the holder's own validity end together), and faults the store keeps its
    /// locks through: replica acknowledgement, etcd's and ZooKeeper's consensus, PostgreSQL's and MariaDB's
    /// committed rows. Not one Redis restarted empty, a failover without acknowledgement, or a
    /// RedLock master restarted empty: there the store itself forgets locks, which only fencing
    /// makes safe.
    fn promised(&self) -> bool {
        match self.fault {
            Fault::None | Fault::Sigstop | Fault::Sigkill | Fault::Partition => true,
            Fault::Restart => matches!(self.store, Kind::Postgres | Kind::Mysql),
            Fault::Failover => matches!(self.store, Kind::Etcd | Kind::Zookeeper) || self.replicas > 0,
            Fault::RestartEmpty => false,
        }
    }

    /// Whether sections hold a fencing token (every store but RedLock).
    fn fenced(&self) -> bool {
        self.store.fences()
    }

    /// What the sections lock.
    fn load(&self) -> worker::Load {
        worker::Load {
            keys: self.keys,
            permits: self.permits,
            sets: self.sets,
            fair: self.fair,
            shared: self.shared,
        }
    }

    fn store_label(&self) -> String {
        if self.fair || self.shared {
            let mut plain = self.clone();
            (plain.fair, plain.shared) = (false, false);
            let modes = match (self.fair, self.shared) {
                (true, true) => "fair, readers and writers",
                (true, false) => "fair",
                _ => "readers and writers",
            };
            return format!("{}, {modes}", plain.store_label());
        }
        if self.sets {
            let mut plain = self.clone();
            plain.sets = false;
            return format!("{}, transfers under sets", plain.store_label());
        }
        if self.permits > 1 {
            let mut plain = self.clone();
            plain.permits = 1;
            return format!("{}, {} permits", plain.store_label(), self.permits);
        }
        if !self.fenced() {
            format!("{} (no fencing)", self.store.name())
        } else if self.replicas > 0 {
            format!("{} + WAIT {}", self.store.name(), self.replicas)
        } else {
            self.store.name().to_owned()
        }
    }

    fn fault_label(&self) -> String {
        if self.fault == Fault::RestartEmpty && !self.restart_delay.is_zero() {
            format!("restart-empty, back after {} ms", self.restart_delay.as_millis())
        } else {
            self.fault.name().to_owned()
        }
    }

    /// The flags that run this cell.
    fn args(&self) -> Vec<String> {
        [
            ("--store", self.store.name().to_owned()),
            ("--fault", self.fault.name().to_owned()),
            ("--wait-for-replicas", self.replicas.to_string()),
            ("--restart-delay-ms", self.restart_delay.as_millis().to_string()),
            ("--seconds", self.seconds.to_string()),
            ("--processes", self.processes.to_string()),
            ("--tasks", self.tasks.to_string()),
            ("--keys", self.keys.to_string()),
            ("--permits", self.permits.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .chain(self.sets.then(|| "--sets".to_owned()))
        .chain(self.fair.then(|| "--fair".to_owned()))
        .chain(self.shared.then(|| "--shared".to_owned()))
        .collect()
    }
}

struct Options {
    cell: Cell,
    json: Option<PathBuf>,
    matrix: bool,
    parallel: usize,
}

fn options(args: &[String]) -> Fallible<Options> {
    let mut o = Options {
        cell: Cell {
            store: Kind::Redis,
            fault: Fault::None,
            replicas: 0,
            restart_delay: Duration::ZERO,
            seconds: 20,
            processes: 3,
            tasks: 3,
            keys: 4,
            permits: 1,
            sets: false,
            fair: false,
            shared: false,
        },
        json: None,
        matrix: false,
        parallel: 2,
    };
    let mut seconds = None;
    let mut keys = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number =
            |text: &str| -> Fallible<u64> { text.parse().map_err(|e| format!("{flag} {text}: {e}").into()) };
        let c = &mut o.cell;
        match flag.as_str() {
            "--store" => c.store = Kind::parse(value()?)?,
            "--fault" => c.fault = Fault::parse(value()?)?,
            "--wait-for-replicas" => c.replicas = number(value()?)? as usize,
            "--restart-delay-ms" => c.restart_delay = Duration::from_millis(number(value()?)?),
            "--seconds" => seconds = Some(number(value()?)?),
            "--processes" => c.processes = number(value()?)? as usize,
            "--tasks" => c.tasks = number(value()?)?,
            "--keys" => keys = Some(number(value()?)?),
            "--sets" => c.sets = true,
            "--fair" => c.fair = true,
            "--shared" => c.shared = true,
            "--permits" => {
                c.permits = u32::try_from(number(value()?)?).map_err(|e| format!("--permits: {e}"))?
            }
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--matrix" => o.matrix = true,
            "--parallel" => o.parallel = (number(value()?)? as usize).max(1),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let c = &mut o.cell;
    c.seconds = seconds.unwrap_or(if o.matrix { 60 } else { 20 });
    // Transfers between 16 accounts, unless told otherwise.
    c.keys = keys.unwrap_or(if c.sets { 16 } else { 4 });
    if !o.matrix {
        if !c.fault.applies_to(c.store) {
            return Err(format!(
                "--fault {} does not apply to --store {}",
                c.fault.name(),
                c.store.name()
            )
            .into());
        }
        if c.replicas > 0 && !matches!(c.store, Kind::Sentinel | Kind::Cluster) {
            return Err("--wait-for-replicas applies to --store sentinel and cluster".into());
        }
        if c.processes < 1 || c.tasks < 1 || c.keys < 1 || c.permits < 1 || c.seconds < 3 {
            return Err(
                "--processes, --tasks, --keys and --permits must be at least 1, --seconds at least 3".into(),
            );
        }
        if c.permits > 1 && c.store == Kind::Redlock {
            return Err("--permits: RedLock offers no semaphores".into());
        }
        if (c.fair || c.shared) && c.store == Kind::Redlock {
            return Err("--fair, --shared: RedLock offers no fair mode or read-write locks".into());
        }
        if c.shared && (c.permits > 1 || c.sets) {
            return Err("--shared: readers and writers of single locks (no --permits, no --sets)".into());
        }
        if c.sets && (c.permits > 1 || c.keys < 2) {
            return Err(
                "--sets moves money between two accounts of at least 2 keys, with locks (no --permits)"
                    .into(),
            );
        }
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------------------
// One run

/// What one fault cost.
struct Cost {
    at: Duration,
    recovered_after: Option<Duration>,
}

struct Report {
    cell: Cell,
    tally: Tally,
    verdict: Verdict,
    costs: Vec<Cost>,
    took: Duration,
}

impl Report {
    /// The longest recovery among the faults that recovered (0 without any).
    fn recovery_ms_max(&self) -> u128 {
        self.costs
            .iter()
            .filter_map(|c| c.recovered_after)
            .map(|d| d.as_millis())
            .max()
            .unwrap_or(0)
    }

    /// What the library promises for this run held (see the exit status in the crate docs).
    fn held(&self) -> bool {
        let v = &self.verdict;
        (!self.cell.fenced() || (v.stale_accepted == 0 && v.lost_updates == 0 && v.sum_drift == 0))
            && (!self.cell.promised() || v.is_clean())
            && self.tally.other == 0
    }

    /// The run as one JSON object: the cell, its labels, the counts, the tally, each fault.
    fn json(&self) -> serde_json::Value {
        let (c, v) = (&self.cell, &self.verdict);
        let faults: Vec<serde_json::Value> = self
            .costs
            .iter()
            .map(|cost| {
                serde_json::json!({
                    "at_ms": cost.at.as_millis() as u64,
                    "recovered_after_ms": cost.recovered_after.map(|d| d.as_millis() as u64),
                })
            })
            .collect();
        let mut json = serde_json::json!({
            "store": c.store.name(),
            "fault": c.fault.name(),
            "store_label": c.store_label(),
            "fault_label": c.fault_label(),
            "wait_for_replicas": c.replicas,
            "restart_delay_ms": c.restart_delay.as_millis() as u64,
            "seconds": c.seconds,
            "processes": c.processes,
            "tasks": c.tasks,
            "keys": c.keys,
            "permits": c.permits,
            "fenced": c.fenced(),
            "promised": c.promised(),
            "held": self.held(),
            "sections": v.sections,
            "overlaps": v.overlaps,
            "late_bodies": v.late_bodies,
            "stale_accepted": v.stale_accepted,
            "fenced_refused": v.fenced_refused,
            "lost_updates": v.lost_updates,
            "sets": c.sets,
            "fair": c.fair,
            "shared": c.shared,
            "sum_drift": v.sum_drift,
            "recovery_ms_max": self.recovery_ms_max() as u64,
            "unrecovered": self.costs.iter().filter(|c| c.recovered_after.is_none()).count(),
            "faults": faults,
            "took_ms": self.took.as_millis() as u64,
        });
        if let Some(object) = json.as_object_mut() {
            object.extend(self.tally.json());
        }
        json
    }
}

const HEADER: &str = "| store | fault | faults | sections | overlaps | late bodies | stale writes accepted | refused by fencing | lost updates | recovery (max) |\n\
                      |---|---|--:|--:|--:|--:|--:|--:|--:|--:|";

/// The table row of a report, from its JSON object ([`Report::json`]).
fn row(json: &serde_json::Value) -> Option<String> {
    let text = |name: &str| json.get(name).and_then(serde_json::Value::as_str);
    let number = |name: &str| json.get(name).and_then(serde_json::Value::as_u64);
    let faults = json.get("faults")?.as_array()?.len();
    let lost = match number("sum_drift").unwrap_or(0) {
        0 => number("lost_updates")?.to_string(),
        drift => format!("{} (the sum moved by {drift})", number("lost_updates")?),
    };
    let recovery = match (faults, number("unrecovered")?) {
        (0, _) => "–".to_owned(),
        (_, 0) => format!("{} ms", number("recovery_ms_max")?),
        (_, n) => format!("{n} not recovered in the run"),
    };
    Some(format!(
        "| {} | {} | {faults} | {} | {} | {} | {} | {} | {lost} | {recovery} |",
        text("store_label")?,
        text("fault_label")?,
        number("sections")?,
        number("overlaps")?,
        number("late_bodies")?,
        number("stale_accepted")?,
        number("fenced_refused")?,
    ))
}

fn single(o: &Options) -> Fallible<bool> {
    let report = run(&o.cell)?;
    let json = report.json();
    if let Some(path) = &o.json {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        writeln!(file, "{json}")?;
    }
    let t = &report.tally;
    println!(
        "checker: {} on {}, {} processes × {} tasks on {} keys for {} s (took {:.1} s)",
        report.cell.fault_label(),
        report.cell.store_label(),
        report.cell.processes,
        report.cell.tasks,
        report.cell.keys,
        report.cell.seconds,
        report.took.as_secs_f64()
    );
    println!(
        "critical sections: {} attempted, {} completed, {} refused by fencing, {} busy, {} lost, {} unavailable, {} not replicated, {} other",
        t.attempts, t.completed, t.refused, t.busy, t.lost, t.unavailable, t.not_replicated, t.other
    );
    println!("{HEADER}\n{}", row(&json).unwrap_or_default());
    Ok(report.held())
}

/// The worker processes (or, in memory, the checker's own tasks).
enum Workers {
    Processes {
        exe: PathBuf,
        store_url: String,
        tasks: u64,
        load: worker::Load,
        deadline: Instant,
        children: Vec<Child>,
        killed: usize,
    },
    InProcess(Option<std::thread::JoinHandle<Fallible<Tally>>>),
}

/// Whatever is left of the workers when the run ends early (an error, a panic): thawed and
/// killed, so that no worker outlives the checker or stays frozen holding its output pipe.
impl Drop for Workers {
    fn drop(&mut self) {
        if let Workers::Processes { children, .. } = self {
            for child in children.iter_mut() {
                let _ = signal("-CONT", child.id());
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Workers {
    fn start(cell: &Cell, deployment: &Deployment, store_url: &str, deadline: Instant) -> Fallible<Workers> {
        if cell.store == Kind::Memory {
            let (url, tasks, load) = (
                store_url.to_owned(),
                cell.tasks * cell.processes as u64,
                cell.load(),
            );
            let thread = std::thread::spawn(move || -> Fallible<Tally> {
                let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
                runtime.block_on(worker::run(
                    LockClient::in_memory(),
                    true,
                    &url,
                    "m",
                    tasks,
                    load,
                    deadline,
                ))
            });
            return Ok(Workers::InProcess(Some(thread)));
        }
        let mut workers = Workers::Processes {
            exe: std::env::current_exe()?,
            store_url: store_url.to_owned(),
            tasks: cell.tasks,
            load: cell.load(),
            deadline,
            children: Vec::new(),
            killed: 0,
        };
        for w in 0..cell.processes {
            let child = workers.spawn(deployment, w, &w.to_string())?;
            if let Workers::Processes { children, .. } = &mut workers {
                children.push(child);
            }
        }
        Ok(workers)
    }

    fn spawn(&self, deployment: &Deployment, w: usize, id: &str) -> Fallible<Child> {
        let Workers::Processes {
            exe,
            store_url,
            tasks,
            load,
            deadline,
            ..
        } = self
        else {
            return Err("no worker processes in memory".into());
        };
        let millis = deadline.saturating_duration_since(Instant::now()).as_millis();
        Ok(Command::new(exe)
            .args(["worker", &deployment.spec(w), store_url, id])
            .args([tasks.to_string(), load.keys.to_string(), millis.to_string()])
            .arg(load.permits.to_string())
            .arg(load.sections())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?)
    }

    fn pid(&self, w: usize) -> Fallible<u32> {
        match self {
            Workers::Processes { children, .. } => Ok(children.get(w).ok_or("no such worker")?.id()),
            Workers::InProcess(_) => Err("no worker processes in memory".into()),
        }
    }

    /// Kills worker `w` (SIGKILL) and starts another in its place, under a new id.
    fn kill_and_replace(&mut self, deployment: &Deployment, w: usize) -> Fallible<()> {
        let id = match self {
            Workers::Processes { children, killed, .. } => {
                let child = children.get_mut(w).ok_or("no such worker")?;
                child.kill()?;
                child.wait()?;
                *killed += 1;
                format!("{w}r{killed}")
            }
            Workers::InProcess(_) => return Err("no worker processes in memory".into()),
        };
        let replacement = self.spawn(deployment, w, &id)?;
        if let Workers::Processes { children, .. } = self {
            children[w] = replacement;
        }
        Ok(())
    }

    /// Waits for every worker and adds up their tallies (a killed one's is lost with it).
    fn finish(mut self) -> Fallible<Tally> {
        match &mut self {
            Workers::InProcess(thread) => thread
                .take()
                .ok_or("the in-memory workers were joined already")?
                .join()
                .map_err(|_| "the in-memory workers panicked")?,
            Workers::Processes { children, .. } => {
                let mut total = Tally::default();
                // One at a time out of `children`: on an error, `drop` kills the rest.
                while !children.is_empty() {
                    let output = children.remove(0).wait_with_output()?;
                    let text = String::from_utf8_lossy(&output.stdout);
                    let tally = text
                        .lines()
                        .find_map(|line| line.strip_prefix("tally "))
                        .and_then(|json| serde_json::from_str(json).ok())
                        .and_then(|json| Tally::from_json(&json));
                    match tally {
                        Some(t) if output.status.success() => total.add(&t),
                        _ => return Err(format!("a worker failed ({}): {text}", output.status).into()),
                    }
                }
                Ok(total)
            }
        }
    }
}

fn run(cell: &Cell) -> Fallible<Report> {
    let store_server = RedisServer::spawn();
    let mut deployment = Deployment::spawn(cell.store, cell.replicas, cell.processes);
    let started = Instant::now();
    let total = Duration::from_secs(cell.seconds);
    let deadline = started + total;
    let mut workers = Workers::start(cell, &deployment, &store_server.url(), deadline)?;
    // When each fault struck: since the start, and in ms since the epoch (the store's clock).
    let mut strikes: Vec<(Duration, u64)> = Vec::new();
    if cell.fault != Fault::None {
        // A first fault once the workers run, then one after another with a pause between,
        // while there is time for one more and its recovery.
        let (length, gap) = match cell.fault {
            Fault::Sigstop | Fault::Partition => (OUT, Duration::from_secs(3)),
            Fault::Failover => (Duration::from_secs(6), Duration::from_secs(12)),
            Fault::RestartEmpty => (cell.restart_delay, Duration::from_secs(2)),
            _ => (Duration::from_secs(1), Duration::from_secs(3)),
        };
        std::thread::sleep(Duration::from_secs(2).min(total / 4));
        let mut round = 0;
        loop {
            let w = round % cell.processes;
            let mut struck = None;
            let mut strike = || struck = Some((started.elapsed(), epoch_ms()));
            match cell.fault {
                Fault::Sigstop => {
                    let pid = workers.pid(w)?;
                    strike();
                    signal("-STOP", pid)?;
                    std::thread::sleep(OUT);
                    signal("-CONT", pid)?;
                }
                Fault::Sigkill => {
                    strike();
                    workers.kill_and_replace(&deployment, w)?;
                }
                Fault::Partition => {
                    strike();
                    deployment.partition(w, true);
                    std::thread::sleep(OUT);
                    deployment.partition(w, false);
                }
                fault => deployment.store_fault(fault, cell.restart_delay, &mut strike)?,
            }
            strikes.push(struck.ok_or("the fault never struck")?);
            round += 1;
            if started.elapsed() + gap + length + Duration::from_secs(3) > total {
                break;
            }
            std::thread::sleep(gap);
        }
    }
    let tally = workers.finish()?;
    let mut reader = Reader::connect(&store_server.url())?;
    let at_ms: Vec<u64> = strikes.iter().map(|&(_, ms)| ms).collect();
    let (verdict, recovered) = reader.verdict(cell.load(), &at_ms)?;
    let costs = strikes
        .iter()
        .zip(recovered)
        .map(|(&(at, _), r)| Cost {
            at,
            recovered_after: r.map(Duration::from_millis).filter(|&d| d <= RECOVERY_LIMIT),
        })
        .collect();
    Ok(Report {
        cell: cell.clone(),
        tally,
        verdict,
        costs,
        took: started.elapsed(),
    })
}

fn signal(signal: &str, pid: u32) -> Fallible<()> {
    let status = Command::new("kill").args([signal, &pid.to_string()]).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill {signal} {pid} failed").into())
    }
}

/// Now, in ms since the epoch.
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

// ---------------------------------------------------------------------------------------------
// The matrix

/// Every store with the faults that mean something on it.
fn cells(template: &Cell) -> Vec<Cell> {
    let cell = |store, fault, replicas, delay: u64| Cell {
        store,
        fault,
        replicas,
        restart_delay: Duration::from_millis(delay),
        ..template.clone()
    };
    let ttl = worker::TTL.as_millis() as u64;
    let plain = vec![
        cell(Kind::Memory, Fault::None, 0, 0),
        cell(Kind::Redis, Fault::None, 0, 0),
        cell(Kind::Redis, Fault::Sigstop, 0, 0),
        cell(Kind::Redis, Fault::Sigkill, 0, 0),
        cell(Kind::Redis, Fault::Partition, 0, 0),
        cell(Kind::Redis, Fault::Restart, 0, 0),
        cell(Kind::Sentinel, Fault::Failover, 0, 0),
        cell(Kind::Sentinel, Fault::Failover, 1, 0),
        cell(Kind::Cluster, Fault::Failover, 0, 0),
        cell(Kind::Cluster, Fault::Failover, 1, 0),
        cell(Kind::Redlock, Fault::RestartEmpty, 0, 0),
        cell(Kind::Redlock, Fault::RestartEmpty, 0, ttl),
        cell(Kind::Etcd, Fault::Failover, 0, 0),
        cell(Kind::Etcd, Fault::Sigstop, 0, 0),
        cell(Kind::Etcd, Fault::Partition, 0, 0),
        cell(Kind::Postgres, Fault::Sigstop, 0, 0),
        cell(Kind::Postgres, Fault::Restart, 0, 0),
        cell(Kind::Postgres, Fault::Partition, 0, 0),
        cell(Kind::Mysql, Fault::Sigstop, 0, 0),
        cell(Kind::Mysql, Fault::Restart, 0, 0),
        cell(Kind::Mysql, Fault::Partition, 0, 0),
        cell(Kind::Zookeeper, Fault::Failover, 0, 0),
        cell(Kind::Zookeeper, Fault::Sigstop, 0, 0),
        cell(Kind::Zookeeper, Fault::Partition, 0, 0),
    ];
    // Transfers under set locks, with a worker frozen or cut off, on each store that sets are
    // built for (16 accounts, unless `--keys` says otherwise).
    let sets = [
        Kind::Redis,
        Kind::Postgres,
        Kind::Etcd,
        Kind::Zookeeper,
        Kind::Mysql,
    ]
    .into_iter()
    .flat_map(|store| [Fault::Sigstop, Fault::Partition].map(|fault| (store, fault)))
    .map(|(store, fault)| Cell {
        sets: true,
        keys: if template.keys == 4 { 16 } else { template.keys },
        ..cell(store, fault, 0, 0)
    });
    // MySQL's fair and read-write loads (its lines and shares are transactions of their own),
    // with each fault that means something there.
    let modes = [Fault::Sigstop, Fault::Partition, Fault::Restart]
        .into_iter()
        .flat_map(|fault| [(true, false), (false, true)].map(|(fair, shared)| (fault, fair, shared)))
        .map(|(fault, fair, shared)| Cell {
            fair,
            shared,
            ..cell(Kind::Mysql, fault, 0, 0)
        });
    plain.into_iter().chain(sets).chain(modes).collect()
}

/// A matrix cell's table row, from its report, or that it failed to run.
fn cell_row(cell: &Cell, json: Option<&serde_json::Value>) -> String {
    json.and_then(row).unwrap_or_else(|| {
        format!(
            "| {} | {} | failed to run |",
            cell.store_label(),
            cell.fault_label()
        )
    })
}

/// Runs every cell, `parallel` at a time, each as a checker process of its own, and prints the
/// table. Fails when a cell failed to run or broke a promise.
fn matrix(o: &Options) -> Fallible<bool> {
    let exe = std::env::current_exe()?;
    let dir = tempfile::tempdir()?;
    let cells = cells(&o.cell);
    let started = Instant::now();
    let mut results: Vec<Option<(bool, Option<serde_json::Value>)>> = vec![None; cells.len()];
    let mut running: Vec<(usize, Child)> = Vec::new();
    let mut next = 0;
    while next < cells.len() || !running.is_empty() {
        while next < cells.len() && running.len() < o.parallel {
            let child = Command::new(&exe)
                .args(cells[next].args())
                .arg("--json")
                .arg(dir.path().join(format!("{next}.json")))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()?;
            eprintln!(
                "checker: cell {} ({} on {}) started",
                next + 1,
                cells[next].fault_label(),
                cells[next].store_label()
            );
            running.push((next, child));
            next += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut still = Vec::new();
        for (i, mut child) in running {
            match child.try_wait()? {
                None => still.push((i, child)),
                Some(status) => {
                    let json: Option<serde_json::Value> =
                        std::fs::read_to_string(dir.path().join(format!("{i}.json")))
                            .ok()
                            .and_then(|text| serde_json::from_str(text.trim()).ok());
                    eprintln!("{}", cell_row(&cells[i], json.as_ref()));
                    results[i] = Some((status.success(), json));
                }
            }
        }
        running = still;
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!(
        "checker matrix at {commit}: {} processes × {} tasks on {} keys, {} s a cell, {} at a time (took {:.0} s)\n",
        o.cell.processes,
        o.cell.tasks,
        o.cell.keys,
        o.cell.seconds,
        o.parallel,
        started.elapsed().as_secs_f64()
    );
    println!("{HEADER}");
    let mut all_held = true;
    let mut objects = String::new();
    for (cell, result) in cells.iter().zip(results) {
        let (held, json) = result.unwrap_or_default();
        all_held &= held;
        println!("{}", cell_row(cell, json.as_ref()));
        if let Some(json) = json {
            objects.push_str(&format!("{json}\n"));
        }
    }
    if let Some(path) = &o.json {
        std::fs::write(path, objects)?;
    }
    Ok(all_held)
}
