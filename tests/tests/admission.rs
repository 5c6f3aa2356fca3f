//! Admission keeps its promise, on the real server with the shipped model (issue 30): a
//! request that could not finish within the request timeout even on an idle model is refused
//! at once (413 `request_too_costly`), where it used to be accepted and always end in 504;
//! and under a storm of maximal requests, every request the door accepts is answered, where
//! about two in three used to time out (docs/benchmarks/storm.md).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{metric_sum, wait_until_ready, ServerProcess};
use common::{post_translate, scrape, server_default, shipped_package, start_server_with_env};
use serde_json::{json, Value};

/// The held-out verses the evaluation's tests use (Daniel 1), one per line.
fn verses() -> Vec<String> {
    let path = nmt_testkit::workspace_root().join("eval/tests/fixtures/corpus/test.en");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// `count` texts of `length` subwords (EOS included) by the package's own tokenizer, made of
/// the verses' words, each starting further into them.
fn texts_of_subwords(package: &Path, count: usize, length: usize) -> Vec<String> {
    let tokenizer = tokenizers::Tokenizer::from_file(package.join("tokenizer.json")).unwrap();
    let verses = verses();
    let words: Vec<&str> = verses.iter().flat_map(|v| v.split_whitespace()).collect();
    let texts = nmt_testkit::distinct_texts_of_subwords(&words, count, length, |text| {
        tokenizer
            .encode(text, false)
            .map(|encoding| encoding.get_ids().len() + 1)
    })
    .unwrap();
    texts
        .into_iter()
        .map(|(text, subwords)| {
            // Within a word's subwords of the length.
            assert!(subwords + 16 >= length, "{subwords} of {length}");
            text
        })
        .collect()
}

fn quiet_server(extra: &[&str]) -> ServerProcess {
    start_server_with_env(&[&shipped_package()], extra, &[("RUST_LOG", "error")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_finish_in_time_even_alone_is_refused_at_once_with_413() {
    let package = shipped_package();
    let server = quiet_server(&[]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let max_texts: usize = server_default("max-texts-per-request").parse().unwrap();
    let max_tokens: usize = server_default("max-input-tokens").parse().unwrap();
    let texts = texts_of_subwords(&package, max_texts, max_tokens);
    let steps_before = metric_sum(&scrape(&client, &server).await, "nmt_batch_size_count");

    // Within every limit of its own, and alone on an idle model, but 64 texts of 1,024
    // subwords take minutes: before, accepted and a 504 after 30 s of thrown-away work.
    let response = post_translate(&client, &server, &json!({ "text": texts })).await;
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_type"], "request_too_costly", "{body}");
    let message = body["error"].as_str().unwrap();
    for why in [
        "even with nothing else to do",
        "--request-timeout",
        "fewer texts",
    ] {
        assert!(message.contains(why), "{message}");
    }
    // Refused before any of it ran: the model took no step for it.
    let metrics = scrape(&client, &server).await;
    assert_eq!(metric_sum(&metrics, "nmt_batch_size_count"), steps_before);
    assert!(!metrics.contains("type=\"timeout\""), "{metrics}");

    // A maximal text alone is no such request: it is taken and answered.
    let one = json!({"text": texts[0], "target_length": 16, "length_mode": "exact"});
    let response = post_translate(&client, &server, &one).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
}

/// How a storm's requests ended, by status.
#[derive(Default, Debug)]
struct Ended {
    statuses: Vec<u16>,
}

impl Ended {
    fn count(&self, status: u16) -> usize {
        self.statuses.iter().filter(|&&s| s == status).count()
    }
}

/// `clients` closed-loop clients send `body` for `seconds`, each its next request as soon as
/// the last came back (refused or not), and every request is followed to its end.
async fn storm(server: &ServerProcess, body: &Value, clients: usize, seconds: u64) -> Ended {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let stop = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url, body) = (client.clone(), server.base_url().to_string(), body.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while tokio::time::Instant::now() < stop {
                    let response = client
                        .post(format!("{url}/translate"))
                        .json(&body)
                        .send()
                        .await
                        .expect("every request is answered");
                    statuses.push(response.status().as_u16());
                    let json: Value = response.json().await.unwrap();
                    assert!(
                        statuses.last() == Some(&200) || json["error_type"].is_string(),
                        "{json}"
                    );
                }
                statuses
            })
        })
        .collect();
    let mut ended = Ended::default();
    for task in tasks {
        ended.statuses.extend(task.await.unwrap());
    }
    ended
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_maximal_requests_gets_no_timeout_among_the_accepted() {
    // 32 clients of 64 verses, each decoded to exactly 64 subwords, sending again as soon as
    // they are answered or refused: about 20 s of work for an idle 2-core machine offered at
    // once, again and again, against the 8 s the door promises (--max-queue-wait) within a
    // 12 s timeout; each request alone well within it. Without promises (the door checked
    // only that a new request would be done in time, not that those it had taken still
    // would), the same storm timed out one of five to eight answered requests in one run of
    // three. One row a text (`--exact-plans 1`): the storm's load is measured in those rows,
    // where the default decodes an exact count that ends in punctuation in four.
    let server = quiet_server(&[
        "--request-timeout",
        "12",
        "--max-queue-wait",
        "8",
        "--exact-plans",
        "1",
    ]);
    let client = reqwest::Client::new();
    wait_until_ready(&client, &server).await;
    let verses = verses();
    let texts: Vec<&String> = verses.iter().cycle().take(64).collect();
    let body = json!({"text": texts, "target_length": 64, "length_mode": "exact"});
    let ended = storm(&server, &body, 32, 12).await;
    eprintln!(
        "{} answered, {} refused (429), {} timed out (504), of {}",
        ended.count(200),
        ended.count(429),
        ended.count(504),
        ended.statuses.len()
    );
    assert_eq!(ended.count(504), 0, "an accepted request timed out");
    assert!(ended.count(200) > 0, "{ended:?}");
    assert!(
        ended.count(429) > 0,
        "the storm did not overload the server"
    );
    assert_eq!(
        ended.count(200) + ended.count(429),
        ended.statuses.len(),
        "{ended:?}"
    );
    let metrics = scrape(&client, &server).await;
    assert!(!metrics.contains("type=\"timeout\""), "{metrics}");
    assert!(
        metrics.contains("nmt_throughput_cost_units_per_second{model=\"en-es-rel-ldpe\"}"),
        "{metrics}"
    );
}
