//! Bible verses to Spanish over HTTP, every step through the real binaries: `nmt-train`
//! builds a small corpus from the SWORD modules, trains a tokenizer and a tiny Transformer,
//! `nmt-export` writes the model package, `nmt-server` serves it on a loopback port. The
//! server's translations must equal candle's greedy decoding of the same checkpoint.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use candle_core::{Device, Tensor};
use common::{
    binary, metric_sum, post_translate, run, scrape, server_args, shipped_package, start_server,
    wait_until_ready, ServerProcess,
};
use nmt_testkit::{ApiClient, StartOptions, Stderr};
use nmt_train::model::Seq2Seq;
use serde_json::{json, Value};

/// Trains and exports a tiny model with the command-line tools; returns (work dir, package).
fn build_package(work: &Path) -> PathBuf {
    let train = binary("nmt-train");
    let corpus = work.join("corpus");
    let tokenizer = work.join("tokenizer.json");
    let run_dir = work.join("run");
    let package = work.join("package");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    run(Command::new(&train).args([
        "corpus",
        "--out",
        &p(&corpus),
        "--books",
        "Ruth,Jonah",
        "--concat-sizes",
        "2",
    ]));
    run(Command::new(&train).args([
        "tokenizer",
        "--corpus",
        &p(&corpus),
        "--vocab-size",
        "600",
        "--out",
        &p(&tokenizer),
    ]));
    // The pairs the GPU trainer reads: every training pair of the corpus, in its order.
    let pairs = work.join("train.jsonl");
    run(Command::new(&train).args([
        "pairs",
        "--corpus",
        &p(&corpus),
        "--mask-fraction",
        "0.5",
        "--out",
        &p(&pairs),
    ]));
    let written: Vec<Value> = std::fs::read_to_string(&pairs)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let corpus_pairs = nmt_train::corpus::read_parallel(&corpus, "train").unwrap();
    assert_eq!(written.len(), corpus_pairs.len());
    for (line, (en, es)) in written.iter().zip(&corpus_pairs) {
        assert_eq!(
            (line["source"].as_str(), line["target"].as_str()),
            (Some(en.as_str()), Some(es.as_str()))
        );
        // A Bible-only corpus records no origins.
        assert_eq!(line["origin"], "", "{line}");
    }
    run(Command::new(&train).args([
        "train",
        "--corpus",
        &p(&corpus),
        "--tokenizer",
        &p(&tokenizer),
        "--preset",
        "transformer-tiny",
        "--out",
        &p(&run_dir),
        "--max-steps",
        "300",
        "--batch-tokens",
        "1024",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "50",
        "--eval-every",
        "300",
        "--save-every",
        "300",
        "--dev-limit",
        "64",
        "--max-len",
        "96",
        "--quiet",
    ]));
    run(Command::new(binary("nmt-export")).args([
        "--checkpoint",
        &p(&run_dir.join("best")),
        "--out",
        &p(&package),
        "--name",
        "tiny-en-es",
        "--max-target-tokens",
        "64",
    ]));
    package
}

/// Candle's greedy translation of one text, with the server's length bound.
fn reference_translation(
    model: &nmt_train::model::Model,
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
) -> String {
    let mut ids = nmt_train::tokenizer::encode_ids(tokenizer, text).unwrap();
    ids.push(model_package::special::EOS);
    // nmt-server's default bound: min(max_target_tokens, ceil(2 * source) + 10).
    let max_len = (2 * ids.len() + 10).min(64);
    let n = ids.len();
    let source = Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap();
    let mask = Tensor::ones((1, n), candle_core::DType::F32, &Device::Cpu).unwrap();
    let out = model.greedy(&source, &mask, None, max_len).unwrap();
    // The server gives a translation the source's edges (`TextCodec::finish`), and these
    // sources have none: an output that ends in a space piece loses it there.
    let decoded = nmt_train::tokenizer::decode_ids(tokenizer, &out[0]).unwrap();
    decoded.trim().to_string()
}

/// One tiny model package for every test of this binary, built on first use.
fn shared_package() -> &'static Path {
    static WORK: OnceLock<PathBuf> = OnceLock::new();
    WORK.get_or_init(|| {
        let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-package");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).unwrap();
        build_package(&work);
        work
    })
}

#[test]
fn a_linear_fit_alone_is_recorded_without_a_graph() {
    let work = shared_package();
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(work.join("package")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let p = |p: &Path| p.to_str().unwrap().to_string();
    let out = Command::new(binary("nmt-export"))
        .args([
            "length-predictor",
            "--package",
            &p(copy.path()),
            "--linear-fit-corpus",
            &p(&work.join("corpus")),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("recorded no predictor graph"), "{stdout}");
    let manifest = model_package::Manifest::load(copy.path()).unwrap();
    let prediction = manifest
        .length_prediction
        .expect("a length_prediction entry");
    assert!(prediction.predictor.is_none());
    assert!(!copy.path().join("length_predictor.onnx").exists());
    // Spanish verses run a little longer than English ones, in characters and in subwords.
    let fit = prediction.linear_fit;
    assert!(fit.predict(30) > 25.0 && fit.predict(30) < 45.0, "{fit:?}");
    let chars = prediction.chars_per_target_subword.unwrap();
    assert!((1.5..8.0).contains(&chars), "{chars}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translates_over_http_like_the_training_forward_pass() {
    let work = shared_package();
    let package = work.join("package");
    let server = start_server(&[&package], &[]);
    let client = reqwest::Client::new();

    let health = client
        .get(format!("{}/health", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    wait_until_ready(&client, &server).await;

    let checkpoint = work.join("run").join("best");
    let model = nmt_train::train::checkpoint::load_model(&checkpoint, &Device::Cpu).unwrap();
    let tokenizer =
        nmt_train::tokenizer::load(&package.join(model_package::files::TOKENIZER)).unwrap();
    let manifest = model_package::Manifest::load(&package).unwrap();
    // The model declares the longest source it was trained on (EOS included).
    let limit = manifest
        .limits
        .max_source_tokens
        .expect("absolute positions declare a limit");
    let pieces = |text: &str| {
        nmt_train::tokenizer::encode_ids(&tokenizer, text)
            .unwrap()
            .len()
    };

    let test = nmt_train::corpus::read_parallel(&work.join("corpus"), "test").unwrap();
    let sources: Vec<&str> = test
        .iter()
        .map(|(en, _)| en.as_str())
        .filter(|en| pieces(en) < limit)
        .take(5)
        .collect();
    let response = post_translate(&client, &server, &json!({ "text": sources })).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["model"], "tiny-en-es");
    let translations = body["translations"].as_array().unwrap();
    assert_eq!(translations.len(), sources.len());
    for (source, translation) in sources.iter().zip(translations) {
        let expected = reference_translation(&model, &tokenizer, source);
        println!("{source}\n  -> {}", translation["text"]);
        assert_eq!(translation["text"], expected.as_str(), "for {source:?}");
        assert!(translation["output_tokens"].as_u64().unwrap() > 0);
    }

    // One text as a plain string comes back as a list of one.
    let single: Value = post_translate(&client, &server, &json!({ "text": sources[2] }))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(single["translations"][0]["text"], translations[2]["text"]);

    // A source past the model's limit is refused, naming the limit.
    let long = test
        .iter()
        .map(|(en, _)| en.as_str())
        .find(|en| pieces(en) >= limit)
        .expect("a test verse over the limit");
    let response = post_translate(&client, &server, &json!({ "text": [sources[0], long] })).await;
    assert_eq!(response.status(), 413);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error_type"], "input_too_long");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains(&(limit - 1).to_string()),
        "{error}"
    );

    // Bad input: a JSON error with a type, and a 4xx.
    for (body, status, error_type) in [
        ("{\"text\": ", 400, "invalid_json"),
        ("{\"txt\": \"hello\"}", 422, "invalid_request"),
        ("{\"text\": []}", 422, "empty_text"),
    ] {
        let response = client
            .post(format!("{}/translate", server.base_url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "for {body}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error_type"], error_type, "for {body}: {error}");
        assert!(error["error"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_model_workers_answer_concurrent_clients_like_the_training_forward_pass() {
    let work = shared_package();
    let package = work.join("package");
    let server = start_server(
        &[&package],
        &["--model-workers", "2", "--max-batch-size", "2"],
    );
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let model =
        nmt_train::train::checkpoint::load_model(&work.join("run").join("best"), &Device::Cpu)
            .unwrap();
    let tokenizer =
        nmt_train::tokenizer::load(&package.join(model_package::files::TOKENIZER)).unwrap();
    let limit = model_package::Manifest::load(&package)
        .unwrap()
        .limits
        .max_source_tokens
        .unwrap();
    let test = nmt_train::corpus::read_parallel(&work.join("corpus"), "test").unwrap();
    let sources: Vec<String> = test
        .into_iter()
        .map(|(en, _)| en)
        .filter(|en| {
            nmt_train::tokenizer::encode_ids(&tokenizer, en)
                .unwrap()
                .len()
                < limit
        })
        .take(8)
        .collect();
    // Eight clients at once, two rows per worker: both workers' batches fill and refill.
    let requests: Vec<_> = sources
        .iter()
        .map(|source| {
            let request = client
                .post(format!("{}/translate", server.base_url()))
                .json(&json!({ "text": source }));
            tokio::spawn(async move {
                let response = request.send().await.unwrap();
                assert_eq!(response.status(), 200);
                let body: Value = response.json().await.unwrap();
                body["translations"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap());
    }
    for (source, answer) in sources.iter().zip(&answers) {
        assert_eq!(
            answer,
            &reference_translation(&model, &tokenizer, source),
            "for {source:?}"
        );
    }
    let metrics = scrape(&client, &server).await;
    assert_eq!(metric_sum(&metrics, "nmt_sequences_in_flight"), 0.0);
    assert_eq!(metric_sum(&metrics, "nmt_queue_depth"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_requests_in_flight_then_exits_zero() {
    let package = shared_package().join("package");
    // Two rows at a time, so the work below queues and takes a while.
    let server = start_server(
        &[&package],
        &["--max-batch-size", "2", "--shutdown-grace", "60"],
    );
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;

    // 8 requests of 4 texts, each held to 60 tokens: 16 rounds of 60 steps.
    let body = json!({
        "text": ["And Ruth said,", "Jonah prayed.", "The sea grew calm.", "Naomi wept."],
        "target_length": 60,
        "length_mode": "exact",
    });
    let requests: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, body) = (client.clone(), server.base_url().to_string(), body.clone());
            tokio::spawn(async move {
                let response = client
                    .post(format!("{url}/translate"))
                    .json(&body)
                    .send()
                    .await
                    .expect("a request in flight is answered");
                let status = response.status();
                (status, response.json::<Value>().await.unwrap())
            })
        })
        .collect();
    // Every request has reached the server (its texts were tokenized) and some are not
    // done yet.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = scrape(&client, &server).await;
        let validated = metric_sum(&metrics, "nmt_input_length_tokens_count");
        let answered = metric_sum(&metrics, "nmt_request_duration_seconds_count");
        if validated >= 32.0 + 1.0 {
            // (+1: the warm-up translation.)
            assert!(
                answered < 9.0,
                "all requests finished before SIGTERM: {answered}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "requests did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    run(Command::new("kill").args(["-TERM", &server.pid().to_string()]));

    for request in requests {
        let (status, json) = request.await.unwrap();
        assert_eq!(status, 200, "{json}");
        for translation in json["translations"].as_array().unwrap() {
            assert_eq!(translation["output_tokens"], 60, "{json}");
        }
    }
    let (server, status) = wait_for_exit(
        server,
        Duration::from_secs(60),
        "the server exits after draining",
    )
    .await;
    assert!(status.success(), "exit status {status}");
    let after = client
        .get(format!("{}/health", server.base_url()))
        .send()
        .await;
    assert!(after.is_err(), "the port still answers after exit");
}

/// A free loopback port (bound, then released for a program that cannot take port 0).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running Prometheus, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _data: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_prometheus(target: &str) -> Prometheus {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: nmt\n    \
             static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            data.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting prometheus (scripts/setup.sh installs it)");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _data: data,
    }
}

/// Polls a PromQL query until it returns a non-empty vector.
async fn query_until_present(
    client: &reqwest::Client,
    prometheus: &Prometheus,
    promql: &str,
) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = client
            .get(format!("{}/api/v1/query", prometheus.url))
            .query(&[("query", promql)])
            .send()
            .await;
        if let Ok(answer) = answer {
            let json: Value = answer.json().await.unwrap_or(Value::Null);
            if let Some(result) = json["data"]["result"].as_array() {
                if !result.is_empty() {
                    return result.clone();
                }
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Prometheus never returned {promql}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_latency_by_input_length() {
    let package = shared_package().join("package");
    let server = start_server(&[&package], &[]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;

    // Short and long texts land in different input-length buckets; one bad request.
    let short = json!({"text": ["Jonah prayed.", "Ruth wept."]});
    let long = json!({"text": "And it happened in the days when the judges judged, that there was a famine in the land."});
    // The warm-up translation ("Hello.", a few pieces) counts as one request.
    let mut expected = std::collections::BTreeMap::from([("1-16".to_string(), 1.0)]);
    for body in [&short, &long, &short] {
        let response = post_translate(&client, &server, body).await;
        assert_eq!(response.status(), 200);
        let json: Value = response.json().await.unwrap();
        let longest = json["translations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["source_tokens"].as_u64().unwrap())
            .max()
            .unwrap();
        let bucket = match longest {
            0..=16 => "1-16",
            17..=32 => "17-32",
            33..=64 => "33-64",
            65..=128 => "65-128",
            129..=256 => "129-256",
            257..=512 => "257-512",
            _ => "513+",
        };
        *expected.entry(bucket.to_string()).or_default() += 1.0;
    }
    let response = post_translate(&client, &server, &json!({"text": []})).await;
    assert_eq!(response.status(), 422);

    // The exposition passes Prometheus' own linter (naming conventions, units, types).
    let metrics = scrape(&client, &server).await;
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup.sh installs it)");
    use std::io::Write;
    lint.stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    // The shipped recording rules and alerts (deploy/) are valid.
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rules.yml");
    run(Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules));

    // A real Prometheus scrapes the server and answers queries by input-length bucket.
    let target = server.http_addr().to_string();
    let prometheus = start_prometheus(&target);
    let by_bucket = query_until_present(
        &client,
        &prometheus,
        "sum by (input_length) (nmt_request_duration_seconds_count{job=\"nmt\"})",
    )
    .await;
    let counts: std::collections::BTreeMap<String, f64> = by_bucket
        .iter()
        .map(|sample| {
            let bucket = sample["metric"]["input_length"]
                .as_str()
                .unwrap()
                .to_string();
            let value = sample["value"][1].as_str().unwrap().parse().unwrap();
            (bucket, value)
        })
        .collect();
    println!("requests by input length, as Prometheus sees them: {counts:?}");
    assert_eq!(counts, expected);
    assert_eq!(
        counts.len(),
        2,
        "the long text lands in a bucket of its own"
    );
    let errors = query_until_present(
        &client,
        &prometheus,
        "nmt_errors_total{job=\"nmt\",type=\"empty_text\"}",
    )
    .await;
    assert_eq!(errors[0]["value"][1], "1");
    let p50 = query_until_present(
        &client,
        &prometheus,
        "histogram_quantile(0.5, sum by (le) (nmt_time_per_output_token_seconds_bucket{job=\"nmt\"}))",
    )
    .await;
    let p50: f64 = p50[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(p50 > 0.0 && p50 < 1.0, "median time per token {p50} s");
}

// Slow and idle clients (issue 12): these run the shipped model package, which needs no
// training, against raw sockets.

/// Waits up to `limit` for the server process to exit (`expectation` says why it should);
/// hands the server back, its log still readable, with the exit status.
async fn wait_for_exit(
    server: ServerProcess,
    limit: Duration,
    expectation: &str,
) -> (ServerProcess, std::process::ExitStatus) {
    let exit = tokio::task::spawn_blocking(move || {
        let status = server.wait_exit(limit);
        (server, status)
    });
    let (server, status) = exit.await.unwrap();
    (server, status.expect(expectation))
}

/// SIGTERM to `server`, then its exit within `limit` (`expectation` says why it should
/// come): the server, its status, and how long after the signal it exited.
async fn sigterm_and_wait(
    server: ServerProcess,
    limit: Duration,
    expectation: &str,
) -> (ServerProcess, std::process::ExitStatus, Duration) {
    let started = std::time::Instant::now();
    run(Command::new("kill").args(["-TERM", &server.pid().to_string()]));
    let (server, status) = wait_for_exit(server, limit, expectation).await;
    (server, status, started.elapsed())
}

/// `nmt-server` on the shipped package under `ulimit -n open_files` (soft and hard, as a
/// service manager sets it), its log kept for the test to read.
fn start_server_under_ulimit(open_files: u32, extra: &[&str]) -> ServerProcess {
    start_logged_server(Some(open_files), extra)
}

/// `nmt-server` on the shipped package (under `ulimit -n open_files` if given), its log kept
/// for the test to read ([`ServerProcess::log`]).
fn start_logged_server(open_files: Option<u32>, extra: &[&str]) -> ServerProcess {
    let ulimit = open_files.map_or(String::new(), |n| format!("ulimit -n {n} && "));
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("{ulimit}exec \"$0\" \"$@\""))
        .arg(binary("nmt-server"))
        .args(server_args(&[&shipped_package()]))
        .args(extra);
    let options = StartOptions {
        stderr: Stderr::TempFile,
        ..StartOptions::default()
    };
    ServerProcess::start(command, options).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Opens `n` connections that never send a byte, and keeps them open.
async fn idle_connections(server: &ServerProcess, n: usize) -> Vec<tokio::net::TcpStream> {
    let addr = server.http_addr().to_string();
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        let connect = tokio::net::TcpStream::connect(&addr);
        let stream = tokio::time::timeout(Duration::from_secs(30), connect)
            .await
            .expect("the kernel completes the handshake")
            .unwrap();
        idle.push(stream);
    }
    idle
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_lock_clients_out_under_a_low_open_file_limit() {
    // 400 idle connections against 256 descriptors. With the default cap (256 - 128) the cap
    // is what runs out; with a cap above the limit, accepting fails with EMFILE and backs off.
    let cases: [(&[&str], &str); 2] = [
        (&[], "max_connections=128"),
        (&["--max-connections", "1000"], "Too many open files"),
    ];
    for (extra, logged) in cases {
        let server = start_server_under_ulimit(256, extra);
        // A fresh connection per request: a pooled one may be among those closed to make room.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        wait_until_ready(&client, &server).await;
        let idle = idle_connections(&server, 400).await;

        let started = std::time::Instant::now();
        let health = client.get(format!("{}/health", server.base_url())).send();
        let health = tokio::time::timeout(Duration::from_secs(30), health)
            .await
            .expect("/health answers")
            .unwrap();
        assert_eq!(health.status(), 200);
        let body = json!({"text": "In the beginning God created the heaven and the earth."});
        let response = post_translate(&client, &server, &body).await;
        assert_eq!(response.status(), 200);
        eprintln!(
            "{extra:?}: /health and a translation in {:?} beside 400 idle connections",
            started.elapsed()
        );
        drop(idle);
        let log = server.log().unwrap();
        assert!(
            log.contains("open-file limit soft_before=256 soft=256 hard=256"),
            "{log}"
        );
        assert!(log.contains(logged), "`{logged}` not in\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_half_sent_requests_or_idle_connections() {
    use tokio::io::AsyncWriteExt;
    let package = shipped_package();
    // Both timeouts far longer than the exit may take.
    let flags = ["--shutdown-grace", "60", "--header-read-timeout", "60"];
    let server = start_server(&[&package], &flags);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let mut held = idle_connections(&server, 2).await;
    held[0]
        .write_all(b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: appl")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (_server, status, exited) = sigterm_and_wait(
        server,
        Duration::from_secs(20),
        "the server exits without waiting for the held connections",
    )
    .await;
    assert!(status.success(), "exit status {status}");
    eprintln!("exited {exited:?} after SIGTERM");
}

/// A request head declaring a body of 1000 bytes, and the first few of them: a client that
/// stalls mid-body.
const STALLED_BODY: &[u8] = b"POST /translate HTTP/1.1\r\nHost: test\r\n\
    Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"text\": \"In the beginning";

/// Opens a connection that sends [`STALLED_BODY`] and then nothing, once the server has had
/// time to read the head.
async fn stalled_body(server: &ServerProcess) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = idle_connections(server, 1).await.remove(0);
    stream.write_all(STALLED_BODY).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stream
}

/// What the server sent on `stream` until it closed it (its process exits, at the latest).
async fn read_to_close(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut bytes)).await;
    assert!(read.is_ok(), "still open; read {bytes:?}");
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_a_stalled_request_body() {
    // A grace of 20 s, and a body timeout past it: only the shutdown can end the stall.
    let flags = ["--shutdown-grace", "20", "--body-read-timeout", "60"];
    let server = start_logged_server(None, &flags);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let mut stalled = stalled_body(&server).await;

    let (server, status, exited) = sigterm_and_wait(
        server,
        Duration::from_secs(30),
        "the server exits (at the latest when the grace runs out)",
    )
    .await;
    eprintln!("exited {exited:?} after SIGTERM with a stalled body held");
    let log = server.log().unwrap();
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(
        exited < Duration::from_secs(2),
        "exited {exited:?} after SIGTERM"
    );
    let answer = read_to_close(&mut stalled).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(
        answer.contains("\"error_type\":\"not_ready\""),
        "{answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_request_in_flight_beside_a_stalled_body_then_exits() {
    // One row: 8 texts of 150 tokens are 1,200 decoder steps, a few seconds in flight.
    let flags = [
        "--max-batch-size",
        "1",
        "--shutdown-grace",
        "20",
        "--body-read-timeout",
        "60",
    ];
    let server = start_logged_server(None, &flags);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let mut stalled = stalled_body(&server).await;
    let request = {
        let (client, url) = (client.clone(), server.base_url().to_string());
        tokio::spawn(async move {
            let response = client
                .post(format!("{url}/translate"))
                .json(&fixed_cost_request(150))
                .send()
                .await
                .expect("the request in flight is answered");
            let status = response.status();
            let json: Value = response.json().await.unwrap();
            (status, json, std::time::Instant::now())
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while metric_sum(&scrape(&client, &server).await, "nmt_sequences_in_flight") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let signalled = std::time::Instant::now();
    run(Command::new("kill").args(["-TERM", &server.pid().to_string()]));
    let exit = tokio::task::spawn_blocking(move || {
        let status = server.wait_exit(Duration::from_secs(30));
        (server, status, std::time::Instant::now())
    });
    let (status, json, answered) = request.await.unwrap();
    assert_eq!(status, 200, "{json}");
    assert!(answered > signalled, "answered before SIGTERM");
    let (server, exit_status, exited) = exit.await.unwrap();
    let exit_status =
        exit_status.expect("the server exits (at the latest when the grace runs out)");
    let log = server.log().unwrap();
    eprintln!(
        "answered {:?} and exited {:?} after SIGTERM, a stalled body held",
        answered - signalled,
        exited - signalled
    );
    assert!(
        exit_status.success(),
        "exit status {exit_status}; log:\n{log}"
    );
    assert!(
        exited.saturating_duration_since(answered) < Duration::from_secs(1),
        "exited {:?} after the last answer",
        exited - answered
    );
    let answer = read_to_close(&mut stalled).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_a_client_that_stopped_reading() {
    use tokio::io::AsyncWriteExt;
    let server = start_logged_server(None, &["--shutdown-grace", "20"]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    // More answers than a small receive buffer that is never read and the server's send buffer
    // (4 MiB at most here) hold together: the server's write of an answer waits for good.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket
        .connect(server.http_addr().parse().unwrap())
        .await
        .unwrap();
    let requests = "GET /openapi.json HTTP/1.1\r\nHost: test\r\n\r\n".repeat(1000);
    stream.write_all(requests.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    sigterm_exits_without_waiting_for(server, "a client that stopped reading").await;
    drop(stream);
}

/// SIGTERM while only `what` holds a connection, no translation: the server exits 0 within
/// 2.5 s (one second for answers still being written, then no longer) and says it closed the
/// connections still open.
async fn sigterm_exits_without_waiting_for(server: ServerProcess, what: &str) {
    let (server, status, exited) = sigterm_and_wait(
        server,
        Duration::from_secs(30),
        "the server exits (at the latest when the grace runs out)",
    )
    .await;
    eprintln!("exited {exited:?} after SIGTERM with {what}");
    let log = server.log().unwrap();
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(
        exited < Duration::from_millis(2500),
        "exited {exited:?} after SIGTERM"
    );
    assert!(
        log.contains("no translation request in flight; closing the connections still open"),
        "{log}"
    );
}

/// An HTTP/2 frame: its length, type, flags and stream, then `payload`.
fn http2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    [&length[1..], &[kind, flags], &stream.to_be_bytes(), payload].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_a_stalled_grpc_message() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start_logged_server(None, &["--shutdown-grace", "20"]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    // A Translate call whose message declares 1,000 bytes and sends 3, in raw frames (a gRPC
    // client sends its message whole); header fields as HPACK literals, never indexed.
    let literal = |(name, value): &(&str, &str)| {
        let lengths = [name.len(), value.len()].map(|n| u8::try_from(n).unwrap());
        [
            &[0, lengths[0]],
            name.as_bytes(),
            &[lengths[1]],
            value.as_bytes(),
        ]
        .concat()
    };
    let fields: Vec<u8> = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/nmt.v1.Translator/Translate"),
        (":authority", "test"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .iter()
    .flat_map(literal)
    .collect();
    let mut stream = tokio::net::TcpStream::connect(server.grpc_addr())
        .await
        .unwrap();
    let settings = http2_frame(0x4, 0, 0, &[]);
    stream
        .write_all(&[&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &settings].concat())
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(n)) if n > 0),
        "the server's SETTINGS: {read:?}"
    );
    let message_start = [&[0][..], &1000u32.to_be_bytes(), b"abc"].concat();
    let frames = [
        http2_frame(0x4, 0x1, 0, &[]),
        http2_frame(0x1, 0x4, 1, &fields),
        http2_frame(0x0, 0, 1, &message_start),
    ];
    stream.write_all(&frames.concat()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Not a translation in flight: tonic has not called the service.
    sigterm_exits_without_waiting_for(server, "a stalled gRPC message held").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_when_nobody_reads_the_log() {
    // Started by hand, not through the harness: what is tested is a log pipe that nobody
    // reads any more, and the announcements on stdout as the server prints them.
    use std::io::BufRead;

    /// Killed on drop, should the test fail before the server exits.
    struct Started(std::process::Child);
    impl Drop for Started {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    let package = shipped_package();
    let mut started = Started(
        Command::new(binary("nmt-server"))
            .args(["--model-dir", package.to_str().unwrap()])
            .args(["--port", "0", "--grpc-port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting nmt-server"),
    );
    let mut stdout = std::io::BufReader::new(started.0.stdout.take().unwrap());
    let mut lines = [String::new(), String::new()];
    for line in &mut lines {
        stdout.read_line(line).unwrap();
    }
    let url = lines[0]
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    assert!(lines[1].starts_with("grpc listening on "), "{lines:?}");
    // The log collector goes away (after the addresses, which the server must print): every
    // log line from now on fails to be written.
    drop(started.0.stderr.take());
    drop(stdout);
    ApiClient::new(reqwest::Client::new(), &url)
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap();
    run(Command::new("kill").args(["-TERM", &started.0.id().to_string()]));
    let exit = tokio::task::spawn_blocking(move || {
        let status = started.0.wait().unwrap();
        (started, status)
    });
    let (_started, status) = tokio::time::timeout(Duration::from_secs(20), exit)
        .await
        .expect("SIGTERM still shuts the server down")
        .unwrap();
    assert!(status.success(), "exit status {status}");
}

// Scheduling and admission (issue 12, items 3 to 5): the shipped model, under loads that
// outrun it.

/// Eight verses, each held to `tokens` output tokens: a request whose cost does not depend
/// on what the model makes of it.
fn fixed_cost_request(tokens: usize) -> Value {
    json!({
        "text": [
            "In the beginning God created the heaven and the earth.",
            "And the earth was without form, and void; and darkness was upon the face of the deep.",
            "And God said, Let there be light: and there was light.",
            "And God saw the light, that it was good: and God divided the light from the darkness.",
            "And God called the light Day, and the darkness he called Night.",
            "And the evening and the morning were the first day.",
            "And God said, Let there be a firmament in the midst of the waters.",
            "And God made the firmament, and divided the waters.",
        ],
        "target_length": tokens,
        "length_mode": "exact",
    })
}

/// What an open-loop burst got back: statuses, and the `Retry-After` of each 429.
struct BurstResult {
    statuses: Vec<u16>,
    retry_after: Vec<u64>,
}

impl BurstResult {
    fn count(&self, status: u16) -> usize {
        self.statuses.iter().filter(|&&s| s == status).count()
    }
}

/// Sends `body` `per_second` times a second for `seconds`, whatever the answers (an open
/// loop, as independent clients do), and waits for every answer.
async fn open_loop_burst(
    server: &ServerProcess,
    body: &Value,
    per_second: u32,
    seconds: u32,
) -> BurstResult {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / per_second);
    let mut requests = Vec::new();
    for _ in 0..per_second * seconds {
        ticks.tick().await;
        let (client, url, body) = (client.clone(), server.base_url().to_string(), body.clone());
        requests.push(tokio::spawn(async move {
            let response = client
                .post(format!("{url}/translate"))
                .json(&body)
                .send()
                .await
                .expect("every request is answered");
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            let json: Value = response.json().await.unwrap();
            if status == 200 {
                for translation in json["translations"].as_array().unwrap() {
                    assert_eq!(
                        translation["output_tokens"], body["target_length"],
                        "{json}"
                    );
                }
            } else {
                assert!(json["error_type"].is_string(), "{json}");
            }
            (status, retry_after)
        }));
    }
    let mut result = BurstResult {
        statuses: Vec::new(),
        retry_after: Vec::new(),
    };
    for request in requests {
        let (status, retry_after) = request.await.unwrap();
        result.statuses.push(status);
        if status == 429 {
            result
                .retry_after
                .push(retry_after.expect("a 429 says when to retry"));
        }
    }
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_burst_is_refused_at_the_door_instead_of_timing_out() {
    // 40 requests a second for 6 s, each 8 texts of 128 tokens on 8 rows: about 250k tokens
    // offered, many times what even a fast, idle CPU decodes in the 12 s request timeout
    // (half as much was absorbed on an idle 2-core machine).
    let body = fixed_cost_request(128);
    let base = ["--max-batch-size", "8", "--request-timeout", "12"];
    let quiet = [("RUST_LOG", "error")];

    // Admission by count alone (the queue takes 256 requests): accepted requests time out.
    let flags = [&base[..], &["--max-queue-wait", "1000"]].concat();
    let server = common::start_server_with_env(&[&shipped_package()], &flags, &quiet);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let counted = open_loop_burst(&server, &body, 40, 6).await;
    eprintln!(
        "admitted by count: {} answered, {} timed out, {} refused",
        counted.count(200),
        counted.count(504),
        counted.count(429)
    );
    assert!(
        counted.count(504) > 0,
        "the burst does not overload the server"
    );
    drop(server);

    // Admission by expected wait: the excess is refused at once, and what is taken is
    // answered in time.
    let flags = [&base[..], &["--max-queue-wait", "4"]].concat();
    let server = common::start_server_with_env(&[&shipped_package()], &flags, &quiet);
    wait_until_ready(&client, &server).await;
    let started = std::time::Instant::now();
    let waited = open_loop_burst(&server, &body, 40, 6).await;
    eprintln!(
        "admitted by expected wait: {} answered, {} timed out, {} refused (Retry-After {:?} to \
         {:?} s) in {:?}",
        waited.count(200),
        waited.count(504),
        waited.count(429),
        waited.retry_after.iter().min(),
        waited.retry_after.iter().max(),
        started.elapsed()
    );
    assert_eq!(waited.count(504), 0, "an accepted request timed out");
    assert!(waited.count(200) > 0);
    assert!(waited.count(429) > 0);
    assert_eq!(
        waited.count(200) + waited.count(429),
        waited.statuses.len(),
        "{:?}",
        waited.statuses
    );
    // Retry-After is the time the work already taken needs, not a constant.
    assert!(
        waited.retry_after.iter().all(|&s| (1..=30).contains(&s))
            && waited.retry_after.iter().any(|&s| s > 1),
        "{:?}",
        waited.retry_after
    );
    let metrics = scrape(&client, &server).await;
    assert!(!metrics.contains("type=\"timeout\""), "{metrics}");
    assert!(
        metrics.contains("nmt_expected_queue_wait_seconds{model=\"en-es-rel-ldpe\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_drops_requests_in_flight_and_exits_non_zero() {
    // One row: 8 texts of 400 tokens take thousands of decoder steps, far past the grace.
    let flags = ["--max-batch-size", "1", "--shutdown-grace", "1"];
    let server = start_logged_server(None, &flags);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let request = {
        let (client, url) = (client.clone(), server.base_url().to_string());
        tokio::spawn(async move {
            client
                .post(format!("{url}/translate"))
                .json(&fixed_cost_request(400))
                .send()
                .await
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while metric_sum(&scrape(&client, &server).await, "nmt_sequences_in_flight") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (server, status, _) = sigterm_and_wait(
        server,
        Duration::from_secs(20),
        "the server exits once the grace runs out",
    )
    .await;
    assert_eq!(status.code(), Some(1), "exit status {status}");
    let answer = request.await.unwrap();
    assert!(
        answer.is_err(),
        "the dropped request was answered: {answer:?}"
    );
    let log = server.log().unwrap();
    assert!(
        log.contains("the shutdown grace ran out with 1 translation requests in flight"),
        "{log}"
    );
}
