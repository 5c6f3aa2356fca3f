//! The JSON API over [`nmt_server::app`], in-process, with the copy backend of
//! [`nmt_server::testing`] (no ONNX Runtime): routes, limits and the error shape, request ids,
//! readiness, timeouts, the queue, metrics and the OpenAPI document.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use nmt_engine::length::{LengthMode, LengthSource, MAX_CHARS_LIMIT};
use nmt_server::scheduler::{Batching, SchedulerConfig};
use nmt_server::service::RequestLimits;
use nmt_server::testing::{self, CopyBackend};
use nmt_server::transport::error::ErrorBody;
use nmt_server::transport::http::compat::Api;
use nmt_server::transport::http::{openapi_json, Models, REQUEST_ID};
use nmt_server::{app, Infer, LengthCandidate, TranslateResponse, Translation};
use tower::ServiceExt;

fn limits() -> RequestLimits {
    RequestLimits {
        max_texts_per_request: 3,
        max_input_tokens: 5,
        max_output_tokens: 64,
        max_body_bytes: 256,
        max_length_ratio: 2.0,
        max_length_offset: 10,
        length_pull: nmt_engine::length::DEFAULT_LENGTH_PULL,
        runaway_ratio: nmt_engine::length::DEFAULT_RUNAWAY_RATIO,
        no_repeat_ngram_size: 0,
        exact_plans: nmt_engine::limits::DEFAULT_EXACT_PLANS,
        request_timeout: Duration::from_secs(10),
    }
}

fn scheduler() -> SchedulerConfig {
    SchedulerConfig {
        batching: Batching::Continuous,
        max_batch_size: 16,
        max_batch_tokens: 4096,
        max_queued_requests: 16,
        max_queue_wait: Duration::from_secs(60),
        request_timeout: Duration::from_secs(60),
    }
}

fn state_with(backend: CopyBackend) -> Infer {
    testing::infer(backend, limits(), scheduler())
}

async fn send(app: Router, request: Request<Body>) -> (StatusCode, serde_json::Value) {
    let (status, _, json) = send_full(app, request).await;
    (status, json)
}

async fn send_full(
    app: Router,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {bytes:?}"));
    (status, headers, json)
}

fn post_json(body: impl Into<String>) -> Request<Body> {
    Request::post("/translate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.into()))
        .unwrap()
}

async fn post(body: &str) -> (StatusCode, serde_json::Value) {
    send(app(state_with(CopyBackend::default())), post_json(body)).await
}

/// `body` posted to a fresh app is refused with 422 and `error_type`.
async fn assert_422(body: &str, error_type: &str) {
    let (status, json) = post(body).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, error_type),
        "{body}: {message}"
    );
}

fn error_of(status: StatusCode, json: serde_json::Value) -> (StatusCode, String, String) {
    let body: ErrorBody = serde_json::from_value(json).expect("error body shape");
    (status, body.error_type, body.error)
}

#[tokio::test]
async fn translates_one_text_and_a_list_in_order() {
    let (status, json) = post(r#"{"text": "Hello world"}"#).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    assert_eq!(response.model, "dev-copy");
    assert_eq!(
        response.translations,
        vec![Translation {
            text: "hello world".into(),
            source_tokens: 2,
            output_tokens: 2,
            target_length: None,
            length_source: None,
            predicted_length: None,
            length_mode: None,
            truncated: false,
            sentences: None,
            length_candidates: None,
        }]
    );

    let (status, json) = post(
        r#"{"text": ["the red house", "a dog", "one two three four five"], "model": "dev-copy"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    let texts: Vec<_> = response
        .translations
        .iter()
        .map(|t| t.text.as_str())
        .collect();
    assert_eq!(
        texts,
        vec!["the red house", "a dog", "one two three four five"]
    );
    let counts: Vec<_> = response
        .translations
        .iter()
        .map(|t| t.source_tokens)
        .collect();
    assert_eq!(counts, vec![3, 2, 5]);
}

#[tokio::test]
async fn health_is_ok() {
    let request = Request::get("/health").body(Body::empty()).unwrap();
    let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json, serde_json::json!({"status": "ok"}));
}

#[tokio::test]
async fn malformed_json_is_400() {
    let (status, json) = post(r#"{"text": "#).await;
    let (status, ty, _) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::BAD_REQUEST, "invalid_json")
    );
}

#[tokio::test]
async fn missing_or_wrong_fields_are_422() {
    for body in [
        r#"{}"#,
        r#"{"txt": "hello"}"#,
        r#"{"text": 5}"#,
        r#"{"text": ["hello", 5]}"#,
        r#"{"text": "hello", "model": 3}"#,
        r#"["hello"]"#,
    ] {
        assert_422(body, "invalid_request").await;
    }
    let (status, json) = post(r#"{"text": 5}"#).await;
    let (_, _, message) = error_of(status, json);
    assert!(
        message.contains("a string or a list of strings"),
        "{message}"
    );
}

#[tokio::test]
async fn empty_texts_are_422() {
    for body in [
        r#"{"text": []}"#,
        r#"{"text": ""}"#,
        r#"{"text": ["hello", "  \n"]}"#,
        // Invisible characters only: a model would invent a translation out of nothing.
        r#"{"text": ["hello", "\u200b\u200d"]}"#,
        r#"{"text": "\ufeff \u2060\u00ad"}"#,
    ] {
        let (status, json) = post(body).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "empty_text"),
            "{body}: {message}"
        );
    }
}

#[tokio::test]
async fn unknown_model_is_404() {
    let (status, json) = post(r#"{"text": "hello", "model": "other"}"#).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::NOT_FOUND, "model_not_found")
    );
    assert!(message.contains("dev-copy"), "{message}");
}

#[tokio::test]
async fn limits_are_413_and_name_the_limit() {
    let (status, json) = post(r#"{"text": ["a", "a", "a", "a"]}"#).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_many_texts")
    );
    assert!(message.contains("limit is 3"), "{message}");

    let (status, json) = post(r#"{"text": ["a", "one two three four five six"]}"#).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "input_too_long")
    );
    assert!(
        message.contains("text 1 has 6 subword tokens; the limit is 5"),
        "{message}"
    );

    let big = format!(r#"{{"text": "{}"}}"#, "a ".repeat(200));
    let (status, json) = post(&big).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    assert!(message.contains("256 bytes"), "{message}");
}

#[tokio::test]
async fn missing_content_type_is_415_in_the_error_shape() {
    let request = Request::post("/translate")
        .body(Body::from(r#"{"text": "hello"}"#))
        .unwrap();
    let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
    let (status, ty, _) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_use_the_error_shape() {
    let request = Request::get("/nope").body(Body::empty()).unwrap();
    let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
    assert_eq!(error_of(status, json).1, "not_found");
    let request = Request::get("/translate").body(Body::empty()).unwrap();
    let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
    let (status, ty, _) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
}

#[tokio::test]
async fn model_failures_are_500() {
    let backend = CopyBackend {
        fail: true,
        ..Default::default()
    };
    let (status, json) = send(app(state_with(backend)), post_json(r#"{"text": "hello"}"#)).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "internal")
    );
    assert!(message.contains("injected failure"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_whose_decoder_fails_mid_batch_recovers_and_spares_the_other() {
    // `fragile`'s third decoder step fails, once, as an ONNX Runtime session error would.
    let fragile = CopyBackend {
        fail_on_step: Some(3),
        step_delay: Duration::from_millis(2),
        ..Default::default()
    };
    let service = testing::service(
        vec![
            testing::TestModel::copy("fragile", fragile),
            testing::TestModel::copy("sound", CopyBackend::default()),
        ],
        "fragile",
        limits(),
        scheduler(),
    );
    let app = app(service.infer.clone());
    let request = |model: &str, text: &str| {
        post_json(serde_json::json!({"text": text, "model": model}).to_string())
    };
    // Five words take six steps: the request is two steps into its decoding when it fails.
    let (failed, beside) = tokio::join!(
        send(app.clone(), request("fragile", "one two three four five")),
        send(app.clone(), request("sound", "one two three four five")),
    );
    let (status, json) = failed;
    assert_eq!(json.as_object().map(|o| o.len()), Some(2), "{json}");
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "internal")
    );
    assert!(message.contains("injected failure at step 3"), "{message}");
    assert_eq!(beside.0, StatusCode::OK, "{}", beside.1);
    assert_eq!(
        beside.1["translations"][0]["text"],
        "one two three four five"
    );

    // Both workers are alive and answer the next requests.
    for (model, text) in [
        ("fragile", "the red house"),
        ("sound", "a dog"),
        ("fragile", "hello"),
    ] {
        let (status, json) = send(app.clone(), request(model, text)).await;
        assert_eq!(status, StatusCode::OK, "{model}: {json}");
        assert_eq!(json["model"], model);
        assert_eq!(json["translations"][0]["text"], text);
    }
    assert!(service.workers.iter().all(|worker| !worker.is_finished()));
    let metrics = service.infer.metrics().render();
    for line in [
        "nmt_errors_total{type=\"internal\"} 1",
        "nmt_sequences_in_flight{model=\"fragile\"} 0",
        "nmt_sequences_in_flight{model=\"sound\"} 0",
        "nmt_queue_depth{model=\"fragile\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing `{line}` in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn models_are_listed_with_their_variant_and_limits() {
    let request = Request::get("/models").body(Body::empty()).unwrap();
    let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["default"], "dev-copy");
    let models = json["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    let (rel, abs) = (&models[0], &models[1]);
    assert_eq!(rel["name"], "dev-copy");
    assert_eq!(rel["default"], true);
    assert_eq!(rel["variant"]["relative_attention"], "keys_values");
    assert_eq!(rel["variant"]["absolute_position"], "none");
    assert_eq!(rel["limits"]["max_input_tokens"], 5);
    assert_eq!(rel["limits"]["input_limit_from"], "server");
    assert_eq!(rel["precision"], "float32");
    assert_eq!(abs["variant"]["absolute_position"], "sinusoidal");
    assert_eq!(abs["limits"]["max_input_tokens"], 3);
    assert_eq!(abs["limits"]["input_limit_from"], "model");
}

#[tokio::test]
async fn a_request_picks_its_model_and_meets_that_models_limit() {
    let (status, json) = post(r#"{"text": "one two three four", "model": "dev-copy-abs"}"#).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "input_too_long")
    );
    assert!(
        message.contains("the limit is 3 (the longest input model `dev-copy-abs` can take)"),
        "{message}"
    );
    let (status, json) = post(r#"{"text": "one two three four"}"#).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["model"], "dev-copy");
    let (status, json) = post(r#"{"text": "one two", "model": "dev-copy-abs"}"#).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["model"], "dev-copy-abs");
    assert_eq!(json["translations"][0]["text"], "one two");
}

#[tokio::test]
async fn a_target_length_is_met_and_reported() {
    let (status, json) = post(
        r#"{"text": ["hello world", "the cat sat"], "target_length": 4, "length_mode": "exact"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    for t in &response.translations {
        assert_eq!((t.output_tokens, t.target_length), (4, Some(4)), "{t:?}");
    }
    // The copy model wants EOS after the source; banned, it pads (skipped on output).
    assert_eq!(response.translations[0].text, "hello world");

    let (status, json) =
        post(r#"{"text": "the cat sat", "target_length": "source", "length_mode": "exact"}"#).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    let t = &response.translations[0];
    assert_eq!(
        (t.text.as_str(), t.output_tokens, t.target_length),
        ("the cat sat", 3, Some(3))
    );
    assert_eq!(
        (t.length_source, t.length_mode, t.predicted_length),
        (Some(LengthSource::Source), Some(LengthMode::Exact), None)
    );
}

#[tokio::test]
async fn max_chars_is_never_exceeded_and_never_cuts_a_word() {
    // The copy model has no length encoding: exact mode, 4 characters a subword.
    let (status, json) = post(
        r#"{"text": ["hello world again", "the cat"], "max_chars": 9, "length_mode": "exact"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    let [long, short] = &response.translations[..] else {
        panic!("{response:?}")
    };
    assert_eq!(
        (long.text.as_str(), long.truncated),
        ("hello", false),
        "{long:?}"
    );
    assert_eq!(long.length_source, Some(LengthSource::MaxChars));
    // Two subwords fit the budget of 9 characters.
    assert_eq!(
        (short.text.as_str(), short.truncated),
        ("the cat", false),
        "{short:?}"
    );
}

#[tokio::test]
async fn a_cut_translation_reports_the_subwords_it_kept() {
    // Even one subword ("hello", 5 characters) is over 3 characters: no whole word fits, so
    // the first is cut to the budget, and the response counts the subwords of what it sends
    // ("hel" is one, `<unk>`, to the test tokenizer), not of what was decoded.
    let (status, json) =
        post(r#"{"text": "hello world", "max_chars": 3, "length_mode": "exact"}"#).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json).unwrap();
    let t = &response.translations[0];
    assert_eq!(
        (t.text.as_str(), t.truncated, t.output_tokens),
        ("hel", true, 1),
        "{t:?}"
    );
}

#[tokio::test]
async fn bad_target_lengths_are_422() {
    for (body, expected) in [
        (
            r#"{"text": "hello", "target_length": 0}"#,
            "invalid_target_length",
        ),
        (
            r#"{"text": "hello", "target_length": 65}"#,
            "invalid_target_length",
        ),
        (
            r#"{"text": "hello", "target_length": -3}"#,
            "invalid_request",
        ),
        (
            r#"{"text": "hello", "target_length": "long"}"#,
            "invalid_request",
        ),
        (
            r#"{"text": "hello", "target_length": "auto"}"#,
            "unsupported",
        ),
        // No length encoding: only exact mode can meet a length.
        (r#"{"text": "hello", "target_length": 3}"#, "unsupported"),
        (r#"{"text": "hello", "max_chars": 40}"#, "unsupported"),
        (
            r#"{"text": "hello", "target_length": 3, "length_mode": "loose"}"#,
            "invalid_request",
        ),
        (
            r#"{"text": "hello", "max_chars": 0, "length_mode": "exact"}"#,
            "invalid_target_length",
        ),
        (
            r#"{"text": "hello", "max_chars": -5, "length_mode": "exact"}"#,
            "invalid_request",
        ),
    ] {
        assert_422(body, expected).await;
    }
}

#[tokio::test]
async fn an_ngram_ban_is_a_size_from_0_to_64() {
    for body in [
        r#"{"text": "hello", "no_repeat_ngram_size": 65}"#,
        r#"{"text": "hello", "no_repeat_ngram_size": -1}"#,
        r#"{"text": "hello", "no_repeat_ngram_size": "6"}"#,
    ] {
        assert_422(body, "invalid_request").await;
    }
    for size in [0, 1, 64] {
        let body = format!(r#"{{"text": "hello world", "no_repeat_ngram_size": {size}}}"#);
        let (status, json) = post(&body).await;
        assert_eq!(status, StatusCode::OK, "{body}: {json}");
        assert_eq!(json["translations"][0]["text"], "hello world", "{body}");
    }
}

#[tokio::test]
async fn request_ids_are_kept_or_made() {
    let app = app(state_with(CopyBackend::default()));
    let mut request = post_json(r#"{"text": "hello"}"#);
    request
        .headers_mut()
        .insert(REQUEST_ID, HeaderValue::from_static("client-id-7"));
    let (_, headers, _) = send_full(app.clone(), request).await;
    assert_eq!(headers[&REQUEST_ID], "client-id-7");
    let (_, headers, _) = send_full(app, post_json(r#"{"text": ""}"#)).await;
    let made = headers[&REQUEST_ID].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(made).is_ok(), "{made}");
}

#[tokio::test]
async fn not_ready_is_503_until_warmed_up() {
    let infer = state_with(CopyBackend::default());
    infer.set_ready(false);
    let app = app(infer.clone());
    let ready = || Request::get("/ready").body(Body::empty()).unwrap();
    let (status, headers, json) = send_full(app.clone(), ready()).await;
    assert_eq!(error_of(status, json).1, "not_ready");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let (status, json) = send(app.clone(), post_json(r#"{"text": "hello"}"#)).await;
    assert_eq!(
        (status, error_of(status, json).1.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "not_ready")
    );
    // The refused translation is an error; the probe's 503 is not, and neither has a
    // latency.
    let metrics = infer.metrics().render();
    assert!(
        metrics.contains("nmt_errors_total{type=\"not_ready\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("nmt_request_duration_seconds_count"),
        "{metrics}"
    );
    infer.warm_up().await.unwrap();
    let (status, json) = send(app, ready()).await;
    assert_eq!(
        (status, json),
        (StatusCode::OK, serde_json::json!({"status": "ready"}))
    );
}

#[tokio::test]
async fn a_timeout_is_504_and_spares_the_rest_of_the_batch() {
    let backend = CopyBackend {
        step_delay: Duration::from_millis(20),
        ..Default::default()
    };
    let infer = testing::infer(
        backend,
        RequestLimits {
            max_input_tokens: 40,
            request_timeout: Duration::from_millis(300),
            ..limits()
        },
        scheduler(),
    );
    let app = app(infer.clone());
    // 21 steps of 20 ms: past the timeout. Beside it, 3 steps.
    let long = format!(r#"{{"text": "{}"}}"#, "one two three four five ".repeat(4));
    let slow = tokio::spawn(send(app.clone(), post_json(long)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (status, json) = send(app.clone(), post_json(r#"{"text": "hello world"}"#)).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let (status, json) = slow.await.unwrap();
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::GATEWAY_TIMEOUT, "timeout")
    );
    assert!(message.contains("0.3 s"), "{message}");
    let metrics = infer.metrics().render();
    assert!(
        metrics.contains("nmt_errors_total{type=\"timeout\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_full_queue_is_429_with_retry_after() {
    let backend = CopyBackend {
        step_delay: Duration::from_millis(30),
        ..Default::default()
    };
    let infer = testing::infer(
        backend,
        limits(),
        SchedulerConfig {
            max_batch_size: 1,
            max_queued_requests: 1,
            ..scheduler()
        },
    );
    let app = app(infer);
    let body = r#"{"text": "one two three four five"}"#;
    // The first runs (6 steps), the second waits for its row, the third finds the
    // queue full.
    let first = tokio::spawn(send(app.clone(), post_json(body)));
    tokio::time::sleep(Duration::from_millis(40)).await;
    let second = tokio::spawn(send(app.clone(), post_json(body)));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, headers, json) = send_full(app.clone(), post_json(body)).await;
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "overloaded")
    );
    assert!(message.contains("queue is full"), "{message}");
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(second.await.unwrap().0, StatusCode::OK);
}

#[tokio::test]
async fn metrics_are_exported_by_model_and_input_length() {
    let infer = state_with(CopyBackend::default());
    let app = app(infer);
    send(
        app.clone(),
        post_json(
            r#"{"text": ["hello world", "a dog"], "target_length": 3, "length_mode": "exact"}"#,
        ),
    )
    .await;
    send(app.clone(), post_json(r#"{"text": 7}"#)).await;
    let response = app
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    for line in [
        "nmt_request_duration_seconds_count{input_length=\"1-16\",model=\"dev-copy\"} 1",
        "nmt_queue_duration_seconds_count{input_length=\"1-16\",model=\"dev-copy\"} 1",
        "nmt_inference_duration_seconds_count{input_length=\"1-16\",model=\"dev-copy\"} 1",
        "nmt_time_per_output_token_seconds_count{input_length=\"1-16\",model=\"dev-copy\"} 2",
        "nmt_input_length_tokens_sum{model=\"dev-copy\"} 4",
        "nmt_output_length_tokens_sum{model=\"dev-copy\"} 6",
        "nmt_length_deviation_tokens_sum{model=\"dev-copy\"} 0",
        "nmt_length_deviation_tokens_count{model=\"dev-copy\"} 2",
        "nmt_batch_size_count{model=\"dev-copy\"} 3",
        // The request's two texts join together, alike in length: one run.
        "nmt_encoder_run_texts_count{model=\"dev-copy\"} 1",
        "nmt_encoder_run_texts_sum{model=\"dev-copy\"} 2",
        "nmt_queue_depth{model=\"dev-copy\"} 0",
        "nmt_sequences_in_flight{model=\"dev-copy\"} 0",
        "nmt_errors_total{type=\"invalid_request\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in\n{text}"
        );
    }
}

fn openapi() -> serde_json::Value {
    serde_json::from_str(openapi_json()).unwrap()
}

/// The schema `schema` stands for: itself, or the component its `$ref` names.
fn resolve<'a>(doc: &'a serde_json::Value, schema: &'a serde_json::Value) -> &'a serde_json::Value {
    match schema["$ref"].as_str() {
        Some(name) => {
            let name = name.strip_prefix("#/components/schemas/").unwrap();
            &doc["components"]["schemas"][name]
        }
        None => schema,
    }
}

#[tokio::test]
async fn the_openapi_document_describes_every_route_and_error_type() {
    let doc = openapi();
    let paths = doc["paths"].as_object().unwrap();
    let app = app(state_with(CopyBackend::default()));
    for (path, methods) in paths {
        for method in methods.as_object().unwrap().keys() {
            let request = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(r#"{"text": "hello"}"#))
                .unwrap();
            let status = app.clone().oneshot(request).await.unwrap().status();
            assert!(
                status != StatusCode::NOT_FOUND && status != StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}: {status}"
            );
        }
    }
    let documented: Vec<&str> = doc["components"]["schemas"]["Error"]["properties"]["error_type"]
        ["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for error in testing::every_api_error() {
        assert!(
            documented.contains(&error.error_type()),
            "{} is not in openapi.json",
            error.error_type()
        );
    }
}

#[tokio::test]
async fn the_openapi_schemas_list_every_field_of_the_json_api() {
    let doc = openapi();
    let schemas = &doc["components"]["schemas"];
    // serde_json's maps are ordered, so the keys come sorted.
    let keys = |object: &serde_json::Value| -> Vec<String> {
        object.as_object().unwrap().keys().cloned().collect()
    };
    let documented = |schema: &serde_json::Value| keys(&schema["properties"]);
    // Every documented request field is accepted (unknown fields are refused).
    let app = app(state_with(CopyBackend::default()));
    let mut request = serde_json::json!({
        "text": "hello world", "model": "dev-copy", "target_length": 2,
        "length_mode": "exact", "max_chars": 40, "no_repeat_ngram_size": 3,
        "split_sentences": false, "target_chars": null,
    });
    assert_eq!(documented(&schemas["TranslateRequest"]), keys(&request));
    let (status, json) = send(app.clone(), post_json(request.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    request["colour"] = "red".into();
    let (status, _) = send(app.clone(), post_json(request.to_string())).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // Every field a translation can carry is documented, and nothing more.
    let full = every_field_set();
    assert_eq!(
        documented(&schemas["Translation"]),
        keys(&serde_json::to_value(&full).unwrap())
    );
    let response = app
        .oneshot(Request::get("/models").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let models: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        documented(resolve(
            &doc,
            &schemas["Models"]["properties"]["models"]["items"]
        )),
        keys(&models["models"][0])
    );
}

#[tokio::test]
async fn every_json_answer_has_exactly_the_documented_fields_and_the_required_ones_always() {
    let doc = openapi();
    let schema = |name: &str| {
        let schema = &doc["components"]["schemas"][name];
        assert!(schema.is_object(), "no schema {name}");
        schema
    };
    let keys = |object: &serde_json::Value| -> Vec<String> {
        let mut keys: Vec<String> = object.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let strings = |list: &serde_json::Value| -> Vec<String> {
        let mut list: Vec<String> = list
            .as_array()
            .map(|l| l.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        list.sort();
        list
    };
    // What a schema documents and requires must be what the answer carries when every field
    // is set, and when only those always sent are: a field added to a struct without its
    // schema following, or one made optional on the wire but documented as required (or the
    // other way round), fails here.
    let check = |name: &str, full: &serde_json::Value, bare: &serde_json::Value| {
        let schema = schema(name);
        assert_eq!(
            keys(&schema["properties"]),
            keys(full),
            "{name}: properties"
        );
        assert_eq!(strings(&schema["required"]), keys(bare), "{name}: required");
    };

    let full = every_field_set();
    let bare = Translation {
        target_length: None,
        length_source: None,
        predicted_length: None,
        length_mode: None,
        truncated: false,
        sentences: None,
        length_candidates: None,
        ..full.clone()
    };
    check("Translation", &json(&full), &json(&bare));
    let candidate = full.length_candidates.clone().unwrap().remove(0);
    let bare_candidate = LengthCandidate {
        target_length: None,
        planned_length: None,
        ..candidate.clone()
    };
    check("LengthCandidate", &json(&candidate), &json(&bare_candidate));
    let response = TranslateResponse {
        model: "dev-copy".into(),
        translations: vec![full],
    };
    check("TranslateResponse", &json(&response), &json(&response));
    let error = ErrorBody {
        error: "no".into(),
        error_type: "internal".into(),
    };
    check("Error", &json(&error), &json(&error));

    // `GET /models` as served, and its parts.
    let app = app(state_with(CopyBackend::default()));
    let request = Request::get("/models").body(Body::empty()).unwrap();
    let (status, served) = send(app.clone(), request).await;
    assert_eq!(status, StatusCode::OK);
    let models: Models = serde_json::from_value(served.clone()).unwrap();
    assert_eq!(json(&models), served);
    check("Models", &served, &served);
    let model = &served["models"][0];
    assert_eq!(
        model["domains"][0], "test words",
        "the manifest's training domains"
    );
    check("ModelInfo", model, model);
    check("Variant", &model["variant"], &model["variant"]);
    check("ModelLimits", &model["limits"], &model["limits"]);

    // A translation as served, with every length field the copy model fills in.
    let (status, served) = send(
        app,
        post_json(r#"{"text": "hello world", "target_length": 3, "length_mode": "exact"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{served}");
    let documented = keys(&schema("Translation")["properties"]);
    for field in keys(&served["translations"][0]) {
        assert!(documented.contains(&field), "{field} is not documented");
    }
}

fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap()
}

#[tokio::test]
async fn the_served_openapi_document_is_the_generated_one_and_agrees_with_the_limits() {
    let response = app(state_with(CopyBackend::default()))
        .oneshot(Request::get("/openapi.json").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, openapi_json().as_bytes());

    let doc = openapi();
    assert_eq!(doc["openapi"], "3.1.0");
    let request = &doc["components"]["schemas"]["TranslateRequest"];
    // utoipa takes a literal there, not the constant.
    assert_eq!(
        request["properties"]["max_chars"]["maximum"],
        MAX_CHARS_LIMIT
    );
    assert_eq!(
        request["properties"]["no_repeat_ngram_size"]["maximum"],
        nmt_engine::logits::MAX_NO_REPEAT_NGRAM_SIZE
    );
    let translate = &doc["paths"]["/translate"]["post"];
    let id = &translate["parameters"][0];
    assert_eq!(id["name"], REQUEST_ID.as_str());
    assert_eq!(
        id["schema"]["maxLength"],
        nmt_server::transport::request_id::MAX_LEN
    );

    // Every error status documented is one that some error has, and answers with the error
    // body (429 and 503 with a Retry-After as well).
    let statuses: Vec<u16> = testing::every_api_error()
        .iter()
        .map(|e| e.status().as_u16())
        .collect();
    // The compatible APIs answer in their own shapes (tests/compat.rs checks those).
    let own_paths = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(path, _)| Api::of(path).is_none());
    for (path, methods) in own_paths {
        for (method, operation) in methods.as_object().unwrap() {
            for (status, response) in operation["responses"].as_object().unwrap() {
                let code: u16 = status.parse().unwrap();
                if code < 400 {
                    continue;
                }
                assert!(statuses.contains(&code), "{method} {path}: {status}");
                let expected = match code {
                    429 | 503 => "#/components/responses/Retry",
                    _ => "#/components/responses/Error",
                };
                assert_eq!(response["$ref"], expected, "{method} {path}: {status}");
            }
        }
    }
    for name in ["Error", "Retry"] {
        let response = &doc["components"]["responses"][name];
        assert_eq!(
            response["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Error"
        );
    }
    assert!(doc["components"]["responses"]["Retry"]["headers"]["Retry-After"].is_object());
}

/// A translation with every optional field present.
fn every_field_set() -> Translation {
    Translation {
        text: "hola".into(),
        source_tokens: 1,
        output_tokens: 1,
        target_length: Some(1),
        length_source: Some(LengthSource::Predictor),
        predicted_length: Some(1.2),
        length_mode: Some(LengthMode::Soft),
        truncated: true,
        sentences: Some(2),
        length_candidates: Some(vec![LengthCandidate {
            target_length: Some(1),
            planned_length: Some(2),
            text: "hola".into(),
            characters: 4,
            output_tokens: 1,
            score: -0.5,
            complies: true,
            ended: true,
            chosen: true,
        }]),
    }
}

#[tokio::test]
async fn no_response_lets_a_browser_sniff_its_type() {
    let app = app(state_with(CopyBackend::default()));
    for request in [
        post_json(r#"{"text": "<script>hello</script>"}"#),
        post_json(r#"{"text": []}"#),
        Request::get("/models").body(Body::empty()).unwrap(),
        Request::get("/nowhere").body(Body::empty()).unwrap(),
    ] {
        let uri = request.uri().clone();
        let (_, headers, _) = send_full(app.clone(), request).await;
        assert_eq!(
            headers
                .get(header::X_CONTENT_TYPE_OPTIONS)
                .map(|v| v.as_bytes()),
            Some(&b"nosniff"[..]),
            "{uri}"
        );
    }
}

#[tokio::test]
async fn a_length_mode_of_the_wrong_type_is_the_requests_fault() {
    for mode in [
        "5",
        "true",
        r#"["exact"]"#,
        r#"{"exact": null}"#,
        r#""fast""#,
    ] {
        let body = format!(r#"{{"text": "hello", "target_length": 2, "length_mode": {mode}}}"#);
        let (status, json) = post(&body).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            "{mode}: {message}"
        );
        assert!(message.contains("length_mode"), "{mode}: {message}");
    }
    let (status, _) =
        post(r#"{"text": "hello", "target_length": 2, "length_mode": "exact"}"#).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = post(r#"{"text": "hello", "length_mode": null}"#).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn split_sentences_translates_sentence_by_sentence_and_keeps_the_whitespace() {
    // Each sentence is under the 5-token limit; the whole text is not.
    let body = serde_json::json!({
        "text": ["The red house.  A dog!\nOne two three?", "Five four."],
        "split_sentences": true,
    });
    let (status, json) = post(&body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let response: TranslateResponse = serde_json::from_value(json.clone()).unwrap();
    let [first, second] = &response.translations[..] else {
        panic!("one translation per text: {json}");
    };
    assert_eq!(first.sentences, Some(3), "{json}");
    assert_eq!(json["translations"][0]["sentences"], 3);
    assert_eq!(second.sentences, Some(1), "{json}");
    // The copy backend gives each sentence back, so the whole text comes back whole.
    let alone = |text: &str| {
        let body = serde_json::json!({ "text": text });
        async move {
            let (status, json) = post(&body.to_string()).await;
            assert_eq!(status, StatusCode::OK, "{json}");
            serde_json::from_value::<TranslateResponse>(json)
                .unwrap()
                .translations[0]
                .clone()
        }
    };
    let sentences = [
        alone("The red house.").await,
        alone("A dog!").await,
        alone("One two three?").await,
    ];
    assert_eq!(
        first.text,
        format!(
            "{}  {}\n{}",
            sentences[0].text, sentences[1].text, sentences[2].text
        )
    );
    assert!(
        sentences.iter().all(|t| !t.text.is_empty()),
        "{sentences:?}"
    );
    assert_eq!(
        first.output_tokens,
        sentences.iter().map(|t| t.output_tokens).sum::<usize>()
    );
    assert_eq!(
        first.source_tokens,
        sentences.iter().map(|t| t.source_tokens).sum::<usize>()
    );

    // Without it, the same text is one text, over the limit, and `sentences` is absent.
    let (status, json) = post(r#"{"text": "The red house."}"#).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert!(json["translations"][0].get("sentences").is_none(), "{json}");
    let (status, _) = post(r#"{"text": "The red house.  A dog!\nOne two three?"}"#).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn split_sentences_refusals() {
    for body in [
        r#"{"text": "Hi. Bye.", "split_sentences": true, "target_length": 3}"#,
        r#"{"text": "Hi. Bye.", "split_sentences": true, "max_chars": 30}"#,
        r#"{"text": "Hi. Bye.", "split_sentences": true, "target_chars": 30}"#,
        r#"{"text": "Hi. Bye.", "split_sentences": "yes"}"#,
    ] {
        let (status, json) = post(body).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            "{body}: {message}"
        );
        if !body.contains("yes") {
            assert!(message.contains("apply to whole texts"), "{message}");
        }
    }
    // Per-text "source" applies to each sentence.
    let (status, json) =
        post(r#"{"text": "Hi. Bye.", "split_sentences": true, "target_length": "source", "length_mode": "exact"}"#)
            .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["translations"][0]["sentences"], 2, "{json}");

    // The text count still applies to texts; a blank text is still empty.
    let (status, json) =
        post(r#"{"text": ["a.", "b.", "c.", "d."], "split_sentences": true}"#).await;
    assert_eq!(error_of(status, json).1, "too_many_texts");
    assert_422(
        r#"{"text": ["a.", " \n "], "split_sentences": true}"#,
        "empty_text",
    )
    .await;

    // The input limit applies to each sentence, and says which.
    let (status, json) =
        post(r#"{"text": ["a.", "Fine. One two three four five six."], "split_sentences": true}"#)
            .await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "input_too_long")
    );
    assert!(
        message.contains("sentence 1 of text 1 has") && message.contains("limit is 5"),
        "{message}"
    );

    // At most 16 sentences per text the request may hold (3 here): 48 pass, 49 do not.
    let sentences = |n: usize| "Hi. ".repeat(n);
    let body = |n| serde_json::json!({"text": sentences(n), "split_sentences": true}).to_string();
    let (status, json) = post(&body(48)).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["translations"][0]["sentences"], 48);
    let (status, json) = post(&body(49)).await;
    let (status, ty, message) = error_of(status, json);
    assert_eq!(
        (status, ty.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_many_texts")
    );
    assert!(
        message.contains("more than 48 sentences") && message.contains("16 times"),
        "{message}"
    );
}
