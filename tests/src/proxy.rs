//! [`FaultProxy`]: a TCP proxy on loopback that a test puts between a Redis client and a
//! `redis-server`, to make the network between them slow, silent or reset on demand.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// How long a caller waits for the proxy thread to carry out [`FaultProxy::blackhole_existing`]
/// or [`FaultProxy::reset_all`] before deciding the proxy is broken.
const COMMAND_DEADLINE: Duration = Duration::from_secs(10);

/// A TCP fault proxy: listens on `127.0.0.1:<port>` and relays every connection it accepts to
/// `127.0.0.1:<upstream_port>`, faithfully or with a fault.
///
/// It runs on its own thread with its own single-threaded Tokio runtime, so it works the same
/// under any runtime flavour of the test, and from a plain `#[test]`. Dropping it stops that
/// thread and closes the listener and every connection it holds (an orderly close, not a
/// reset), before `drop` returns.
///
/// The mode ([`relay`](Self::relay), [`delay`](Self::delay), [`blackhole`](Self::blackhole))
/// applies at once to the connections already open and to the ones accepted later; it is
/// looked at for every chunk of bytes as it is read, and again just before the chunk is
/// written on. [`blackhole_existing`](Self::blackhole_existing) and
/// [`reset_all`](Self::reset_all) act on the connections open at the time of the call and
/// have finished when they return, so a test needs no sleep after any of these calls.
///
/// Each accepted connection gets its own upstream connection, opened right after the accept
/// (in every mode). When the upstream connection cannot be opened (the server is down), the
/// client connection is reset.
///
/// Outside a blackhole, an end of stream from one side is passed on to the other as an end of
/// stream (after the data before it), and a failed read or write on either side (a reset, for
/// one) closes both sides with a reset. While a connection is silent (blackholed), neither is
/// passed on: its sockets stay open until [`reset_all`](Self::reset_all) or the drop of the
/// proxy, as when a firewall drops the flow.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    commands: Option<mpsc::UnboundedSender<(Command, std_mpsc::Sender<()>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port, relaying to `127.0.0.1:<upstream_port>`.
    ///
    /// Returns once the listener is bound: a client may connect right away. The upstream is
    /// not contacted until a client connects.
    pub fn start(upstream_port: u16) -> FaultProxy {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("fault proxy: cannot bind 127.0.0.1:0: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("fault proxy: cannot make the listener non-blocking: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fault proxy: no local address: {e}"))
            .port();
        // A second handle on the same listening socket, to take every connection still waiting
        // in the backlog, synchronously, before a command applies to "the current ones".
        let backlog = listener
            .try_clone()
            .unwrap_or_else(|e| panic!("fault proxy: cannot clone the listener: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("fault proxy: cannot build a Tokio runtime: {e}"));
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Relay),
            accepted: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            sent: AtomicUsize::new(0),
            silence_new: AtomicBool::new(false),
        });
        let (commands, command_rx) = mpsc::unbounded_channel();
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port));
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{port}"))
            .spawn(move || {
                runtime.block_on(serve(listener, backlog, upstream, thread_shared, command_rx));
            })
            .unwrap_or_else(|e| panic!("fault proxy: cannot start its thread: {e}"));
        FaultProxy {
            port,
            shared,
            commands: Some(commands),
            thread: Some(thread),
        }
    }

    /// The loopback port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`, the URL a Redis client uses to go through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// How many client connections the proxy has accepted since it started, whatever became of
    /// them: a count that went up shows a client opened a new connection.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// How many bytes the proxy has thrown away, both directions and all connections together,
    /// because they were read on a silent connection (see [`blackhole`](Self::blackhole) and
    /// [`blackhole_existing`](Self::blackhole_existing)) or were still held back by
    /// [`delay`](Self::delay) when it went silent. A test waits for it to grow to know that a
    /// request has reached the proxy and will never be delivered.
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// How many bytes the proxy has read from clients so far, whatever it did with them
    /// (relayed, held back by [`delay`](Self::delay), dropped): a test sees that a request
    /// left its client (and, delayed, when it is due).
    pub fn sent(&self) -> usize {
        self.shared.sent.load(Ordering::SeqCst)
    }

    /// Normal mode: every byte is relayed as soon as it is read, both ways (the initial mode).
    /// Connections silenced by [`blackhole_existing`](Self::blackhole_existing) stay silent.
    pub fn relay(&self) {
        self.set_mode(Mode::Relay);
    }

    /// Delay mode: every chunk read, either way, is forwarded `by` after it was read, so a
    /// request/response round trip takes at least twice `by`. Order is kept: a chunk is never
    /// forwarded before one read earlier, so after a switch to a shorter delay (or to
    /// [`relay`](Self::relay)) new chunks may wait for the older, longer-delayed ones.
    pub fn delay(&self, by: Duration) {
        self.set_mode(Mode::Delay(by));
    }

    /// Blackhole mode: every socket stays open and new connections are still accepted, but
    /// nothing is relayed in either direction, ends of stream and resets included. Bytes read
    /// in this mode, and bytes held back by [`delay`](Self::delay) that fall due in it, are
    /// dropped (see [`dropped`](Self::dropped)), never delivered later; after [`relay`](Self::relay), a connection carries only what is read
    /// from then on. Note that a client that sent a request into the blackhole waits for its
    /// answer forever.
    pub fn blackhole(&self) {
        self.set_mode(Mode::Blackhole);
    }

    /// Drop-answers mode: what clients send is relayed, what the server answers is dropped (see
    /// [`dropped`](Self::dropped)): a request is applied and its answer lost. A connection
    /// carries a broken stream afterwards; [`reset_all`](Self::reset_all) ends it.
    pub fn drop_answers(&self) {
        self.set_mode(Mode::DropAnswers);
    }

    /// Silences, for good, every connection open at the time of the call (including any that a
    /// client has opened but the proxy had not yet accepted): its sockets stay open and nothing
    /// more is relayed on it, in either direction, whatever the mode later. Connections accepted
    /// afterwards follow the mode ([`relay`](Self::relay) unless changed), so a client recovers
    /// only by opening a new connection. Simulates a connection that goes silent without a
    /// reset, as when a firewall drops the flow. Only [`reset_all`](Self::reset_all) or the drop
    /// of the proxy closes a silenced connection.
    pub fn blackhole_existing(&self) {
        self.command(Command::BlackholeExisting);
    }

    /// Closes every connection open at the time of the call (including any that a client has
    /// opened but the proxy had not yet accepted) abruptly, with a TCP RST (`SO_LINGER` 0), on
    /// the client side and on the upstream side; silenced connections too. When it returns,
    /// the sockets are closed. The proxy keeps accepting: new connections work as before.
    pub fn reset_all(&self) {
        self.command(Command::ResetAll);
    }

    /// While `on`, every connection accepted is silenced from the start, as
    /// [`blackhole_existing`](Self::blackhole_existing) would silence it, whatever the mode;
    /// the connections open before keep following the mode. Simulates a path on which new
    /// connections hang (a connection-tracking table that is full, a host half gone) while
    /// established ones work.
    pub fn silence_new(&self, on: bool) {
        self.shared.silence_new.store(on, Ordering::SeqCst);
    }

    fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    /// Has the proxy thread carry out `command` and waits until it has.
    fn command(&self, command: Command) {
        let (done, finished) = std_mpsc::channel();
        let sent = self
            .commands
            .as_ref()
            .is_some_and(|commands| commands.send((command, done)).is_ok());
        assert!(sent, "fault proxy on port {}: its thread is gone", self.port);
        if let Err(e) = finished.recv_timeout(COMMAND_DEADLINE) {
            panic!(
                "fault proxy on port {}: {command:?} not done within {COMMAND_DEADLINE:?}: {e}",
                self.port
            );
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Closing the command channel ends the accept loop; the runtime, dropped at the end of
        // the thread, drops every connection task and so closes their sockets.
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Relay,
    Delay(Duration),
    Blackhole,
    DropAnswers,
}

#[derive(Debug)]
struct Shared {
    mode: Mutex<Mode>,
    accepted: AtomicUsize,
    dropped: AtomicUsize,
    /// See [`FaultProxy::sent`].
    sent: AtomicUsize,
    /// See [`FaultProxy::silence_new`].
    silence_new: AtomicBool,
}

impl Shared {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Clone, Copy)]
enum Command {
    BlackholeExisting,
    ResetAll,
}

/// The proxy thread's side of one accepted connection.
struct Conn {
    silenced: Arc<AtomicBool>,
    reset: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// The accept loop, until the [`FaultProxy`] is dropped.
async fn serve(
    listener: std::net::TcpListener,
    backlog: std::net::TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<(Command, std_mpsc::Sender<()>)>,
) {
    let listener = TcpListener::from_std(listener)
        .unwrap_or_else(|e| panic!("fault proxy: cannot register the listener: {e}"));
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    conns.retain(|conn| !conn.task.is_finished());
                    conns.push(spawn_conn(client, upstream, &shared));
                }
                // Out of file descriptors, an aborted handshake: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            command = commands.recv() => {
                let Some((command, done)) = command else { break };
                // The connections a client has opened but the loop has not yet accepted are
                // current connections too: take them now, so the command applies to them.
                while let Ok((client, _)) = backlog.accept() {
                    let client = client
                        .set_nonblocking(true)
                        .and_then(|()| TcpStream::from_std(client));
                    if let Ok(client) = client {
                        conns.push(spawn_conn(client, upstream, &shared));
                    }
                }
                conns.retain(|conn| !conn.task.is_finished());
                match command {
                    Command::BlackholeExisting => {
                        for conn in &conns {
                            conn.silenced.store(true, Ordering::SeqCst);
                        }
                    }
                    Command::ResetAll => {
                        for conn in conns.drain(..) {
                            let _ = conn.reset.send(());
                            let _ = conn.task.await;
                        }
                    }
                }
                let _ = done.send(());
            }
        }
    }
}

fn spawn_conn(client: TcpStream, upstream: SocketAddr, shared: &Arc<Shared>) -> Conn {
    shared.accepted.fetch_add(1, Ordering::SeqCst);
    let silenced = Arc::new(AtomicBool::new(shared.silence_new.load(Ordering::SeqCst)));
    let (reset, reset_rx) = oneshot::channel();
    let ctl = Ctl {
        shared: Arc::clone(shared),
        silenced: Arc::clone(&silenced),
    };
    let task = tokio::spawn(run_conn(client, upstream, ctl, reset_rx));
    Conn {
        silenced,
        reset,
        task,
    }
}

/// What one connection looks at for each chunk: the proxy's mode and its own silence.
struct Ctl {
    shared: Arc<Shared>,
    silenced: Arc<AtomicBool>,
}

impl Ctl {
    /// Whether nothing is passed on (`answers`: from the server to the client).
    fn silent(&self, answers: bool) -> bool {
        let mode = self.shared.mode();
        self.silenced.load(Ordering::SeqCst)
            || mode == Mode::Blackhole
            || (answers && mode == Mode::DropAnswers)
    }

    fn count_dropped(&self, bytes: usize) {
        self.shared.dropped.fetch_add(bytes, Ordering::SeqCst);
    }

    fn delay(&self) -> Duration {
        match self.shared.mode() {
            Mode::Delay(by) => by,
            Mode::Relay | Mode::Blackhole | Mode::DropAnswers => Duration::ZERO,
        }
    }
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Both sides closed in order: drop the sockets normally.
    Closed,
    /// Close both sides with a reset.
    Reset,
}

async fn run_conn(mut client: TcpStream, upstream: SocketAddr, ctl: Ctl, mut reset: oneshot::Receiver<()>) {
    let mut server: Option<TcpStream> = None;
    let end = {
        let session = async {
            let Ok(connected) = TcpStream::connect(upstream).await else {
                return End::Reset;
            };
            let server = server.insert(connected);
            match relay(&mut client, server, &ctl).await {
                Some(end) => end,
                // Went quiet in a blackhole: hold the sockets open until reset or shutdown.
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            end = session => end,
            Ok(()) = &mut reset => End::Reset,
        }
    };
    if end == End::Reset {
        abort(client);
        if let Some(server) = server {
            abort(server);
        }
    }
}

/// Closes `stream` with a TCP RST instead of a FIN.
fn abort(stream: TcpStream) {
    // `set_linger` is deprecated because a non-zero linger blocks the thread on drop; a zero
    // linger does not. (`set_zero_linger` needs Tokio 1.50, newer than the workspace requires.)
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// How one direction of a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// The end of stream was passed on.
    Closed,
    /// A read or write failed outside a blackhole.
    Failed,
    /// The stream ended or failed while silent: nothing was passed on.
    Quiet,
}

/// Relays both ways until both directions end (`Some(Closed)`), one fails (`Some(Reset)`),
/// or both are over and one of them went quiet (`None`).
async fn relay(client: &mut TcpStream, server: &mut TcpStream, ctl: &Ctl) -> Option<End> {
    let (client_read, client_write) = client.split();
    let (server_read, server_write) = server.split();
    let up = direction(client_read, server_write, ctl, false);
    let down = direction(server_read, client_write, ctl, true);
    tokio::pin!(up, down);
    let (mut up_flow, mut down_flow) = (None, None);
    loop {
        tokio::select! {
            flow = &mut up, if up_flow.is_none() => up_flow = Some(flow),
            flow = &mut down, if down_flow.is_none() => down_flow = Some(flow),
        }
        match (up_flow, down_flow) {
            (Some(Flow::Failed), _) | (_, Some(Flow::Failed)) => return Some(End::Reset),
            (Some(Flow::Closed), Some(Flow::Closed)) => return Some(End::Closed),
            (Some(_), Some(_)) => return None,
            _ => {}
        }
    }
}

/// A chunk read from one side, to be written to the other at `at`; `None` is the end of stream.
struct Chunk {
    at: Instant,
    data: Option<Vec<u8>>,
}

/// Relays `from` to `to`: a reader that stamps each chunk with its due time, and a writer
/// that forwards it then, so a delay adds latency without cutting throughput.
async fn direction(mut from: ReadHalf<'_>, mut to: WriteHalf<'_>, ctl: &Ctl, answers: bool) -> Flow {
    let (queue, mut due) = mpsc::unbounded_channel::<Chunk>();
    // Returns `None` once it queued the end of stream, for the writer to finish.
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let read = from.read(&mut buf).await;
            if let (Ok(n), false) = (&read, answers) {
                ctl.shared.sent.fetch_add(*n, Ordering::SeqCst);
            }
            if ctl.silent(answers) {
                match read {
                    Ok(n) if n > 0 => {
                        ctl.count_dropped(n);
                        continue;
                    }
                    _ => return Some(Flow::Quiet),
                }
            }
            let at = Instant::now() + ctl.delay();
            match read {
                Ok(0) => {
                    let _ = queue.send(Chunk { at, data: None });
                    return None;
                }
                Ok(n) => {
                    let _ = queue.send(Chunk {
                        at,
                        data: Some(buf[..n].to_vec()),
                    });
                }
                Err(_) => return Some(Flow::Failed),
            }
        }
    };
    let writer = async {
        while let Some(chunk) = due.recv().await {
            tokio::time::sleep_until(chunk.at).await;
            if ctl.silent(answers) {
                match chunk.data {
                    Some(data) => ctl.count_dropped(data.len()),
                    None => return Flow::Quiet,
                }
                continue;
            }
            let written = match &chunk.data {
                Some(data) => to.write_all(data).await,
                None => {
                    return match to.shutdown().await {
                        Ok(()) => Flow::Closed,
                        Err(_) => Flow::Failed,
                    }
                }
            };
            if written.is_err() {
                return if ctl.silent(answers) {
                    Flow::Quiet
                } else {
                    Flow::Failed
                };
            }
        }
        // The reader is gone without an end of stream: cannot happen, as it stops only by
        // returning, which `direction` sees first.
        Flow::Quiet
    };
    tokio::pin!(reader, writer);
    tokio::select! {
        read = &mut reader => match read {
            Some(flow) => flow,
            None => writer.await,
        },
        flow = &mut writer => flow,
    }
}
