//! Bible verses to Spanish over HTTP, every step through the real binaries: `nmt-train`
//! builds a small corpus from the SWORD modules, trains a tokenizer and a tiny Transformer,
//! `nmt-export` writes the model package, `nmt-server` serves it on a loopback port. The
//! server's translations must equal candle's greedy decoding of the same checkpoint.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use candle_core::{Device, Tensor};
use serde_json::{json, Value};

/// A binary of this workspace, next to the test executable's `deps/` folder.
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

fn run(cmd: &mut Command) {
    let output = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A running `nmt-server`, killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(package: &Path) -> Server {
    let mut child = Command::new(binary("nmt-server"))
        .args(["--model-dir", package.to_str().unwrap(), "--port", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting nmt-server");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("listening on ") {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("nmt-server did not print `listening on ...` within 120 s");
    Server { child, url }
}

/// `POST /translate` with a JSON body.
async fn post_translate(
    client: &reqwest::Client,
    server: &Server,
    body: &Value,
) -> reqwest::Response {
    client
        .post(format!("{}/translate", server.url))
        .json(body)
        .send()
        .await
        .unwrap()
}

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
    model: &nmt_train::model::Transformer,
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
    let out = model.greedy(&source, &mask, max_len).unwrap();
    nmt_train::tokenizer::decode_ids(tokenizer, &out[0]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translates_over_http_like_the_training_forward_pass() {
    let work = tempfile::tempdir().unwrap();
    let package = build_package(work.path());
    let server = start_server(&package);
    let client = reqwest::Client::new();

    let health = client
        .get(format!("{}/health", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    let checkpoint = work.path().join("run").join("best");
    let model = nmt_train::checkpoint::load_model(&checkpoint, &Device::Cpu).unwrap();
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

    let test = nmt_train::corpus::read_parallel(&work.path().join("corpus"), "test").unwrap();
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
            .post(format!("{}/translate", server.url))
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
