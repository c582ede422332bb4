//! `#[distributed_lock]` on methods of `#[async_trait]` impls, as tonic services are written.
//!
//! `#[async_trait]` sits on the impl, so it expands before the method's own attributes: the lock
//! attribute sees a fn returning `Pin<Box<dyn Future + Send>>` whose body is
//! `Box::pin(async move { … })`, and guards the method's body inside it. These tests call the
//! service through `Arc<dyn Orders>`, as a tonic server does, on the in-memory client.
#![deny(warnings)]
#![warn(clippy::pedantic)]

use std::sync::Arc;

use async_trait::async_trait;
use lock_runtime::{distributed_lock, LockClient, LockError};
use tokio::sync::Notify;

/// tonic's `Status`, reduced to what the tests look at.
#[derive(Debug, PartialEq)]
struct Status {
    code: Code,
    message: String,
}

#[derive(Debug, PartialEq)]
enum Code {
    Aborted,
    Unavailable,
    InvalidArgument,
}

impl From<LockError> for Status {
    fn from(e: LockError) -> Self {
        let code = match e {
            LockError::Busy { .. } | LockError::Lost { .. } => Code::Aborted,
            _ => Code::Unavailable,
        };
        Status {
            code,
            message: e.to_string(),
        }
    }
}

/// A shipment, taken apart by a pattern in the parameter list.
struct Shipment {
    id: u64,
    region: &'static str,
}

#[async_trait]
trait Orders: Send + Sync + 'static {
    async fn pay(&self, id: u64) -> Result<String, Status>;
    async fn refund(&self, id: u64, cents: i64) -> Result<String, Status>;
    async fn ship(&self, shipment: Shipment) -> Result<String, Status>;
    async fn close(self: Arc<Self>, day: u32) -> Result<String, Status>;
    async fn traced(&self, order: (u64, &'static str)) -> Result<bool, Status>;
    async fn traced_inside(&self, id: u64) -> Result<bool, Status>;
}

struct OrderService {
    name: &'static str,
    locks: LockClient,
    /// Told when `pay` is inside its lock; `pay` leaves when told to.
    entered: Notify,
    leave: Notify,
}

fn held(key: &str) -> bool {
    lock_runtime::current().is_some_and(|lock| lock.key() == key)
}

#[async_trait]
impl Orders for OrderService {
    #[distributed_lock(key = "order:<id>", client = self.locks)]
    async fn pay(&self, id: u64) -> Result<String, Status> {
        assert!(held(&format!("order:{id}")));
        self.entered.notify_one();
        self.leave.notified().await;
        Ok(format!("paid {id}"))
    }

    /// `?` and an early `return` inside the guarded body.
    #[distributed_lock(key = "order:<id>", client = self.locks, wait_ms = 5000)]
    async fn refund(&self, id: u64, cents: i64) -> Result<String, Status> {
        let cents = u64::try_from(cents).map_err(|e| Status {
            code: Code::InvalidArgument,
            message: e.to_string(),
        })?;
        if cents == 0 {
            return Ok(format!("nothing to refund on {id}"));
        }
        assert!(self.locks.is_locked(&format!("order:{id}")).await?);
        Ok(format!("refunded {cents} on {id}"))
    }

    /// Names bound by a pattern, which `#[async_trait]` moves to a local of its own.
    #[distributed_lock(key = "ship:<region>:<id>", client = self.locks)]
    async fn ship(&self, Shipment { id, region }: Shipment) -> Result<String, Status> {
        assert!(held(&format!("ship:{region}:{id}")));
        Ok(format!("shipped {id} to {region}"))
    }

    /// A receiver taken by value, which `#[async_trait]` moves into `__self` before the body.
    #[distributed_lock(key = "close:<self.name>:<day>", client = self.locks)]
    async fn close(self: Arc<Self>, day: u32) -> Result<String, Status> {
        assert!(held(&format!("close:{}:{day}", self.name)));
        Ok(format!("{} closed day {day}", self.name))
    }

    /// Stacked under `#[tracing::instrument]`, which rewrites `#[async_trait]`'s output first: the
    /// body is found inside it, with the names bound by a pattern.
    #[tracing::instrument(skip(self))]
    #[distributed_lock(key = "traced:<region>:<id>", client = self.locks)]
    async fn traced(&self, (id, region): (u64, &'static str)) -> Result<bool, Status> {
        Ok(held(&format!("traced:{region}:{id}")))
    }

    /// Stacked over `#[tracing::instrument]`: the lock is taken inside the span.
    #[distributed_lock(key = "traced:<id>", client = self.locks)]
    #[tracing::instrument(skip(self))]
    async fn traced_inside(&self, id: u64) -> Result<bool, Status> {
        Ok(held(&format!("traced:{id}")))
    }
}

fn service(locks: &LockClient) -> Arc<OrderService> {
    Arc::new(OrderService {
        name: "eu",
        locks: locks.clone(),
        entered: Notify::new(),
        leave: Notify::new(),
    })
}

#[tokio::test]
async fn a_second_call_with_the_key_held_gets_the_busy_error_as_its_status() {
    let locks = LockClient::in_memory();
    let concrete = service(&locks);
    let orders: Arc<dyn Orders> = concrete.clone();
    let first = tokio::spawn({
        let orders = Arc::clone(&orders);
        async move { orders.pay(7).await }
    });
    concrete.entered.notified().await;
    assert!(locks.is_locked("order:7").await.unwrap());

    let second = orders.pay(7).await.unwrap_err();
    assert_eq!(second.code, Code::Aborted, "{second:?}");
    assert!(second.message.contains("order:7"), "{second:?}");
    // Another key is another lock.
    assert_eq!(orders.refund(8, 5).await.unwrap(), "refunded 5 on 8");

    concrete.leave.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), "paid 7");
    assert!(
        !locks.is_locked("order:7").await.unwrap(),
        "released before the call returned"
    );
}

#[tokio::test]
async fn every_exit_of_the_body_releases() {
    let locks = LockClient::in_memory();
    let orders: Arc<dyn Orders> = service(&locks);
    assert_eq!(orders.refund(1, 250).await.unwrap(), "refunded 250 on 1");
    assert_eq!(orders.refund(2, 0).await.unwrap(), "nothing to refund on 2");
    let bad = orders.refund(3, -1).await.unwrap_err();
    assert_eq!(bad.code, Code::InvalidArgument);
    for id in 1..=3 {
        assert!(!locks.is_locked(&format!("order:{id}")).await.unwrap());
    }
}

#[tokio::test]
async fn patterns_and_receivers_by_value_name_the_key() {
    let locks = LockClient::in_memory();
    let orders: Arc<dyn Orders> = service(&locks);
    let shipped = orders.ship(Shipment { id: 4, region: "eu" }).await.unwrap();
    assert_eq!(shipped, "shipped 4 to eu");
    assert_eq!(orders.clone().close(12).await.unwrap(), "eu closed day 12");

    let held = locks
        .acquire(
            "close:eu:13",
            &lock_runtime::LockOptions::new(std::time::Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let busy = orders.close(13).await.unwrap_err();
    assert_eq!(busy.code, Code::Aborted, "{busy:?}");
    held.release().await.unwrap();
}

#[tokio::test]
async fn stacks_with_tracing_instrument_in_either_order() {
    let locks = LockClient::in_memory();
    let orders: Arc<dyn Orders> = service(&locks);
    assert!(orders.traced((1, "eu")).await.unwrap());
    assert!(orders.traced_inside(2).await.unwrap());
    assert!(!locks.is_locked("traced:eu:1").await.unwrap());
}

/// The generated future is the `Send` one `#[async_trait]` promises: it can be spawned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_spawn_on_the_multi_thread_runtime() {
    let locks = LockClient::in_memory();
    let orders: Arc<dyn Orders> = service(&locks);
    let calls: Vec<_> = (0..4u64)
        .map(|id| {
            let orders = Arc::clone(&orders);
            tokio::spawn(async move { orders.refund(id + 100, 1).await })
        })
        .collect();
    for (id, call) in (0..4u64).zip(calls) {
        assert_eq!(
            call.await.unwrap().unwrap(),
            format!("refunded 1 on {}", id + 100)
        );
    }
}
