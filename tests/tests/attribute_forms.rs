//! The shapes of fn `#[distributed_lock]` accepts: methods, generics, borrowed and `impl Trait`
//! arguments, patterns, trait impls, other attributes, and futures that must be `Send`.
#![deny(warnings)]
#![warn(clippy::pedantic)]

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError, LockOptions};
use lock_tests::Target;

struct Orders {
    locks: LockClient,
    paid: Vec<u64>,
}

impl Orders {
    #[distributed_lock(key = "order:<id>", client = self.locks)]
    async fn is_held(&self, id: u64) -> Result<bool, LockError> {
        self.locks.is_locked(&format!("order:{id}")).await
    }

    #[distributed_lock(key = "order:<id>", client = self.locks)]
    async fn pay(&mut self, id: u64) -> Result<usize, LockError> {
        self.paid.push(id);
        Ok(self.paid.len())
    }
}

#[derive(Debug)]
struct Customer {
    id: u32,
    region: (&'static str, u8),
}

struct Order {
    id: u64,
    customer: Customer,
}

/// Field paths and tuple indexes in the key.
#[distributed_lock(key = "customer:<order.customer.id>:<order.customer.region.0>:<order.id>", client = locks)]
async fn by_customer(locks: &LockClient, order: &Order) -> Result<bool, LockError> {
    locks.is_locked("customer:9:eu:5").await
}

/// Generic over the key's type, with an `impl Trait` argument.
#[distributed_lock(key = "item:<id>", client = locks)]
async fn generic<K: Display + Send + Sync>(
    locks: &LockClient,
    id: K,
    label: impl AsRef<str> + Send,
) -> Result<String, LockError> {
    let held = locks.is_locked(&format!("item:{id}")).await?;
    Ok(format!("{}:{held}", label.as_ref()))
}

/// Borrowed `&str` argument and a tuple pattern.
#[distributed_lock(key = "pair:<name>:<a>-<b>", client = locks)]
async fn patterns(locks: &LockClient, name: &str, (a, b): (u8, u8)) -> Result<bool, LockError> {
    locks.is_locked(&format!("pair:{name}:{a}-{b}")).await
}

struct Wrapper<T>(T);

/// A name bound inside a tuple-struct pattern, as axum's `Path(id): Path<u64>`.
#[distributed_lock(key = "wrapped:<inner>", client = locks)]
async fn destructured(locks: &LockClient, Wrapper(inner): Wrapper<u64>) -> Result<bool, LockError> {
    locks.is_locked(&format!("wrapped:{inner}")).await
}

/// A client behind an `Arc`, and anyhow as the error type.
#[distributed_lock(key = "anyhow", client = state)]
async fn with_anyhow(state: Arc<LockClient>) -> anyhow::Result<bool> {
    Ok(state.is_locked("anyhow").await?)
}

/// Boxed errors work too.
#[distributed_lock(key = "boxed", client = locks)]
async fn with_box(locks: &LockClient) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    Err("declined".into())
}

trait Job {
    async fn run(&self, locks: &LockClient) -> Result<&'static str, LockError>;
}

struct Nightly;

impl Job for Nightly {
    #[distributed_lock(key = "job:nightly", client = locks)]
    async fn run(&self, locks: &LockClient) -> Result<&'static str, LockError> {
        Ok(if locks.is_locked("job:nightly").await? {
            "held"
        } else {
            "free"
        })
    }
}

/// Stacked with `#[tracing::instrument]`, in either order.
#[tracing::instrument(skip(locks))]
#[distributed_lock(key = "traced:<id>", client = locks)]
async fn traced(locks: &LockClient, id: u8) -> Result<u8, LockError> {
    Ok(id)
}

#[distributed_lock(key = "traced2:<id>", client = locks)]
#[tracing::instrument(skip(locks))]
async fn traced_inside(locks: &LockClient, id: u8) -> Result<u8, LockError> {
    Ok(id)
}

/// `#[must_use]` and docs survive.
#[must_use = "the result says whether it ran"]
#[distributed_lock(key = "must", client = locks)]
async fn must_use(locks: &LockClient) -> Result<(), LockError> {
    Ok(())
}

/// A one-line body on the signature's line: no `unused_braces` from the generated code.
#[rustfmt::skip]
#[distributed_lock(key = "one", client = locks)]
async fn one_liner(locks: &LockClient) -> Result<u8, LockError> { Ok(1) }

/// Owned arguments moved into the body after the key is rendered from them.
#[distributed_lock(key = "owned:<name>", client = locks)]
async fn owned(locks: &LockClient, name: String) -> Result<String, LockError> {
    Ok(name)
}

/// Fair waiting, from the attribute.
#[distributed_lock(key = "fair:<n>", client = locks, fair, wait_ms = 1000)]
async fn fair(locks: &LockClient, n: u8) -> Result<bool, LockError> {
    locks.is_locked(&format!("fair:{n}")).await
}

/// Durations from code: consts and expressions.
const TTL: Duration = Duration::from_secs(5);
const HOLD: Duration = Duration::from_millis(200);

#[distributed_lock(key = "configured", client = locks, ttl = TTL, wait = Duration::from_millis(100), hold_at_least = HOLD, watchdog)]
async fn configured(locks: &LockClient) -> Result<Option<Duration>, LockError> {
    locks.remaining_ttl("configured").await
}

/// A whole `LockOptions` from the caller's configuration, owned or borrowed.
struct Jobs {
    locks: LockClient,
    options: LockOptions,
}

impl Jobs {
    #[distributed_lock(key = "job:<name>", client = self.locks, options = &self.options)]
    async fn run(&self, name: &str) -> Result<bool, LockError> {
        self.locks.is_locked(&format!("job:{name}")).await
    }

    #[distributed_lock(key = "job:<name>", client = self.locks, options = self.options.clone().fencing(true))]
    async fn fenced(&self, name: &str) -> Result<Option<u64>, LockError> {
        Ok(lock_runtime::current().and_then(|l| l.fencing_token()))
    }
}

/// A key with literal braces.
#[distributed_lock(key = "{odd}:<n>", client = locks)]
async fn braces(locks: &LockClient, n: u8) -> Result<bool, LockError> {
    locks.is_locked(&format!("{{odd}}:{n}")).await
}

/// `write`: an exclusive lock, said explicitly (the default).
#[distributed_lock(key = "prices:<region>", client = locks, write, watchdog)]
async fn write_prices(locks: &LockClient, region: &str) -> Result<bool, LockError> {
    locks.is_locked(&format!("prices:{region}")).await
}

/// `read`: a shared lock.
#[distributed_lock(key = "prices:<region>", client = locks, read, ttl_ms = 5000)]
async fn read_prices(locks: &LockClient, region: &str) -> Result<String, LockError> {
    Ok(lock_runtime::current()
        .map(|lock| lock.key().to_owned())
        .unwrap_or_default())
}

#[tokio::test]
async fn a_read_lock_runs_its_body() {
    let locks = LockClient::in_memory();
    assert_eq!(read_prices(&locks, "eu").await.unwrap(), "prices:eu");
    // While another reader holds a share, `read` gets in (an exclusive lock would be busy, and
    // neither fn waits) and `write` does not.
    let other_reader = lock_runtime::LockOptions::new(std::time::Duration::from_secs(5))
        .mode(lock_runtime::LockMode::Shared);
    let share = locks.acquire("prices:eu", &other_reader).await.unwrap();
    assert_eq!(read_prices(&locks, "eu").await.unwrap(), "prices:eu");
    assert!(matches!(
        write_prices(&locks, "eu").await,
        Err(LockError::Busy { .. })
    ));
    share.release().await.unwrap();
}

async fn every_form_runs_guarded(t: Target) {
    let locks = t.client();
    let mut orders = Orders {
        locks: locks.clone(),
        paid: Vec::new(),
    };
    assert!(orders.is_held(1).await.unwrap());
    assert_eq!(orders.pay(1).await.unwrap(), 1);
    let order = Order {
        id: 5,
        customer: Customer {
            id: 9,
            region: ("eu", 1),
        },
    };
    assert!(by_customer(&locks, &order).await.unwrap());
    assert_eq!(generic(&locks, 12u32, "label").await.unwrap(), "label:true");
    assert!(patterns(&locks, "x", (1, 2)).await.unwrap());
    assert!(destructured(&locks, Wrapper(3)).await.unwrap());
    assert!(with_anyhow(Arc::new(locks.clone())).await.unwrap());
    assert_eq!(with_box(&locks).await.unwrap_err().to_string(), "declined");
    assert_eq!(Nightly.run(&locks).await.unwrap(), "held");
    assert_eq!(traced(&locks, 4).await.unwrap(), 4);
    assert_eq!(traced_inside(&locks, 5).await.unwrap(), 5);
    must_use(&locks).await.unwrap();
    assert_eq!(one_liner(&locks).await.unwrap(), 1);
    assert_eq!(owned(&locks, "ann".to_owned()).await.unwrap(), "ann");
    assert!(braces(&locks, 1).await.unwrap());
    assert!(fair(&locks, 2).await.unwrap());
    assert!(write_prices(&locks, "us").await.unwrap());
    let left = configured(&locks).await.unwrap().unwrap();
    assert!(
        left > Duration::from_secs(4) && left <= TTL,
        "ttl = TTL: {left:?}"
    );
    assert!(
        locks.is_locked("configured").await.unwrap(),
        "hold_at_least = HOLD keeps it"
    );
    let jobs = Jobs {
        locks: locks.clone(),
        options: LockOptions::new(Duration::from_secs(5)),
    };
    assert!(jobs.run("a").await.unwrap());
    assert!(jobs.fenced("b").await.unwrap().is_some());
    for key in [
        "order:1",
        "customer:9:eu:5",
        "item:12",
        "must",
        "{odd}:1",
        "fair:2",
        "prices:us",
    ] {
        assert!(!locks.is_locked(key).await.unwrap(), "{key} left held");
    }
}

async fn busy_converts_into_the_fns_error(t: Target) {
    let locks = t.client();
    let held = locks
        .acquire(
            "anyhow",
            &lock_runtime::LockOptions::new(std::time::Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let err = with_anyhow(Arc::new(locks.clone())).await.unwrap_err();
    assert!(
        matches!(err.downcast_ref::<LockError>(), Some(LockError::Busy { .. })),
        "{err:?}"
    );
    held.release().await.unwrap();
}

fn require_send<T: Send>(t: T) -> T {
    t
}

async fn generated_futures_are_send(t: Target) {
    let locks = t.client();
    let spawned = tokio::spawn({
        let locks = locks.clone();
        async move { owned(&locks, "spawned".to_owned()).await }
    });
    assert_eq!(spawned.await.unwrap().unwrap(), "spawned");
    assert_eq!(require_send(generic(&locks, 1u8, "x")).await.unwrap(), "x:true");
    let orders = Orders {
        locks: locks.clone(),
        paid: vec![],
    };
    assert_eq!(require_send(orders.pay_owned()).await.unwrap(), 1);
}

impl Orders {
    async fn pay_owned(mut self) -> Result<usize, LockError> {
        self.pay(2).await
    }
}

lock_tests::on_both_backends!(
    every_form_runs_guarded,
    busy_converts_into_the_fns_error,
    generated_futures_are_send
);
