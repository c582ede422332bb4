//! A `tracing` subscriber that keeps what it writes, for tests of the events a lock emits.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything the subscriber writes.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures every event at `level` or above on this thread until the guard drops.
    pub fn capture(level: tracing::Level) -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .without_time()
            .with_writer({
                let logs = logs.clone();
                move || logs.clone()
            })
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Whether a line at `level` contains `message`.
    pub fn has(&self, level: &str, message: &str) -> bool {
        self.has_all(&[level, message])
    }

    /// Whether one line contains every one of `parts`.
    pub fn has_all(&self, parts: &[&str]) -> bool {
        self.text()
            .lines()
            .any(|line| parts.iter().all(|part| line.contains(part)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
