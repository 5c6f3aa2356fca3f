//! Memory of the longest text the server accepts, measured on the real server process: the
//! peak its request adds to the idle resident set, and how soon that memory goes back. Before
//! the encoder met its relative tables once per query (O(length x clip)) instead of a table
//! row per (query, key) pair, one text of 1,024 subwords took the shipped model from ~150 MB
//! to ~2 GB and left it there (docs/serving.md, "Memory").

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{post_translate, server_default, shipped_package, start_server, wait_until_ready};
use serde_json::json;

/// What one maximal text may add to the idle server (issue 30's bound; measured: ~135 MiB).
const PEAK_BUDGET_MIB: f64 = 300.0;
/// How far above idle the server may stay once the request is answered, and how soon.
const SETTLED_ABOVE_IDLE: f64 = 0.10;
const SETTLE_WITHIN: Duration = Duration::from_secs(10);

/// Ordinary English prose, repeated and cut to the length wanted.
const PROSE: &str = "The committee met on Tuesday to review the budget for the coming year. \
    Several members asked why the cost of maintaining the old bridge had doubled since the last \
    report, and the engineer explained that the river had risen twice during the winter. \
    After a long discussion, they agreed to publish the figures on the town's website and to \
    invite residents to a public meeting in the library next month.";

/// The longest run of [`PROSE`] (repeated) whose subwords, EOS included, stay within
/// `max_tokens` by the package's own tokenizer.
fn text_of_subwords(package: &Path, max_tokens: usize) -> (String, usize) {
    let tokenizer = tokenizers::Tokenizer::from_file(package.join("tokenizer.json")).unwrap();
    let words: Vec<&str> = PROSE.split_whitespace().collect();
    nmt_testkit::text_of_subwords(&words, max_tokens, |text| {
        tokenizer
            .encode(text, false)
            .map(|encoding| encoding.get_ids().len() + 1)
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maximal_text_stays_within_its_memory_budget_and_gives_it_back() {
    maximal_text_gives_its_memory_back("1").await;
}

/// Two workers, each likely on a heap arena of its own (`memory::HEAP_ARENAS`): what a long
/// text allocated goes back as with one worker (before the encoder's tensors came from ONNX
/// Runtime's arena, an arena per worker stayed 20% above idle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_workers_a_maximal_text_gives_its_memory_back_too() {
    maximal_text_gives_its_memory_back("2").await;
}

async fn maximal_text_gives_its_memory_back(model_workers: &str) {
    let package = shipped_package();
    let server = start_server(&[&package], &["--model-workers", model_workers]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    // A short request first, so that idle includes what serving anything allocates once.
    let warm = post_translate(&client, &server, &json!({"text": "Good morning."})).await;
    assert_eq!(warm.status(), 200);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = server.rss_mib().unwrap();

    let max_tokens: usize = server_default("max-input-tokens").parse().unwrap();
    let (text, subwords) = text_of_subwords(&package, max_tokens);
    assert!(subwords + 4 >= max_tokens, "{subwords} of {max_tokens}");
    server.reset_peak_rss().unwrap();
    // A short exact length keeps the decoding brief: the encoder is what grows with the input.
    let body = json!({"text": text, "target_length": 16, "length_mode": "exact"});
    let response = post_translate(&client, &server, &body).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let peak = server.peak_rss_mib().unwrap();
    assert!(
        peak - idle <= PEAK_BUDGET_MIB,
        "one text of {subwords} subwords took the server from {idle:.0} MiB to {peak:.0} MiB"
    );

    let answered = Instant::now();
    loop {
        let rss = server.rss_mib().unwrap();
        if rss <= idle * (1.0 + SETTLED_ABOVE_IDLE) {
            eprintln!(
                "idle {idle:.0} MiB, peak {peak:.0} MiB, back to {rss:.0} MiB after {:.1} s",
                answered.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(
            answered.elapsed() < SETTLE_WITHIN,
            "{rss:.0} MiB resident {} s after the answer (idle {idle:.0} MiB, peak {peak:.0} MiB)",
            SETTLE_WITHIN.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
