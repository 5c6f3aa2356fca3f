//! Real sockets over loopback: raw bytes in, and what the server answers and when it closes.
//! Timeouts are a few hundred milliseconds; the upper bounds are generous for a loaded
//! machine, the lower ones are the timeouts themselves.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::scheduler::{Batching, SchedulerConfig};
use crate::service::{Infer, RequestLimits};
use crate::testing::{self, CopyBackend};
use crate::transport::{grpc, http};

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(30);
/// Far more than any step here takes, however loaded the machine; far less than `LONG`.
const PATIENCE: Duration = Duration::from_secs(5);
/// Timers never fire early; this absorbs the clocks of the test and the server differing.
const SLACK: Duration = Duration::from_millis(20);
const HALF_HEAD: &[u8] = b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Ty";

fn infer(step_delay: Duration) -> Infer {
    let limits = RequestLimits {
        max_texts_per_request: 8,
        max_input_tokens: 64,
        max_output_tokens: 64,
        max_body_bytes: 256,
        max_length_ratio: 2.0,
        max_length_offset: 10,
        length_pull: nmt_engine::length::DEFAULT_LENGTH_PULL,
        runaway_ratio: nmt_engine::length::DEFAULT_RUNAWAY_RATIO,
        exact_plans: nmt_engine::limits::DEFAULT_EXACT_PLANS,
        no_repeat_ngram_size: 0,
        request_timeout: LONG,
    };
    let scheduler = SchedulerConfig {
        batching: Batching::Continuous,
        max_batch_size: 16,
        max_batch_tokens: 4096,
        max_queued_requests: 16,
        max_queue_wait: Duration::from_secs(60),
        request_timeout: Duration::from_secs(60),
    };
    let backend = CopyBackend {
        step_delay,
        ..Default::default()
    };
    testing::infer(backend, limits, scheduler)
}

struct Server {
    addr: std::net::SocketAddr,
    shutdown: CancellationToken,
    served: JoinHandle<()>,
    infer: Infer,
}

struct Setup {
    header_read: Duration,
    keep_alive: Option<Duration>,
    body_read: Duration,
    max_connections: usize,
    step_delay: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            header_read: LONG,
            keep_alive: Some(LONG),
            body_read: LONG,
            max_connections: 1000,
            step_delay: Duration::ZERO,
        }
    }
}

async fn start(setup: Setup) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let infer = infer(setup.step_delay);
    let app = http::app_with_body_timeout(infer.clone(), setup.body_read);
    let timeouts = Timeouts {
        header_read: setup.header_read,
        keep_alive: setup.keep_alive,
    };
    let shutdown = CancellationToken::new();
    let gate = ConnectionGate::new(setup.max_connections);
    let served = tokio::spawn(serve_http(
        listener,
        app,
        gate,
        timeouts,
        infer.shared_metrics(),
        shutdown.clone(),
    ));
    Server {
        addr,
        shutdown,
        served,
        infer,
    }
}

async fn connect(addr: std::net::SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

/// Reads until the server closes the connection (a reset counts); what came, and how long
/// it took.
async fn read_until_closed(stream: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert!(read.is_ok(), "still open after {PATIENCE:?}; read {text:?}");
    (text, started.elapsed())
}

/// One response of a keep-alive connection: status line and headers, and the body.
async fn read_response(stream: &mut TcpStream) -> (String, String) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("a response")
            .unwrap();
        assert!(n > 0, "closed before a response");
        bytes.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("content-length")
        .trim()
        .parse()
        .unwrap();
    while bytes.len() < head_end + length {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed mid-body");
        bytes.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&bytes[head_end..head_end + length]).into_owned();
    (head, body)
}

fn error_type(body: &str) -> String {
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    json["error_type"].as_str().unwrap().to_string()
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n";

#[tokio::test]
async fn a_head_not_complete_within_the_header_timeout_is_closed() {
    let server = start(Setup {
        header_read: SHORT,
        ..Setup::default()
    })
    .await;
    for sent in [HALF_HEAD, &b""[..]] {
        let mut stream = connect(server.addr, sent).await;
        let (answer, waited) = read_until_closed(&mut stream).await;
        assert_eq!(answer, "", "closed without an answer");
        assert!(waited >= SHORT - SLACK, "closed after {waited:?}");
    }
    // A complete head in time is answered.
    let mut stream = connect(server.addr, HEALTH).await;
    let (head, _) = read_response(&mut stream).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

#[tokio::test]
async fn idle_keep_alive_connections_close_after_the_keep_alive_timeout() {
    // The keep-alive wait is its own timeout, not the header timeout.
    let server = start(Setup {
        header_read: SHORT,
        keep_alive: Some(SHORT * 3),
        ..Setup::default()
    })
    .await;
    let mut stream = connect(server.addr, HEALTH).await;
    read_response(&mut stream).await;
    tokio::time::sleep(SHORT * 2).await;
    stream.write_all(HEALTH).await.unwrap();
    let (head, _) = read_response(&mut stream).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let (answer, waited) = read_until_closed(&mut stream).await;
    assert_eq!(answer, "");
    assert!(waited >= SHORT * 3 - SLACK, "closed after {waited:?}");

    // The next head, once begun, has the header timeout from its first byte.
    let server = start(Setup {
        header_read: SHORT,
        ..Setup::default()
    })
    .await;
    let mut stream = connect(server.addr, HEALTH).await;
    read_response(&mut stream).await;
    stream.write_all(HALF_HEAD).await.unwrap();
    let (answer, waited) = read_until_closed(&mut stream).await;
    assert_eq!(answer, "");
    assert!(waited >= SHORT - SLACK, "closed after {waited:?}");

    // No keep-alive: closed right after the answer.
    let server = start(Setup {
        keep_alive: None,
        ..Setup::default()
    })
    .await;
    let mut stream = connect(server.addr, HEALTH).await;
    let (answer, waited) = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(waited < PATIENCE);
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408_then_closed() {
    let server = start(Setup {
        body_read: SHORT,
        ..Setup::default()
    })
    .await;
    let head = "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                Content-Length: 100\r\n\r\n{\"text\": ";
    let mut stream = connect(server.addr, head.as_bytes()).await;
    let (answer, waited) = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.to_lowercase().contains("connection: close"),
        "{answer}"
    );
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(error_type(body), "body_timeout");
    assert!(waited >= SHORT - SLACK, "answered after {waited:?}");
}

#[tokio::test]
async fn a_content_length_over_the_limit_is_413_before_the_body_is_read() {
    // The body timeout is long: only an answer from the header can come in time.
    let server = start(Setup::default()).await;
    let head = "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                Content-Length: 1000000000000000\r\n\r\n0123456789";
    let mut stream = connect(server.addr, head.as_bytes()).await;
    let (answer, waited) = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(error_type(body), "payload_too_large");
    assert!(body.contains("256 bytes"), "{body}");
    assert!(waited < PATIENCE, "{waited:?}");
}

/// The status line and the JSON body of an answer read to the end.
fn status_and_body(answer: &str) -> (&str, &str) {
    let status = answer.lines().next().unwrap_or_default();
    let body = answer.find("\r\n\r\n").map_or("", |end| &answer[end + 4..]);
    (status, body)
}

#[tokio::test]
async fn malformed_heads_are_answered_in_the_error_shape_and_counted() {
    let server = start(Setup::default()).await;
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: test\r\n\r\n", "a".repeat(70_000));
    let headers: String = (0..120).map(|i| format!("x-h{i}: 1\r\n")).collect();
    let many_headers = format!("GET /health HTTP/1.1\r\nHost: test\r\n{headers}\r\n");
    for (request, status, expected) in [
        (
            "GET /health HTTP/1.1\r\nno colon here\r\n\r\n".to_string(),
            "HTTP/1.1 400 Bad Request",
            "malformed_request",
        ),
        (long_uri, "HTTP/1.1 414 URI Too Long", "uri_too_long"),
        (
            many_headers,
            "HTTP/1.1 431 Request Header Fields Too Large",
            "headers_too_large",
        ),
    ] {
        let mut stream = connect(server.addr, request.as_bytes()).await;
        let (answer, _) = read_until_closed(&mut stream).await;
        let (line, body) = status_and_body(&answer);
        assert_eq!(line, status, "{answer}");
        assert!(
            answer
                .to_lowercase()
                .contains("content-type: application/json"),
            "{answer}"
        );
        assert_eq!(error_type(body), expected, "{answer}");
    }
    let metrics = server.infer.metrics().render();
    for expected in ["malformed_request", "uri_too_long", "headers_too_large"] {
        let line = format!("nmt_errors_total{{type=\"{expected}\"}} 1");
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in\n{metrics}"
        );
    }
    // The connection still serves well-formed requests.
    let mut stream = connect(server.addr, HEALTH).await;
    let (head, _) = read_response(&mut stream).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

#[tokio::test]
async fn a_broken_chunked_body_is_400() {
    let server = start(Setup::default()).await;
    let request = "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                   Transfer-Encoding: chunked\r\n\r\nZZ\r\n{\"text\": \"hello\"}\r\n0\r\n\r\n";
    let mut stream = connect(server.addr, request.as_bytes()).await;
    let (answer, _) = read_until_closed(&mut stream).await;
    let (line, body) = status_and_body(&answer);
    assert_eq!(line, "HTTP/1.1 400 Bad Request", "{answer}");
    assert_eq!(error_type(body), "malformed_request", "{answer}");
    let metrics = server.infer.metrics().render();
    assert!(
        metrics.contains("nmt_errors_total{type=\"malformed_request\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_body_in_a_transfer_coding_other_than_chunked_is_501() {
    let server = start(Setup::default()).await;
    let request = "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                   Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let mut stream = connect(server.addr, request.as_bytes()).await;
    let (answer, _) = read_until_closed(&mut stream).await;
    let (line, body) = status_and_body(&answer);
    assert_eq!(line, "HTTP/1.1 501 Not Implemented", "{answer}");
    assert_eq!(
        error_type(body),
        "unsupported_transfer_encoding",
        "{answer}"
    );
    assert!(body.contains("gzip, chunked"), "{answer}");
}

#[tokio::test]
async fn a_client_that_leaves_mid_body_is_not_an_invalid_request() {
    let server = start(Setup::default()).await;
    let head = "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                Content-Length: 100\r\n\r\n{\"text\": ";
    let mut stream = connect(server.addr, head.as_bytes()).await;
    // Half-closed, the socket still reads whatever the server does about it.
    stream.shutdown().await.unwrap();
    let (answer, _) = read_until_closed(&mut stream).await;
    let metrics = server.infer.metrics().render();
    assert!(
        !metrics.contains("nmt_errors_total"),
        "answered {answer:?}; counted as an error:\n{metrics}"
    );
}

#[tokio::test]
async fn idle_connections_beyond_the_cap_do_not_lock_out_new_clients() {
    let server = start(Setup {
        max_connections: 8,
        ..Setup::default()
    })
    .await;
    // Past the cap: connections that never send, and keep-alive connections done with their
    // request. All of them would wait the long timeouts.
    let mut idle = Vec::new();
    for _ in 0..12 {
        idle.push(connect(server.addr, b"").await);
    }
    for _ in 0..4 {
        let mut stream = connect(server.addr, HEALTH).await;
        // Some of these wait in the backlog until room is made.
        read_response(&mut stream).await;
        idle.push(stream);
    }
    let started = Instant::now();
    let mut stream = connect(server.addr, HEALTH).await;
    let (head, _) = read_response(&mut stream).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(started.elapsed() < PATIENCE);
    // The ones that made room were closed without an answer.
    let mut closed = 0;
    for stream in &mut idle {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert!(closed >= 8, "only {closed} idle connections were closed");
}

#[tokio::test]
async fn shutdown_closes_connections_without_a_request_at_once_and_answers_the_rest() {
    let server = start(Setup {
        // 20 ms a step: the request below takes about 0.5 s.
        step_delay: Duration::from_millis(20),
        ..Setup::default()
    })
    .await;
    let mut half = connect(server.addr, HALF_HEAD).await;
    let mut silent = connect(server.addr, b"").await;
    let mut kept = connect(server.addr, HEALTH).await;
    read_response(&mut kept).await;
    let text = "one two three four five six seven eight nine ten ".repeat(2);
    let body = format!(r#"{{"text": "{}"}}"#, text.trim());
    let request = format!(
        "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut in_flight = connect(server.addr, request.as_bytes()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    server.shutdown.cancel();
    for stream in [&mut half, &mut silent, &mut kept] {
        let (answer, _) = read_until_closed(stream).await;
        assert_eq!(answer, "");
    }
    let closed_idle = started.elapsed();
    let (answer, _) = read_until_closed(&mut in_flight).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(text.trim()), "{answer}");
    tokio::time::timeout(PATIENCE, server.served)
        .await
        .expect("serve_http returns once the request in flight is answered")
        .unwrap();
    assert!(closed_idle < PATIENCE, "{closed_idle:?}");
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_request_body_still_arriving() {
    // Every timeout far longer than the test waits: only the shutdown can end the stall.
    let server = start(Setup::default()).await;
    let head = "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                Content-Length: 200\r\n\r\n{\"text\": \"one two";
    let mut stalled = connect(server.addr, head.as_bytes()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    server.shutdown.cancel();
    let (answer, waited) = read_until_closed(&mut stalled).await;
    let (line, body) = status_and_body(&answer);
    assert_eq!(line, "HTTP/1.1 503 Service Unavailable", "{answer}");
    assert_eq!(error_type(body), "not_ready", "{answer}");
    assert!(
        answer.to_lowercase().contains("connection: close"),
        "{answer}"
    );
    tokio::time::timeout(PATIENCE, server.served)
        .await
        .expect("serve_http returns without waiting for the body")
        .unwrap();
    assert!(waited < Duration::from_secs(1), "answered after {waited:?}");
}

#[tokio::test]
async fn host_headers_that_rfc_9112_refuses_are_400_invalid_host() {
    let server = start(Setup::default()).await;
    let refused = [
        "GET /health HTTP/1.1\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: a.test\r\nx-other: 1\r\nhost: b.test\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: bad host\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: a.test/path\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: user@a.test\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: a.test:http\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: [::1\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: [not-an-address]\r\n\r\n",
        // A request the API would take, refused for its Host alone.
        "POST /translate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\
         \r\n{\"text\": \"one\"}",
        // Host is required of HTTP/1.0 requests too when sent: one, and valid.
        "GET /health HTTP/1.0\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
    ];
    for request in refused {
        let mut stream = connect(server.addr, request.as_bytes()).await;
        let (answer, _) = read_until_closed(&mut stream).await;
        let (line, body) = status_and_body(&answer);
        // (hyper answers in the request's version.)
        assert!(line.ends_with(" 400 Bad Request"), "{request:?}: {answer}");
        assert_eq!(error_type(body), "invalid_host", "{request:?}: {answer}");
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    let metrics = server.infer.metrics().render();
    let counted = format!(
        "nmt_errors_total{{type=\"invalid_host\"}} {}",
        refused.len()
    );
    assert!(
        metrics.lines().any(|l| l == counted),
        "no `{counted}` in\n{metrics}"
    );

    for request in [
        // HTTP/1.0 has no Host requirement (the container image's HEALTHCHECK sends none).
        "GET /health HTTP/1.0\r\n\r\n",
        // An empty Host: a target URI without an authority (RFC 9112 3.2).
        "GET /health HTTP/1.1\r\nHost:\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
        "GET /health HTTP/1.1\r\nhost: Nmt-Server.internal\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: xn--bcher-kva.example:80\r\n\r\n",
    ] {
        let mut stream = connect(server.addr, request.as_bytes()).await;
        let (head, _) = read_response(&mut stream).await;
        assert!(head.contains(" 200 ok\r\n"), "{request:?}: {head}");
    }
}

#[tokio::test]
async fn a_half_sent_head_behind_a_complete_request_has_the_header_timeout() {
    // The next head's first bytes come in the same write as the request before it: hyper has
    // them before it starts waiting for that head.
    let server = start(Setup {
        header_read: SHORT,
        ..Setup::default()
    })
    .await;
    let post = "POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                Content-Length: 15\r\n\r\n{\"text\": \"one\"}";
    let next = "POST /translate HTTP/1.1\r\nHost: x\r\nCont";
    for first in [std::str::from_utf8(HEALTH).unwrap(), post] {
        let mut stream = connect(server.addr, format!("{first}{next}").as_bytes()).await;
        let (head, _) = read_response(&mut stream).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let (answer, waited) = read_until_closed(&mut stream).await;
        assert_eq!(answer, "", "closed without an answer");
        assert!(
            waited >= SHORT / 2 && waited < SHORT * 3,
            "{first:?}: closed after {waited:?}"
        );
    }

    // Requests pipelined whole are all answered, and what follows the last is the keep-alive
    // wait, not a head: a body is not taken for the next head, nor is a trailing CRLF.
    let server = start(Setup {
        header_read: SHORT,
        keep_alive: Some(SHORT * 4),
        ..Setup::default()
    })
    .await;
    let pipelined = format!("{post}{post}\r\n");
    let mut stream = connect(server.addr, pipelined.as_bytes()).await;
    let (answers, waited) = read_until_closed(&mut stream).await;
    assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
    assert_eq!(answers.matches(r#""text":"one""#).count(), 2, "{answers}");
    assert!(waited >= SHORT * 4 - SLACK, "closed after {waited:?}");
}

async fn start_grpc(preface_timeout: Duration) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let options = grpc::GrpcOptions {
        preface_timeout,
        keepalive_interval: None,
    };
    let shutdown = CancellationToken::new();
    let served = grpc::serve_with(
        infer(Duration::ZERO),
        listener,
        options,
        ConnectionGate::new(100),
        shutdown.clone(),
    );
    let served = tokio::spawn(async move { served.await.unwrap() });
    Server {
        addr,
        shutdown,
        served,
        infer: infer(Duration::ZERO),
    }
}

#[tokio::test]
async fn a_grpc_connection_without_its_preface_is_closed() {
    let server = start_grpc(SHORT).await;
    for sent in [&b"PRI * HTTP/2.0\r\n"[..], b""] {
        let mut stream = connect(server.addr, sent).await;
        // (What comes is the server's own preface, a SETTINGS frame.)
        let (_, waited) = read_until_closed(&mut stream).await;
        assert!(waited >= SHORT - SLACK, "closed after {waited:?}");
    }
    // Nor does a half-sent preface hold up shutdown.
    let server = start_grpc(LONG).await;
    let mut stream = connect(server.addr, b"PRI * HTTP/2.0\r\n").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.shutdown.cancel();
    read_until_closed(&mut stream).await;
    tokio::time::timeout(PATIENCE, server.served)
        .await
        .expect("gRPC stops")
        .unwrap();
}

#[test]
fn the_default_cap_leaves_room_under_the_open_file_limit() {
    assert_eq!(default_max_connections(1024), 896);
    assert_eq!(default_max_connections(1 << 20), DEFAULT_MAX_CONNECTIONS);
    assert_eq!(default_max_connections(64), 16);
}
