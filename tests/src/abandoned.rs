//! [`a_late_attempt_is_given_back`]: an acquire given up on that reaches the store after its
//! release, on the stores whose release can overtake it (a pool's other connection).

use lock_runtime::{LockClient, LockError};

use crate::{holds_within, ttl, FaultProxy, SECOND};

/// How long the proxy holds the attempt back: past the client's response timeout (3 s in the
/// tests that call this), so its release, sent when the client gives up, goes first.
const HELD_BACK: std::time::Duration = std::time::Duration::from_secs(5);

/// Makes an acquire of `client` (whose connections go through `proxy`, with a response timeout
/// shorter than 5 s) reach the store after its release: the proxy holds the attempt back while
/// the release goes straight, finds nothing, and the attempt then takes the key. Asserts that
/// the key is given back (the release sent again once the attempt has ended), not held for
/// nobody until its ttl. Up to 5 rounds, each on a key of its own, until one attempt lands.
pub async fn a_late_attempt_is_given_back(client: &LockClient, proxy: &FaultProxy) {
    for round in 0..5 {
        let key = format!("late:{round}");
        // The pool's connections, handed out in turn, have the attempt's statement prepared
        // (one not prepared yet is prepared first, a round trip the proxy would hold back, and
        // the attempt would never be sent: another round).
        let mut warmed = 0;
        while warmed <= proxy.accepted() {
            let guard = client.acquire(&key, &ttl(60_000)).await.unwrap();
            assert!(guard.release().await.unwrap());
            warmed += 1;
        }
        // Held back once the proxy has read more than a ping's few bytes (a connection going
        // back to the pool pings it) since the delay began.
        let before = proxy.sent();
        proxy.delay(HELD_BACK);
        let acquiring = tokio::spawn({
            let (client, key) = (client.clone(), key.clone());
            async move { client.acquire(&key, &ttl(60_000)).await }
        });
        let sent = holds_within(10 * SECOND, || async { proxy.sent() > before + 16 }).await;
        assert!(sent, "the attempt left the client");
        proxy.relay();
        match acquiring.await.unwrap() {
            Err(LockError::Unavailable { .. }) => {}
            // Sent before the delay (what the proxy saw was a connection going back to the
            // pool, a ping of a few bytes): another round.
            Ok(guard) => {
                assert!(guard.release().await.unwrap());
                continue;
            }
            answer => panic!("{answer:?}"),
        }
        // Sent whole, the attempt lands 5 s after it left, after its release found nothing,
        // and takes the key. (Sent on a connection still being opened or handed back, whose
        // round trips the proxy held back, it never ran: another round.)
        if holds_within(8 * SECOND, || async { client.is_locked(&key).await.unwrap() }).await {
            let freed = holds_within(20 * SECOND, || async { !client.is_locked(&key).await.unwrap() }).await;
            assert!(freed, "{key} is still held, for nobody");
            return;
        }
    }
    panic!("no attempt held back landed in 5 rounds");
}
