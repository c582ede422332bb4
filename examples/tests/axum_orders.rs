//! The `axum_orders` app over real HTTP on a loopback port: concurrent duplicate requests for one
//! order get one `200` and the rest `409 Conflict`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_get_one_200_and_409s() {
    let server = lock_tests::RedisServer::spawn();
    let locks = lock_tests::connect(&server.url()).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, lock_examples::axum_orders::app(locks)).await });

    const DUPLICATES: usize = 8;
    // Connect all clients first, then send at once: all arrive within the 200 ms payment.
    let mut streams = Vec::new();
    for _ in 0..DUPLICATES {
        streams.push(TcpStream::connect(addr).await.unwrap());
    }
    let go = Arc::new(Barrier::new(DUPLICATES));
    let requests = streams.into_iter().map(|mut stream| {
        let go = go.clone();
        tokio::spawn(async move {
            go.wait().await;
            stream
                .write_all(b"POST /orders/42/pay HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response.split_whitespace().nth(1).unwrap().parse::<u16>().unwrap()
        })
    });
    let mut statuses = Vec::new();
    for request in requests.collect::<Vec<_>>() {
        statuses.push(request.await.unwrap());
    }
    statuses.sort_unstable();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let conflict = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!((ok, conflict), (1, DUPLICATES - 1), "{statuses:?}");
    // The lock was released before the 200 was sent: nothing is left in Redis.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut server.raw().await)
        .await
        .unwrap();
    assert!(keys.is_empty(), "keys left in Redis: {keys:?}");
}
