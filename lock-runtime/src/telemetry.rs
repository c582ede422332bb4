//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`): whatever
//! recorder the application installed (Prometheus, StatsD, …) receives them; without the feature
//! every function here is empty and compiles away.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `lock_acquires_total` | counter | `outcome`, `mode` | acquire calls, by how they ended: `acquired`, `busy`, `not_replicated`, `unavailable`, `refused`, `invalid`, `lost`, `not_configured` |
//! | `lock_acquire_seconds` | histogram | `outcome`, `mode` | the attempt that decided the call, one round trip |
//! | `lock_wait_seconds` | histogram | `outcome`, `mode` | the whole call, waiting included |
//! | `lock_held_seconds` | histogram | `mode` | from acquisition to release |
//! | `lock_lost_total` | counter | `mode` | locks lost while held (gone, taken, or validity ran out) |
//! | `lock_renewals_total` | counter | | locks renewed by the watchdog or `extend` |
//! | `lock_renewal_failures_total` | counter | | renewal requests that failed (the lock is retried while valid) |
//! | `lock_release_failures_total` | counter | | releases that failed (the lock expires at its ttl) |
//!
//! Labels never carry the key (unbounded cardinality); with
//! [`LockClientBuilder::metrics_key_class`](crate::LockClientBuilder::metrics_key_class) every
//! series also gets `key_class`, the key's text before its first `:` (`order:42` → `order`;
//! `-` for a key without one).

use std::time::Duration;

use crate::LockError;

/// What an acquire call's outcome is called in the `outcome` label.
pub(crate) fn outcome<T>(result: &Result<T, LockError>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(e) => failure(e),
    }
}

/// What an acquire call that failed with `e` is called in the `outcome` label.
pub(crate) fn failure(e: &LockError) -> &'static str {
    match e {
        LockError::Busy { .. } => "busy",
        LockError::NotReplicated { .. } => "not_replicated",
        LockError::Unavailable { .. } => "unavailable",
        LockError::Refused { .. } => "refused",
        LockError::Lost { .. } => "lost",
        LockError::NotConfigured => "not_configured",
        _ => "invalid",
    }
}

/// The labels every series of one lock carries.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))] // read only by the recorder calls
pub(crate) struct Labels<'a> {
    pub(crate) mode: &'static str,
    /// The key's class, when the client was asked to label by it.
    pub(crate) key_class: Option<&'a str>,
}

impl<'a> Labels<'a> {
    pub(crate) fn new(shared: bool, key: &'a str, by_class: bool) -> Self {
        Labels {
            mode: if shared { "shared" } else { "exclusive" },
            // A key without `:` has no class: labelling by the key itself would make a series
            // per key.
            key_class: by_class.then(|| key.split_once(':').map_or("-", |(class, _)| class)),
        }
    }
}

#[cfg(feature = "metrics")]
mod on {
    use std::borrow::Cow;

    use metrics::{Key, Label, Level, Metadata};

    use super::*;

    /// Where the series come from, for recorders that filter by it.
    static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// The key of metric `$name` for a mode: a `static`, so its labels and its hash are made at
    /// compile time, not at every acquire and release (with no recorder installed, recording
    /// is all a series costs).
    macro_rules! fixed {
        ($name:literal, $mode:literal) => {{
            static LABELS: [Label; 1] = [Label::from_static_parts("mode", $mode)];
            static KEY: Key = Key::from_static_parts($name, &LABELS);
            &KEY
        }};
    }

    /// The key of metric `$name` for `$labels`: a static one unless it carries the key's class.
    macro_rules! key {
        ($name:literal, $labels:expr) => {{
            let labels: &Labels<'_> = $labels;
            let fixed: &'static Key = if labels.mode == "shared" {
                fixed!($name, "shared")
            } else {
                fixed!($name, "exclusive")
            };
            with_class(fixed, labels.key_class)
        }};
    }

    /// The three series of an acquire call (`lock_acquires_total`, `lock_acquire_seconds`,
    /// `lock_wait_seconds`) labelled `$label`s: statics.
    macro_rules! three {
        ($($label:expr),+) => {{
            static LABELS: &[Label] = &[$($label),+];
            static KEYS: [Key; 3] = [
                Key::from_static_parts("lock_acquires_total", LABELS),
                Key::from_static_parts("lock_acquire_seconds", LABELS),
                Key::from_static_parts("lock_wait_seconds", LABELS),
            ];
            &KEYS
        }};
    }

    /// An acquire call's three series for a mode, one set per outcome `$o`, picked by one match.
    macro_rules! acquire_series {
        ($mode:literal, $outcome:expr, [$($o:literal),*]) => {
            match $outcome {
                $($o => three!(
                    Label::from_static_parts("mode", $mode),
                    Label::from_static_parts("outcome", $o)
                ),)*
                // Every outcome `failure` names is listed: this one only labels the mode.
                _ => three!(Label::from_static_parts("mode", $mode)),
            }
        };
    }

    /// An acquire call's three series for `shared` and `outcome`.
    fn acquire_keys(shared: bool, outcome: &str) -> &'static [Key; 3] {
        macro_rules! by_mode {
            ($mode:literal) => {
                acquire_series!(
                    $mode,
                    outcome,
                    [
                        "acquired",
                        "busy",
                        "not_replicated",
                        "unavailable",
                        "refused",
                        "invalid",
                        "lost",
                        "not_configured"
                    ]
                )
            };
        }
        if shared {
            by_mode!("shared")
        } else {
            by_mode!("exclusive")
        }
    }

    /// `fixed`, or with the `key_class` label added.
    fn with_class(fixed: &'static Key, class: Option<&str>) -> Cow<'static, Key> {
        match class {
            None => Cow::Borrowed(fixed),
            Some(class) => {
                Cow::Owned(fixed.with_extra_labels(vec![Label::new("key_class", class.to_owned())]))
            }
        }
    }

    pub(crate) fn acquire(l: &Labels<'_>, outcome: &'static str, attempt: Duration, call: Duration) {
        let [calls, attempts, waits] = acquire_keys(l.mode == "shared", outcome);
        let record = |calls: &Key, attempts: &Key, waits: &Key| {
            metrics::with_recorder(|r| {
                r.register_counter(calls, &METADATA).increment(1);
                r.register_histogram(attempts, &METADATA)
                    .record(attempt.as_secs_f64());
                r.register_histogram(waits, &METADATA).record(call.as_secs_f64());
            });
        };
        match l.key_class {
            None => record(calls, attempts, waits),
            Some(class) => {
                let [calls, attempts, waits] = [calls, attempts, waits].map(|k| with_class(k, Some(class)));
                record(&calls, &attempts, &waits);
            }
        }
    }

    pub(crate) fn released(l: &Labels<'_>, held: Duration) {
        let key = key!("lock_held_seconds", l);
        metrics::with_recorder(|r| r.register_histogram(&key, &METADATA).record(held.as_secs_f64()));
    }

    pub(crate) fn lost(l: &Labels<'_>) {
        let key = key!("lock_lost_total", l);
        metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
    }

    pub(crate) fn renewed(locks: u64) {
        metrics::counter!("lock_renewals_total").increment(locks);
    }

    pub(crate) fn renewal_failed() {
        metrics::counter!("lock_renewal_failures_total").increment(1);
    }

    pub(crate) fn release_failed() {
        metrics::counter!("lock_release_failures_total").increment(1);
    }

    pub(crate) fn release_given_up() {
        metrics::counter!("lock_releases_given_up_total").increment(1);
    }

    pub(crate) fn nap_ended(store: &'static str) {
        metrics::counter!("lock_wait_naps_total", "store" => store).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use super::*;

    pub(crate) fn acquire(_: &Labels<'_>, _: &'static str, _: Duration, _: Duration) {}
    pub(crate) fn released(_: &Labels<'_>, _: Duration) {}
    pub(crate) fn lost(_: &Labels<'_>) {}
    pub(crate) fn renewed(_: u64) {}
    pub(crate) fn renewal_failed() {}
    pub(crate) fn release_failed() {}
    pub(crate) fn release_given_up() {}
    pub(crate) fn nap_ended(_: &'static str) {}
}

pub(crate) use on::{
    acquire, lost, nap_ended, release_failed, release_given_up, released, renewal_failed, renewed,
};
