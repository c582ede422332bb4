//! A client's long-lived background task (the watchdog, the wake-up subscriber's upkeep and
//! reader, Sentinel's failover follower), started on the runtime that first needs it and started
//! again when that runtime has gone: a client kept in a `static`, or set as the default client,
//! outlives the runtime of each `#[tokio::test]` that uses it.

use std::future::Future;
use std::sync::Mutex;

use tokio::task::AbortHandle;

/// At most one running task; see the module doc.
#[derive(Debug, Default)]
pub(crate) struct Background(Mutex<Option<AbortHandle>>);

impl Background {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<AbortHandle>> {
        // Every update is one step, so a poisoned slot is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the task runs: started, not stopped, and not ended (a task ends with its runtime).
    pub(crate) fn is_running(&self) -> bool {
        self.slot().as_ref().is_some_and(|task| !task.is_finished())
    }

    /// Spawns `start()` on the current runtime unless the task runs; `true` if it did.
    pub(crate) fn ensure<F>(&self, start: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|task| !task.is_finished()) {
            return false;
        }
        *slot = Some(tokio::spawn(start()).abort_handle());
        true
    }

    /// Replaces the task with `start()` (aborting the one that runs, if any).
    pub(crate) fn replace<F>(&self, start: impl FnOnce() -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let task = tokio::spawn(start()).abort_handle();
        if let Some(old) = self.slot().replace(task) {
            old.abort();
        }
    }

    /// Aborts the task, if one runs.
    pub(crate) fn stop(&self) {
        if let Some(task) = self.slot().take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_that_died_with_its_runtime_is_started_again() {
        let task = Background::default();
        let runtime = |()| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        };
        let first = runtime(()).unwrap_or_else(|e| panic!("{e}"));
        first.block_on(async {
            assert!(task.ensure(std::future::pending));
            assert!(!task.ensure(std::future::pending), "started twice");
            assert!(task.is_running());
        });
        drop(first);
        assert!(!task.is_running(), "the task ended with its runtime");
        let second = runtime(()).unwrap_or_else(|e| panic!("{e}"));
        second.block_on(async {
            assert!(task.ensure(std::future::pending));
            task.stop();
            assert!(!task.is_running());
        });
    }
}
