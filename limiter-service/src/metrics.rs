//! The Prometheus endpoint: `GET` (or `HEAD`) of
//! `/metrics` or `/` answers the text exposition a caller-supplied renderer makes.
//!
//! hyper's HTTP/1.1 does the protocol; this module adds what a scrape target exposed to a
//! network needs: every connection is served on a task of its own (an idle or stalled
//! client delays no other), a client must send its request head within
//! [`HEADER_TIMEOUT`] and be done within [`CONNECTION_TIMEOUT`], and at most
//! [`MAX_CONNECTIONS`] are served at once (more are closed at accept), and answers go out
//! at most [`MAX_ANSWERS_PER_S`] a second (a connection beyond that waits its turn): a
//! scraper in a loop costs the process a bounded share of a CPU, and the runtime's
//! other tasks keep theirs. A renderer that fails answers 500 with its reason, never an
//! empty 200.
//!
//! The renderer runs on tokio's blocking pool, never on a runtime thread: a render that
//! reads thousands of kernel counters must not hold up the tasks beside it (a daemon's
//! fleet reports, an allocator's grants). [`Cached`] lets a renderer make its text once
//! for any number of scrapes that come within a short time of each other.
//!
//! [`process_families`] writes what every Prometheus target exposes: `*_build_info` and
//! `process_start_time_seconds`.

use std::{
    convert::Infallible,
    fmt::Write as _,
    future::Future,
    sync::{Arc, LazyLock, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming, header, server::conn::http1, service::service_fn, Method, Request, Response,
    StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};

/// The request head must arrive within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection, request to last byte of the answer, gets this long.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Answers a second, all connections together (bursts of [`MAX_CONNECTIONS`]): scrapers
/// ask every few seconds; only a flood meets the bound.
pub const MAX_ANSWERS_PER_S: u32 = 16;
/// The exposition format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// When the process started, as the first call to [`record_start`] saw it.
static STARTED: LazyLock<SystemTime> = LazyLock::new(SystemTime::now);

/// Notes the process's start time: call first thing in `main`.
pub fn record_start() {
    LazyLock::force(&STARTED);
}

/// `{build_info}{version="…"} 1` (the binary's version) and `process_start_time_seconds`
/// (Unix time), each with HELP and TYPE.
pub fn process_families(out: &mut String, build_info: &str, version: &str) {
    let started = STARTED
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let version = version
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    let _ = writeln!(
        out,
        "# HELP {build_info} The running build: always 1, its labels say which.\n\
         # TYPE {build_info} gauge\n{build_info}{{version=\"{version}\"}} 1\n\
         # HELP process_start_time_seconds Start time of the process since the Unix epoch.\n\
         # TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {started:.3}"
    );
}

/// When each answer may go: one every `1 / MAX_ANSWERS_PER_S`, with bursts of
/// `MAX_CONNECTIONS` (a GCRA over the answers).
struct Pace {
    /// The theoretical time of the next answer.
    next: Mutex<Instant>,
}

impl Pace {
    const PERIOD: Duration = Duration::from_nanos(1_000_000_000 / MAX_ANSWERS_PER_S as u64);

    fn new() -> Pace {
        Pace {
            next: Mutex::new(Instant::now()),
        }
    }

    /// When the next answer may go out (now, within a burst); books it.
    fn book(&self, now: Instant) -> Instant {
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let tat = (*next).max(now);
        let burst = Self::PERIOD * (MAX_CONNECTIONS as u32 - 1);
        let at = tat.checked_sub(burst).map_or(now, |t| t.max(now));
        *next = tat + Self::PERIOD;
        at
    }
}

/// Makes the exposition text, or says why it cannot.
pub type Render = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// A value made at most once per `max_age`, however many callers ask for it: the first
/// caller after it has aged makes it while the others wait, then all share it. So N
/// scrapers in a loop cost one render per `max_age`, not N renders back to back.
pub struct Cached<T> {
    max_age: Duration,
    slot: Mutex<Option<(Instant, T)>>,
}

impl<T: Clone> Cached<T> {
    pub fn new(max_age: Duration) -> Cached<T> {
        Cached {
            max_age,
            slot: Mutex::new(None),
        }
    }

    /// The value, made by `make` if there is none younger than `max_age`. Its age counts
    /// from when `make` started: what it read is at most that old.
    pub fn get_or(&self, make: impl FnOnce() -> T) -> T {
        // A caller that panicked in `make` left nothing half-made: the slot is replaced
        // whole, so a poisoned lock is still a usable one.
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((made, value)) = slot.as_ref() {
            if made.elapsed() < self.max_age {
                return value.clone();
            }
        }
        let started = Instant::now();
        let value = make();
        *slot = Some((started, value.clone()));
        value
    }
}

/// The answer to one request (pure): the method and path decide, the query is ignored.
pub fn respond(
    method: &Method,
    path: &str,
    render: &dyn Fn() -> Result<String, String>,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String, head: bool| {
        let length = body.len();
        let body = if head {
            Bytes::new()
        } else {
            Bytes::from(body)
        };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if let Ok(v) = header::HeaderValue::from_str(content_type) {
            headers.insert(header::CONTENT_TYPE, v);
        }
        headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(length));
        response
    };
    let head = method == Method::HEAD;
    if method != Method::GET && !head {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET or HEAD /metrics\n".into(),
            false,
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if path != "/metrics" && path != "/" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try GET /metrics\n".into(),
            head,
        );
    }
    match render() {
        Ok(text) => reply(StatusCode::OK, CONTENT_TYPE, text, head),
        Err(why) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("{why}\n"),
            head,
        ),
    }
}

/// How often a taken metrics port is tried again.
pub const BIND_RETRY: Duration = Duration::from_secs(5);

/// Listens on `addr`; while the port is taken (an old process that has not let go of it
/// yet, another exporter), logs it and tries again every [`BIND_RETRY`]. A metrics
/// failure never stops the process that serves them: both binaries bind through this.
/// `who` names the process in the log ("the daemon", "the allocator").
pub async fn bind(addr: std::net::SocketAddr, who: &str) -> TcpListener {
    let mut failures = 0u64;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                if failures > 0 {
                    tracing::info!(%addr, after = failures, "metrics endpoint listening at last");
                } else {
                    tracing::info!(%addr, "metrics endpoint listening");
                }
                return listener;
            }
            Err(e) => {
                failures += 1;
                // The first failure, then one in 60 (every 5 minutes).
                if failures == 1 || failures.is_multiple_of(60) {
                    tracing::error!(
                        %addr,
                        failures,
                        "cannot listen for metrics: {e}; {who} runs on without them and \
                         tries again every {} s",
                        BIND_RETRY.as_secs()
                    );
                }
                tokio::time::sleep(BIND_RETRY).await;
            }
        }
    }
}

/// Serves `listener` until `shutdown` completes; the connections still open then are
/// closed before it returns (and when it is dropped), so nothing keeps `render` alive.
pub async fn serve(listener: TcpListener, render: Render, shutdown: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let pace = Pace::new();
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => {
                connections.abort_all();
                while connections.join_next().await.is_some() {}
                return;
            }
            // Reaps finished connections as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: try again shortly rather than spin.
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            // Closed: the scraper retries at its next interval.
            continue;
        };
        let render = Arc::clone(&render);
        let turn = pace.book(Instant::now());
        connections.spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let render = Arc::clone(&render);
                let (method, path) = (req.method().clone(), req.uri().path().to_string());
                async move {
                    // On the blocking pool: the runtime's threads go on serving its other
                    // tasks while the text is made.
                    let answer =
                        tokio::task::spawn_blocking(move || respond(&method, &path, &*render))
                            .await
                            .unwrap_or_else(|_| {
                                respond(&Method::GET, "/metrics", &|| {
                                    Err("the metrics renderer failed".to_string())
                                })
                            });
                    Ok::<_, Infallible>(answer)
                }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, async move {
                tokio::time::sleep_until(turn.into()).await;
                connection.await
            })
            .await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::time::Instant;

    use http_body_util::BodyExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    fn ok() -> Result<String, String> {
        Ok("limiter_up 1\n".into())
    }

    async fn body(r: Response<Full<Bytes>>) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn answers_by_method_and_path() {
        let r = respond(&Method::GET, "/metrics", &ok);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(body(r).await, "limiter_up 1\n");
        // HEAD: the headers of a GET, no body.
        let r = respond(&Method::HEAD, "/metrics", &ok);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_LENGTH], "13");
        assert_eq!(body(r).await, "");
        assert_eq!(respond(&Method::GET, "/", &ok).status(), StatusCode::OK);
        assert_eq!(
            respond(&Method::GET, "/stats", &ok).status(),
            StatusCode::NOT_FOUND
        );
        let r = respond(&Method::POST, "/metrics", &ok);
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
        let failing = || Err("state is poisoned".to_string());
        let r = respond(&Method::GET, "/metrics", &failing);
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body(r).await, "state is poisoned\n");
    }

    async fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[test]
    fn concurrent_callers_share_one_make_until_it_ages() {
        let cached = Arc::new(Cached::new(Duration::from_millis(300)));
        let makes = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let callers: Vec<_> = (0..16)
            .map(|_| {
                let (cached, makes) = (Arc::clone(&cached), Arc::clone(&makes));
                std::thread::spawn(move || {
                    cached.get_or(|| {
                        std::thread::sleep(Duration::from_millis(50));
                        makes.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                    })
                })
            })
            .collect();
        let values: Vec<u32> = callers.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(makes.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(values.iter().all(|&v| v == 0), "{values:?}");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cached.get_or(|| 7), 7, "an aged value is made again");
    }

    #[test]
    fn answers_are_paced_after_a_burst() {
        let pace = Pace::new();
        let now = Instant::now();
        let turns: Vec<Duration> = (0..MAX_CONNECTIONS + 16)
            .map(|_| pace.book(now).duration_since(now))
            .collect();
        assert!(
            turns[..MAX_CONNECTIONS].iter().all(|t| t.is_zero()),
            "{turns:?}"
        );
        // The rest, one a period: 16 more answers take a second.
        let last = turns[MAX_CONNECTIONS + 15];
        assert!(
            last >= Duration::from_millis(990) && last <= Duration::from_millis(1010),
            "{last:?}"
        );
        // Idle for a while: a full burst again, not the answers owed.
        let later = now + Duration::from_secs(10);
        assert_eq!(pace.book(later), later);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_render_leaves_the_runtime_thread_free() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let slow: Render = Arc::new(|| {
            std::thread::sleep(Duration::from_millis(600));
            ok()
        });
        tokio::spawn(serve(listener, slow, std::future::pending()));
        let scrape =
            tokio::spawn(
                async move { get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await },
            );
        // A timer on the same (only) runtime thread fires on time while the render runs.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let asked = Instant::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let late = asked.elapsed();
        assert!(
            late < Duration::from_millis(250),
            "a timer beside the render fired {late:?} after 50 ms"
        );
        assert!(scrape.await.unwrap().ends_with("limiter_up 1\n"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_client_delays_no_other_and_queries_are_ignored() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Arc::new(ok), async {
            let _ = stopped.await;
        }));
        // Connects, sends nothing: held by the header timeout on a task of its own.
        let _idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        let answer = get(addr, "GET /metrics?name[]=up HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("limiter_up 1\n"), "{answer}");
        assert!(
            started.elapsed() < HEADER_TIMEOUT,
            "the second client waited for the idle one"
        );
        let head = get(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .expect("serve did not stop")
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_shutdown_no_connection_keeps_the_renderer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(ok);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Arc::clone(&render), async {
            let _ = stopped.await;
        }));
        let _idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let answer = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            Arc::strong_count(&render) > 1,
            "the idle connection holds a copy"
        );
        stop.send(()).unwrap();
        server.await.unwrap();
        assert_eq!(Arc::strong_count(&render), 1, "a connection outlived serve");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_sends_no_request_is_closed_after_the_header_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(ok), std::future::pending()));
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(HEADER_TIMEOUT * 3, idle.read_to_end(&mut buf))
            .await
            .expect("the idle connection was never closed");
        let waited = started.elapsed();
        assert!(
            waited >= HEADER_TIMEOUT - Duration::from_millis(100)
                && waited < CONNECTION_TIMEOUT + Duration::from_secs(1),
            "closed after {waited:?}"
        );
    }
}
