//! `nmt-translate` on the shipped package translates a file exactly as `nmt-server` answers
//! the same texts over HTTP, keeps the output aligned with the input line by line, reads
//! standard input, honours a length ask, and refuses one the model cannot take.

mod common;

use std::process::Output;

use common::{shipped_package, start_server, translate_cli, wait_until_ready};
use serde_json::{json, Value};

const VERSES: [&str; 6] = [
    "Jesus wept.",
    "In the beginning God created the heavens and the earth.",
    "Daniel answered the king, and said, Let thy gifts be to thyself.",
    "I thank my God upon every remembrance of you.",
    "And the king said unto Daniel, Of a truth it is, that your God is a God of gods.",
    "Rejoice in the Lord alway: and again I say, Rejoice.",
];

fn lines(output: &Output) -> Vec<String> {
    assert!(
        output.status.success(),
        "nmt-translate failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn server_texts(server: &common::ServerProcess, body: Value) -> Vec<String> {
    let client = reqwest::Client::new();
    wait_until_ready(&client, server).await;
    let reply = server.api(client).translate(&body).await.unwrap();
    let response = reply.translated().unwrap_or_else(|e| panic!("{e:#}"));
    response.translations.into_iter().map(|t| t.text).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translates_a_file_as_the_server_does() {
    let package = shipped_package();
    let server = start_server(&[&package], &[]);
    let expected = server_texts(&server, json!({ "text": VERSES })).await;
    let exact = server_texts(
        &server,
        json!({ "text": VERSES, "target_length": 6, "length_mode": "exact" }),
    )
    .await;

    // A file with an empty line in the middle and batches smaller than the file, shared out
    // to two workers, written to --output: one line out per line in, the empty one empty.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let mut text = VERSES[..3].join("\n");
    text.push_str("\n\n");
    text.push_str(&VERSES[3..].join("\r\n"));
    std::fs::write(&input, text).unwrap();
    let out = dir.path().join("out.txt");
    let output = translate_cli(
        &[
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--batch-size",
            "2",
            "--workers",
            "2",
        ],
        "",
    );
    assert!(
        lines(&output).is_empty(),
        "the translations went to --output"
    );
    let summary = String::from_utf8_lossy(&output.stderr);
    assert!(summary.contains("7 lines"), "{summary}");
    assert!(summary.contains("target tokens/s"), "{summary}");
    let written: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut with_gap = expected[..3].to_vec();
    with_gap.push(String::new());
    with_gap.extend_from_slice(&expected[3..]);
    assert_eq!(written, with_gap);

    // Standard input, with a length ask, as the API takes it.
    let output = translate_cli(
        &["--target-length", "6", "--length-mode", "exact", "--quiet"],
        &VERSES.join("\n"),
    );
    assert_eq!(lines(&output), exact);
    assert!(output.stderr.is_empty(), "--quiet prints nothing");
}

#[test]
fn refuses_a_length_the_model_cannot_take() {
    let output = translate_cli(&["--target-length", "0"], "Jesus wept.\n");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("target_length 0"), "{message}");
    assert!(output.stdout.is_empty());
}
