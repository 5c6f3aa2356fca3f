//! Tests against a real model package, run through ONNX Runtime (`ORT_DYLIB_PATH`, see
//! `scripts/env.sh`): the package that ships with the repo (`models/en-es-rel-ldpe`), or
//! the directory in `NMT_TEST_PACKAGE` (any export of `nmt-export`).

mod common;

use common::{package_dir, state};

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use ndarray::Array2;
use nmt_engine::backend::Backend;
use nmt_engine::onnx::{self, OrtBackend, OrtEncoded, OrtRows, SessionOptions};
use nmt_engine::package::ModelPackage;
use nmt_server::{app, Args, TranslateResponse};
use tower::ServiceExt;

const SENTENCES: [&str; 5] = [
    "In the beginning God created the heavens and the earth.",
    "Jesus wept.",
    "And God said, Let there be light: and there was light.",
    "The Lord is my shepherd; I shall not want.",
    "For God so loved the world, that he gave his only begotten Son, that whosoever \
     believeth in him should not perish, but have everlasting life.",
];

fn package() -> &'static ModelPackage {
    static PACKAGE: OnceLock<ModelPackage> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let dir = package_dir();
        ModelPackage::load(&dir)
            .unwrap_or_else(|e| panic!("loading the package in {}: {e:#}", dir.display()))
    })
}

fn backend() -> OrtBackend {
    let env = onnx::environment(None).unwrap_or_else(|e| panic!("{e:#}"));
    let package = package();
    OrtBackend::load(
        &env,
        &package.dir,
        &package.manifest,
        &SessionOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e:#}"))
}

fn source_ids(text: &str) -> Vec<i64> {
    let package = package();
    let encoding = package.tokenizer.encode_fast(text, false).unwrap();
    let mut ids: Vec<i64> = encoding.get_ids().iter().map(|&i| i64::from(i)).collect();
    ids.push(package.manifest.eos_id.into());
    ids
}

async fn post_translate(body: serde_json::Value) -> (StatusCode, serde_json::Value) {
    let request = Request::post("/translate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app(state()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn assert_close(a: &Array2<f32>, b: &Array2<f32>, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes differ");
    let worst = a
        .iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "{what}: logits differ by up to {worst}");
}

#[tokio::test]
async fn batch_translation_matches_one_by_one() {
    let manifest = &package().manifest;
    let (status, json) = post_translate(serde_json::json!({
        "text": SENTENCES,
        "model": manifest.name,
    }))
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let batch: TranslateResponse = serde_json::from_value(json).unwrap();
    assert_eq!(batch.model, manifest.name);
    assert_eq!(batch.translations.len(), SENTENCES.len());

    let limits = state().limits().clone();
    for (text, translation) in SENTENCES.iter().zip(&batch.translations) {
        let source_tokens = source_ids(text).len() - 1;
        assert_eq!(translation.source_tokens, source_tokens, "{text}");
        let bound = (limits.max_length_ratio * source_tokens as f64).ceil() as usize
            + limits.max_length_offset;
        assert!(
            translation.output_tokens <= bound,
            "{text}: {} output tokens is over the length bound",
            translation.output_tokens
        );
        if translation.output_tokens == 0 {
            assert_eq!(translation.text, "", "{text}");
        }

        // Padding, masks and row retirement must not change a sentence's translation.
        let (status, json) = post_translate(serde_json::json!({"text": text})).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        let alone: TranslateResponse = serde_json::from_value(json).unwrap();
        assert_eq!(
            &alone.translations[0], translation,
            "{text}: translated alone and in a batch differently"
        );
    }
}

#[test]
fn a_source_repeated_in_a_batch_is_encoded_once_and_placed_alike() {
    let mut backend = backend();
    let sources = [source_ids(SENTENCES[0]), source_ids(SENTENCES[1])];
    let (a, b) = (sources[0].as_slice(), sources[1].as_slice());
    let bos = i64::from(package().manifest.bos_id);
    let first_logits = |backend: &mut OrtBackend, batch: &[&[i64]]| {
        let mut rows = OrtRows::default();
        let encoded = backend.encode(batch).unwrap();
        let slots: Vec<usize> = (0..batch.len()).collect();
        backend.place(&mut rows, encoded, &slots).unwrap();
        let n = batch.len();
        backend
            .step(&mut rows, &vec![bos; n], &vec![0; n], &vec![0; n])
            .unwrap()
    };
    let distinct = first_logits(&mut backend, &[a, b]);
    let repeated = first_logits(&mut backend, &[a, b, a]);
    // The repeated source was encoded once, in the batch the distinct ones were: its rows
    // differ by no more than a decoder step of another width makes them.
    let apart = |x: ndarray::ArrayView1<f32>, y: ndarray::ArrayView1<f32>| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max)
    };
    for (r, d) in [(0, 0), (1, 1), (2, 0)] {
        let gap = apart(repeated.row(r), distinct.row(d));
        assert!(gap < 1e-4, "row {r}: {gap}");
    }
}

#[test]
fn workers_sharing_one_encoder_decode_at_once_as_a_lone_backend_does() {
    use nmt_engine::decode::{greedy_decode, DecodeInput, SpecialIds};
    let env = onnx::environment(None).unwrap_or_else(|e| panic!("{e:#}"));
    let package = package();
    let workers = OrtBackend::load_workers(
        &env,
        &package.dir,
        &package.manifest,
        &SessionOptions::default(),
        2,
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(workers.len(), 2);
    let special = SpecialIds {
        bos: package.manifest.bos_id,
        eos: package.manifest.eos_id,
    };
    let inputs: Vec<DecodeInput> = SENTENCES
        .iter()
        .map(|s| DecodeInput::new(source_ids(s), 40))
        .collect();
    let ids = |outputs: Vec<nmt_engine::decode::DecodeOutput>| -> Vec<Vec<u32>> {
        outputs.into_iter().map(|o| o.ids).collect()
    };
    let alone = ids(greedy_decode(&mut backend(), special, &inputs).unwrap());
    // Both workers encode and step on their own threads at once, many times, so their turns
    // at the shared encoder interleave with each other's decoder steps.
    let together: Vec<Vec<Vec<u32>>> = std::thread::scope(|scope| {
        let runs: Vec<_> = workers
            .into_iter()
            .map(|mut worker| {
                let inputs = &inputs;
                scope.spawn(move || {
                    (0..5)
                        .map(|_| ids(greedy_decode(&mut worker, special, inputs).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(together.len(), 10);
    for run in &together {
        assert_eq!(run, &alone);
    }
}

#[test]
fn first_step_runs_from_empty_state() {
    let mut backend = backend();
    let manifest = &package().manifest;
    let sources = [source_ids(SENTENCES[0]), source_ids(SENTENCES[1])];
    let refs: Vec<&[i64]> = sources.iter().map(|s| s.as_slice()).collect();
    let mut rows = OrtRows::default();
    let encoded = backend.encode(&refs).unwrap();
    backend.place(&mut rows, encoded, &[0, 1]).unwrap();
    let bos = i64::from(manifest.bos_id);
    let logits = backend
        .step(&mut rows, &[bos, bos], &[0, 0], &[0, 0])
        .unwrap();
    assert_eq!(logits.shape(), &[2, manifest.config.vocab_size]);
    assert!(logits.iter().all(|x| x.is_finite()), "non-finite logits");
    // The state grew: a second step from the first step's state works.
    let next: Vec<i64> = logits
        .rows()
        .into_iter()
        .map(|r| i64::from(nmt_engine::logits::argmax_except(r, None)))
        .collect();
    let logits = backend.step(&mut rows, &next, &[1, 1], &[0, 0]).unwrap();
    assert!(
        logits.iter().all(|x| x.is_finite()),
        "non-finite logits at step 1"
    );
}

#[test]
fn moved_rows_and_refilled_slots_continue_like_a_fresh_batch() {
    let mut backend = backend();
    let bos = i64::from(package().manifest.bos_id);
    let sources: Vec<Vec<i64>> = SENTENCES[..4].iter().map(|s| source_ids(s)).collect();
    let fresh = |backend: &mut OrtBackend, rows: &mut OrtRows, sources: &[&Vec<i64>], slots| {
        let refs: Vec<&[i64]> = sources.iter().map(|s| s.as_slice()).collect();
        let encoded = backend.encode(&refs).unwrap();
        backend.place(rows, encoded, slots).unwrap();
    };

    // Three rows take a step. Row 1 leaves and row 2 moves into its slot; a fourth
    // sentence then takes the freed slot 2 (its cache there holds row 2's column, which
    // it must not see), and the three step again.
    let mut rows = OrtRows::default();
    fresh(
        &mut backend,
        &mut rows,
        &[&sources[0], &sources[1], &sources[2]],
        &[0, 1, 2],
    );
    let first = backend
        .step(&mut rows, &[bos; 3], &[0; 3], &[0; 3])
        .unwrap();
    backend.move_row(&mut rows, 2, 1).unwrap();
    backend.truncate(&mut rows, 2).unwrap();
    fresh(&mut backend, &mut rows, &[&sources[3]], &[2]);
    let tokens = [7i64, 11, bos];
    let shared = backend
        .step(&mut rows, &tokens, &[1, 1, 0], &[0; 3])
        .unwrap();

    // The same: rows 0 and 2 as a batch of their own, and the fourth alone.
    let mut alone = OrtRows::default();
    fresh(
        &mut backend,
        &mut alone,
        &[&sources[0], &sources[2]],
        &[0, 1],
    );
    let alone_first = backend
        .step(&mut alone, &[bos; 2], &[0; 2], &[0; 2])
        .unwrap();
    let alone_second = backend
        .step(&mut alone, &tokens[..2], &[1, 1], &[0, 0])
        .unwrap();
    let mut fourth = OrtRows::default();
    fresh(&mut backend, &mut fourth, &[&sources[3]], &[0]);
    let fourth_first = backend.step(&mut fourth, &[bos], &[0], &[0]).unwrap();

    let selected = ndarray::stack![ndarray::Axis(0), first.row(0), first.row(2)];
    assert_close(&selected, &alone_first, "step 0");
    let kept = shared.slice(ndarray::s![0..2, ..]).to_owned();
    assert_close(&kept, &alone_second, "step 1 after a move");
    let joined = shared.slice(ndarray::s![2..3, ..]).to_owned();
    assert_close(&joined, &fourth_first, "a sentence in a freed slot");
}

#[test]
fn texts_encoded_in_one_run_and_placed_apart_step_like_texts_encoded_alone() {
    let mut backend = backend();
    let bos = i64::from(package().manifest.bos_id);
    // Of unlike lengths (the run pads to the longest), one repeated (encoded once, two rows).
    let sources: Vec<Vec<i64>> = [SENTENCES[3], SENTENCES[0], SENTENCES[3], SENTENCES[1]]
        .iter()
        .map(|s| source_ids(s))
        .collect();
    let refs: Vec<&[i64]> = sources.iter().map(|s| s.as_slice()).collect();
    let encoded = backend.encode(&refs).unwrap();
    let mut each: Vec<Option<OrtEncoded>> = backend.split(encoded).into_iter().map(Some).collect();
    assert_eq!(each.len(), sources.len());
    // Placed one call at a time, in another order than the run's: slot s takes text order[s].
    let order = [3, 1, 0, 2];
    let mut rows = OrtRows::default();
    for (slot, &text) in order.iter().enumerate() {
        let encoded = each[text].take().unwrap();
        backend.place(&mut rows, encoded, &[slot]).unwrap();
    }
    let together = backend
        .step(&mut rows, &[bos; 4], &[0; 4], &[0; 4])
        .unwrap();
    for (slot, &text) in order.iter().enumerate() {
        let mut alone = OrtRows::default();
        let encoded = backend.encode(&[sources[text].as_slice()]).unwrap();
        backend.place(&mut alone, encoded, &[0]).unwrap();
        let expected = backend.step(&mut alone, &[bos], &[0], &[0]).unwrap();
        let got = together.slice(ndarray::s![slot..slot + 1, ..]).to_owned();
        assert_close(&got, &expected, &format!("text {text} in slot {slot}"));
    }
}

#[test]
fn rows_that_join_a_running_batch_continue_like_a_fresh_batch() {
    let mut backend = backend();
    let bos = i64::from(package().manifest.bos_id);
    let deviation = nmt_engine::backend::batching_deviation(
        &mut backend,
        &source_ids(SENTENCES[4]),
        &source_ids(SENTENCES[1]),
        [bos, 7, 11, 13, 17],
    )
    .unwrap();
    assert!(
        deviation < 1e-3,
        "logits move by {deviation} in a shared batch"
    );
}

#[tokio::test]
async fn concurrent_requests_get_the_answers_they_get_alone() {
    let mut alone = Vec::new();
    for text in SENTENCES {
        let (status, json) = post_translate(serde_json::json!({ "text": text })).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        alone.push(
            json["translations"][0]["text"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let handles: Vec<_> = SENTENCES
        .iter()
        .map(|text| tokio::spawn(post_translate(serde_json::json!({ "text": text }))))
        .collect();
    for (handle, expected) in handles.into_iter().zip(&alone) {
        let (status, json) = handle.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{json}");
        assert_eq!(json["translations"][0]["text"].as_str().unwrap(), expected);
    }
}

#[test]
fn a_manifest_that_disagrees_with_the_graphs_is_rejected() {
    let source = package_dir();
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let path = dir.path().join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["decoder_state"]
        .as_array_mut()
        .expect("decoder_state is a list")
        .push(serde_json::json!({"name": "bogus", "dims": ["batch", "time"]}));
    std::fs::write(&path, manifest.to_string()).unwrap();

    let err = match nmt_server::load(&Args::for_model(dir.path())) {
        Ok(_) => panic!("a manifest with an extra state was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("no input `past.bogus`"), "{err}");
    assert!(err.contains("no output `present.bogus`"), "{err}");
}

#[tokio::test]
async fn inputs_over_the_limit_are_refused_before_the_model() {
    let infer = state();
    // The limit `GET /models` reports: the model's own or the server's, whichever is lower.
    let limit = infer.model_infos()[0].limits.max_input_tokens;
    let text = "the ".repeat(limit + 1);
    let (status, json) = post_translate(serde_json::json!({"text": ["Jesus wept.", text]})).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
    assert_eq!(json["error_type"], "input_too_long");
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .contains(&format!("the limit is {limit}")),
        "{json}"
    );
}

#[tokio::test]
async fn text_that_looks_like_a_control_token_is_translated_as_text() {
    // `</s>` read as EOS would end the source at once: an empty or unrelated translation.
    let (status, json) = post_translate(serde_json::json!({
        "text": ["</s>", "<s>Jesus wept.</s>", "Jesus wept. <pad><pad>"]
    }))
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    for t in &response.translations {
        assert!(t.source_tokens >= 2, "{t:?}");
        assert!(!t.text.trim().is_empty(), "{t:?}");
    }
}

#[tokio::test]
async fn the_shipped_length_predictor_predicts_natural_lengths_alone_or_batched() {
    // The shipped package is length-aware with a predictor (installed by scripts/setup.sh):
    // a request without a length gets the predicted one, the same alone as in a batch.
    let (status, json) = post_translate(serde_json::json!({ "text": SENTENCES })).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let batched: TranslateResponse = serde_json::from_value(json).unwrap();
    for (text, t) in SENTENCES.iter().zip(&batched.translations) {
        assert_eq!(
            t.length_source,
            Some(nmt_engine::length::LengthSource::Predictor),
            "{t:?}"
        );
        let predicted = t.predicted_length.unwrap();
        // Spanish runs about as long as the English source in subwords.
        let ratio = predicted / t.source_tokens as f64;
        assert!((0.6..1.8).contains(&ratio), "{text}: {t:?}");
        let (_, alone) = post_translate(serde_json::json!({ "text": text })).await;
        let alone = alone["translations"][0]["predicted_length"]
            .as_f64()
            .unwrap();
        assert!(
            (alone - predicted).abs() < 1e-3,
            "{text}: {alone} vs {predicted}"
        );
    }
}

/// A service of its own (the tests here hold its predictor's turn, which would hold up the
/// other tests' predictions), with `configure` applied to its arguments.
fn own_state(configure: impl FnOnce(&mut Args)) -> nmt_server::Infer {
    let mut args = Args::for_model(package_dir());
    configure(&mut args);
    let infer = nmt_server::load(&args).unwrap_or_else(|e| panic!("{e:#}"));
    infer.set_ready(true);
    infer
}

async fn post_to(
    infer: &nmt_server::Infer,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    let request = Request::post("/translate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app(infer.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Polls `condition` every millisecond for up to 10 s.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn a_large_request_gives_the_length_predictor_back_between_chunks() {
    // Turns at the predictor are first come, first served. A request of 64 texts takes one
    // per chunk of 8, so whoever came while it predicted is served after its first chunk,
    // not after all 64 (issue 12.3: small requests beside a large one).
    let infer = own_state(|_| {});
    let model = infer.models().next().unwrap();
    let predictor = model
        .pipeline
        .length
        .predictor
        .clone()
        .expect("a predictor");
    let held = predictor.turn_unless_busy().await.unwrap();
    let texts: Vec<&str> = SENTENCES.iter().cycle().take(64).copied().collect();
    let large = {
        let infer = infer.clone();
        tokio::spawn(async move { post_to(&infer, serde_json::json!({ "text": texts })).await })
    };
    eventually("the large request waits for a turn", || {
        predictor.waiting() == 1
    })
    .await;
    // The test is the next client.
    let next = {
        let predictor = predictor.clone();
        tokio::spawn(async move { predictor.turn_unless_busy().await })
    };
    eventually("the next client waits too", || predictor.waiting() == 2).await;
    drop(held);
    let turn = next.await.unwrap().expect("a turn");
    // Its turn came after one chunk of the large request, whose next chunk now waits for it.
    eventually("the large request waits for its next chunk's turn", || {
        predictor.waiting() == 1
    })
    .await;
    assert!(!large.is_finished());
    drop(turn);
    let (status, json) = large.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    assert_eq!(response.translations.len(), 64);
    for t in &response.translations {
        assert_eq!(
            t.length_source,
            Some(nmt_engine::length::LengthSource::Predictor),
            "{t:?}"
        );
    }
}

#[tokio::test]
async fn a_request_the_door_refuses_is_refused_before_its_length_is_predicted() {
    // One row, and a wait limit no request behind another meets: while one request decodes,
    // every other is refused. The refusal must not wait for the predictor (held here by the
    // test): under overload, predictions for requests refused anyway took the model's CPU.
    let infer = own_state(|args| {
        args.max_batch_size = nmt_engine::limits::BatchRows::Most(1);
        args.max_queue_wait = Some(0.001);
    });
    let model = infer.models().next().unwrap();
    let predictor = model
        .pipeline
        .length
        .predictor
        .clone()
        .expect("a predictor");
    // An asked length needs no prediction: 250 steps keep the row busy.
    let busy = {
        let infer = infer.clone();
        tokio::spawn(async move {
            post_to(
                &infer,
                serde_json::json!({ "text": SENTENCES[1], "target_length": 250 }),
            )
            .await
        })
    };
    let in_flight = |infer: &nmt_server::Infer| {
        infer
            .metrics()
            .render()
            .lines()
            .any(|l| l.starts_with("nmt_sequences_in_flight{") && l.ends_with(" 1"))
    };
    eventually("the first request decodes", || in_flight(&infer)).await;
    let held = predictor.turn_unless_busy().await.unwrap();
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        post_to(&infer, serde_json::json!({ "text": SENTENCES[0] })),
    )
    .await
    .expect("refused without waiting for the predictor");
    assert_eq!(refused.0, StatusCode::TOO_MANY_REQUESTS, "{}", refused.1);
    assert_eq!(refused.1["error_type"], "overloaded", "{}", refused.1);
    assert_eq!(predictor.waiting(), 0);
    drop(held);
    let (status, json) = busy.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{json}");
}
