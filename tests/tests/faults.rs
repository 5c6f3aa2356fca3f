//! Faults, against the real `nmt-server` binary: a broken model package stops the start with
//! one line naming the file at fault; a model whose decoder fails mid-batch fails only the
//! requests it was decoding, and the next ones, to it and to the model beside it, are answered;
//! ten thousand clients that leave before their answer leave nothing behind.
//!
//! Broken packages are copies of the shipped one (`models/en-es-rel-ldpe`) in a temporary
//! directory: every entry a symbolic link to the original (the length predictor's large
//! pretrained files included), except the files a test breaks, which get files of their own.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{
    binary, post_translate, scrape, shipped_package, start_server, start_server_with_env,
    wait_until_ready, ServerProcess,
};
use serde_json::{json, Value};

/// A copy of the shipped package at `work/name`, made of links to the original's entries.
fn package(work: &Path, name: &str) -> PathBuf {
    let dir = work.join(name);
    std::fs::create_dir(&dir).unwrap();
    let shipped = shipped_package().canonicalize().unwrap();
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let entry = entry.unwrap();
        std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    dir
}

/// Replaces the link `file` of the package in `dir` by a file of its own holding `bytes`.
fn write(dir: &Path, file: &str, bytes: &[u8]) {
    let path = dir.join(file);
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, bytes).unwrap();
}

/// The shipped package's `file`.
fn original(file: &str) -> Vec<u8> {
    std::fs::read(shipped_package().join(file)).unwrap()
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

/// Rewrites the package's manifest with `edit` applied.
fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let mut manifest = manifest(dir);
    edit(&mut manifest);
    write(
        dir,
        "manifest.json",
        serde_json::to_string_pretty(&manifest).unwrap().as_bytes(),
    );
}

/// Records the current checksum of `file` in the manifest, so that only what comes after the
/// checksum can find the file broken.
fn rehash(dir: &Path, file: &str) {
    let sha = model_package::manifest::sha256_file(&dir.join(file)).unwrap();
    edit_manifest(dir, |m| m["files"][file] = sha.into());
}

/// Starts `nmt-server` on `dir` and waits for it to give up; its exit status and stderr.
fn start_and_fail(dir: &Path) -> (ExitStatus, String) {
    let mut child = Command::new(binary("nmt-server"))
        .args(["--model-dir", dir.to_str().unwrap()])
        .args(["--port", "0", "--grpc-port", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting nmt-server");
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut log = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
        log
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "nmt-server started on the broken package {} (still running after 120 s):\n{}",
                dir.display(),
                log.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, log.join().unwrap())
}

/// The start fails with exit status 1 and one error line, the last thing logged, that names
/// `file` by its full path and says `problem`.
fn assert_refused(dir: &Path, file: &str, problem: &str) {
    let (status, log) = start_and_fail(dir);
    assert_eq!(status.code(), Some(1), "{log}");
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{log}");
    assert_eq!(
        lines.last(),
        errors.first().copied(),
        "the error comes last:\n{log}"
    );
    let error = errors[0];
    let path = dir.join(file);
    assert!(
        error.contains(&format!("{}:", path.display())),
        "the error names {}: {error}",
        path.display()
    );
    assert!(
        error.contains(problem),
        "the error says `{problem}`: {error}"
    );
}

#[test]
fn a_truncated_graph_stops_the_start_and_is_named() {
    let work = tempfile::tempdir().unwrap();
    // The manifest's checksum catches it first...
    let dir = package(work.path(), "truncated-decoder");
    write(&dir, "decoder.onnx", &original("decoder.onnx")[..100_000]);
    assert_refused(&dir, "decoder.onnx", "does not match");
    // ...and ONNX Runtime when the checksum was made after the damage.
    let dir = package(work.path(), "truncated-encoder");
    write(&dir, "encoder.onnx", &original("encoder.onnx")[..100_000]);
    rehash(&dir, "encoder.onnx");
    assert_refused(&dir, "encoder.onnx", "ONNX Runtime cannot load it");
    let dir = package(work.path(), "truncated-predictor");
    let predictor = original("length_predictor.onnx");
    write(
        &dir,
        "length_predictor.onnx",
        &predictor[..predictor.len() / 2],
    );
    assert_refused(&dir, "length_predictor.onnx", "does not match");
    let dir = package(work.path(), "empty-decoder");
    write(&dir, "decoder.onnx", b"");
    rehash(&dir, "decoder.onnx");
    assert_refused(&dir, "decoder.onnx", "ONNX Runtime cannot load it");
}

#[test]
fn a_checksum_mismatch_stops_the_start_and_names_the_file() {
    let work = tempfile::tempdir().unwrap();
    let dir = package(work.path(), "tokenizer-changed");
    let mut tokenizer = original("tokenizer.json");
    // Same length, one byte different: only the checksum can tell.
    let at = tokenizer.len() / 2;
    tokenizer[at] = if tokenizer[at] == b'a' { b'b' } else { b'a' };
    write(&dir, "tokenizer.json", &tokenizer);
    assert_refused(&dir, "tokenizer.json", "sha256");
}

#[test]
fn a_wrong_or_unparsable_manifest_stops_the_start_and_is_named() {
    let work = tempfile::tempdir().unwrap();
    let dir = package(work.path(), "cut-manifest");
    write(&dir, "manifest.json", &original("manifest.json")[..200]);
    assert_refused(&dir, "manifest.json", "not a valid manifest");

    let dir = package(work.path(), "wrong-type");
    edit_manifest(&dir, |m| m["config"]["vocab_size"] = "lots".into());
    assert_refused(&dir, "manifest.json", "not a valid manifest");

    let dir = package(work.path(), "future-format");
    edit_manifest(&dir, |m| m["format_version"] = 99.into());
    assert_refused(&dir, "manifest.json", "format 99");

    let dir = package(work.path(), "bad-config");
    edit_manifest(&dir, |m| m["config"]["d_model"] = 255.into());
    assert_refused(&dir, "manifest.json", "d_model");

    let dir = package(work.path(), "no-manifest");
    std::fs::remove_file(dir.join("manifest.json")).unwrap();
    assert_refused(&dir, "manifest.json", "missing");

    // Valid, but not the graphs' manifest: the graphs are checked against it.
    let dir = package(work.path(), "wrong-vocab");
    edit_manifest(&dir, |m| m["config"]["vocab_size"] = 9000.into());
    let (status, log) = start_and_fail(&dir);
    assert_eq!(status.code(), Some(1), "{log}");
    let error = log.lines().last().unwrap();
    assert!(error.starts_with("error: "), "{log}");
    assert!(error.contains(&dir.display().to_string()), "{error}");
    assert!(
        error.contains(
            "decoder.onnx output `logits` has 8000 columns, the manifest's vocab_size is 9000"
        ),
        "{error}"
    );
}

#[test]
fn a_missing_or_broken_tokenizer_stops_the_start_and_is_named() {
    let work = tempfile::tempdir().unwrap();
    let dir = package(work.path(), "no-tokenizer");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    assert_refused(&dir, "tokenizer.json", "missing");

    // Not even listed: the package's own layout requires it.
    let dir = package(work.path(), "unlisted-tokenizer");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    edit_manifest(&dir, |m| {
        m["files"].as_object_mut().unwrap().remove("tokenizer.json");
    });
    assert_refused(&dir, "tokenizer.json", "missing");

    let dir = package(work.path(), "cut-tokenizer");
    write(&dir, "tokenizer.json", &original("tokenizer.json")[..1000]);
    rehash(&dir, "tokenizer.json");
    assert_refused(
        &dir,
        "tokenizer.json",
        "not a tokenizer this server can read",
    );

    let dir = package(work.path(), "other-ids");
    edit_manifest(&dir, |m| m["eos_id"] = 5.into());
    assert_refused(&dir, "tokenizer.json", "the manifest's eos_id is 5");
}

/// The Python (`onnx`, installed by `scripts/setup.sh`) that makes a decoder fail at a given
/// position: it gathers from a table of that many zeros at `positions` and adds the sum to the
/// logits, so the logits are unchanged while every row is short, and ONNX Runtime refuses the
/// step (index out of bounds) once one row gets that far.
const FRAGILE_DECODER: &str = r#"
import sys, onnx
from onnx import helper, numpy_helper
import numpy as np
source, target, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = onnx.load(source)
graph = model.graph
for node in graph.node:
    node.output[:] = ["logits.sound" if o == "logits" else o for o in node.output]
graph.initializer.append(numpy_helper.from_array(np.zeros(limit, np.float32), "fragile.table"))
graph.node.extend([
    helper.make_node("Gather", ["fragile.table", "positions"], ["fragile.gathered"], axis=0),
    helper.make_node("ReduceSum", ["fragile.gathered"], ["fragile.sum"], keepdims=0),
    helper.make_node("Add", ["logits.sound", "fragile.sum"], ["logits"]),
])
onnx.checker.check_model(model)
onnx.save(model, target)
"#;

/// Decoder steps the fragile model takes; the 13th (position 12) fails.
const FRAGILE_STEPS: usize = 12;

/// The shipped package as model `en-es-fragile`, whose decoder fails at position
/// [`FRAGILE_STEPS`]: any text whose translation is longer than that fails mid-batch, in ONNX
/// Runtime, at the step where its row gets there.
fn fragile_package(work: &Path) -> PathBuf {
    let dir = package(work, "fragile");
    std::fs::remove_file(dir.join("decoder.onnx")).unwrap();
    common::run(
        Command::new("python3")
            .args(["-c", FRAGILE_DECODER])
            .arg(shipped_package().join("decoder.onnx"))
            .arg(dir.join("decoder.onnx"))
            .arg(FRAGILE_STEPS.to_string()),
    );
    rehash(&dir, "decoder.onnx");
    edit_manifest(&dir, |m| m["name"] = "en-es-fragile".into());
    dir
}

/// The value of the sample `series` (name and labels as exported), if present.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until every model's `nmt_sequences_in_flight` and `nmt_queue_depth` are 0.
async fn assert_settles(client: &reqwest::Client, server: &ServerProcess, models: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = scrape(client, server).await;
        let busy: Vec<String> = models
            .iter()
            .flat_map(|model| {
                ["nmt_sequences_in_flight", "nmt_queue_depth"]
                    .map(|name| format!("{name}{{model=\"{model}\"}}"))
            })
            .filter(|series| sample(&metrics, series) != Some(0.0))
            .collect();
        if busy.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still not 0 after 30 s: {busy:?}\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoder_that_fails_mid_batch_fails_its_requests_and_spares_the_other_model() {
    let work = tempfile::tempdir().unwrap();
    let fragile = fragile_package(work.path());
    let server = start_server(&[&shipped_package(), &fragile], &[]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let models = ["en-es-rel-ldpe", "en-es-fragile"];

    let long = "In the beginning God created the heavens and the earth. The earth was formless \
                and empty.";
    let short = |model: &str| json!({"text": "Jesus wept.", "model": model, "target_length": 4, "length_mode": "exact"});
    // One request the fragile model fails at its 13th step, one on the sound model beside it.
    let (to_fragile, to_sound) = (
        json!({"text": long, "model": models[1]}),
        json!({"text": long, "model": models[0]}),
    );
    let (failing, beside) = tokio::join!(
        post_translate(&client, &server, &to_fragile),
        post_translate(&client, &server, &to_sound),
    );

    assert_eq!(failing.status(), 500);
    let body: Value = failing.json().await.unwrap();
    assert_eq!(body["error_type"], "internal", "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(message.contains("running the decoder"), "{message}");
    assert_eq!(body.as_object().unwrap().len(), 2, "{body}");
    assert_eq!(beside.status(), 200);

    // The worker goes on: the next requests to both models are answered, a long one to the
    // sound model and one within the fragile model's reach.
    for _ in 0..3 {
        for model in models {
            let response = post_translate(&client, &server, &short(model)).await;
            assert_eq!(response.status(), 200, "{model}");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["model"], model);
            assert!(!body["translations"][0]["text"].as_str().unwrap().is_empty());
        }
    }
    let response = post_translate(&client, &server, &json!({"text": long})).await;
    assert_eq!(response.status(), 200);

    assert_settles(&client, &server, &models).await;
    let metrics = scrape(&client, &server).await;
    assert_eq!(
        sample(&metrics, "nmt_errors_total{type=\"internal\"}"),
        Some(1.0),
        "{metrics}"
    );
    let ready = client
        .get(format!("{}/ready", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// `n` requests, `clients` at a time, each on a connection of its own that closes right after
/// the request is sent, or up to 30 ms later, before the answer.
async fn leave_before_the_answer(addr: &str, n: usize, clients: usize) {
    use tokio::io::AsyncWriteExt;
    let verses = [
        "In the beginning God created the heavens and the earth.",
        "Jesus wept.",
        "The earth was formless and empty. Darkness was on the surface of the deep.",
        "Blessed are the poor in spirit, for theirs is the Kingdom of Heaven.",
    ];
    let mut tasks = Vec::new();
    for client in 0..clients {
        let addr = addr.to_string();
        tasks.push(tokio::spawn(async move {
            for i in (client..n).step_by(clients) {
                let texts = [verses[i % verses.len()], verses[(i + 1) % verses.len()]];
                // Half wait for the length predictor first, half go straight to the model.
                let body = if i % 2 == 0 {
                    json!({"text": texts})
                } else {
                    json!({"text": texts, "target_length": "source"})
                }
                .to_string();
                let request = format!(
                    "POST /translate HTTP/1.1\r\nHost: nmt\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
                stream.write_all(request.as_bytes()).await.unwrap();
                // Some leave at once, some in the predictor's queue or the model's, some while
                // their rows decode.
                let wait = [0, 1, 3, 10, 30][i % 5];
                if wait > 0 {
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
                drop(stream);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_that_leave_before_their_answer_leave_nothing_behind() {
    // Every abandoned request is logged at info level.
    let server = start_server_with_env(&[&shipped_package()], &[], &[("RUST_LOG", "warn")]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let addr = server.http_addr().to_string();
    let pid = server.pid();
    let model = ["en-es-rel-ldpe"];

    // The first thousand reach the heap's and the runtime's working size.
    leave_before_the_answer(&addr, 1_000, 16).await;
    assert_settles(&client, &server, &model).await;
    let warm = rss_kib(pid);
    let steps = |metrics: &str| sample(metrics, "nmt_batch_size_count{model=\"en-es-rel-ldpe\"}");
    let steps_before = steps(&scrape(&client, &server).await).unwrap_or(0.0);
    let started = Instant::now();
    leave_before_the_answer(&addr, 9_000, 16).await;
    let took = started.elapsed();
    assert_settles(&client, &server, &model).await;
    let after = rss_kib(pid);
    eprintln!(
        "9000 requests abandoned in {:.1} s; VmRSS {warm} KiB after the first 1000, {after} KiB \
         after all 10000",
        took.as_secs_f64()
    );

    // Some of them got as far as the model: their rows left the batch mid-decoding.
    let steps_after = steps(&scrape(&client, &server).await).unwrap_or(0.0);
    assert!(
        steps_after > steps_before + 10.0,
        "{steps_before} -> {steps_after} decoder steps"
    );

    // The process is alive and answers at once: before, every request waited behind the
    // length predictions of those who had left (and got 504 after 30 s).
    let started = Instant::now();
    assert!(server.try_wait().unwrap().is_none(), "nmt-server exited");
    let response = post_translate(&client, &server, &json!({"text": "Jesus wept."})).await;
    assert_eq!(response.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Nothing per request stays: nine times the requests did not grow the resident memory by
    // more than a few allocator arenas' worth.
    assert!(
        after < warm + 64 * 1024,
        "VmRSS grew from {warm} KiB to {after} KiB over 9000 abandoned requests"
    );
}
