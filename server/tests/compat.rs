//! The LibreTranslate- and DeepL-compatible APIs over [`nmt_server::app`], in-process, with the
//! copy backend of [`nmt_server::testing`] (no ONNX Runtime; a translation is its source in
//! lower case): the fields as each API's clients send them, the answers' shapes, the errors in
//! each API's shape and statuses, the length fields, usage, metrics and the OpenAPI document.
//! `tests/tests/compat_clients.rs` drives the same routes with the real Python clients.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use nmt_server::scheduler::{Batching, SchedulerConfig};
use nmt_server::service::RequestLimits;
use nmt_server::testing::{self, CopyBackend};
use nmt_server::transport::http::compat::{deepl, libretranslate, Api};
use nmt_server::transport::http::openapi_json;
use nmt_server::{app, Infer};
use serde_json::{json, Value};
use tower::ServiceExt;

fn service(backend: CopyBackend, max_queued_requests: usize) -> Infer {
    let limits = RequestLimits {
        max_texts_per_request: 3,
        max_input_tokens: 5,
        max_body_bytes: 256,
        ..RequestLimits::default()
    };
    let scheduler = SchedulerConfig {
        batching: Batching::Continuous,
        max_batch_size: 1,
        max_batch_tokens: 4096,
        max_queued_requests,
        max_queue_wait: Duration::from_secs(60),
        request_timeout: Duration::from_secs(60),
    };
    testing::infer(backend, limits, scheduler)
}

fn server() -> Router {
    app(service(CopyBackend::default(), 16))
}

/// An answer: its status, its `Retry-After` if any, its body as JSON.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    json: Value,
}

async fn send(app: Router, request: Request<Body>) -> Answer {
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {bytes:?}"));
    Answer {
        status,
        retry_after,
        json,
    }
}

fn json_post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn form_post(path: &str, form: &str) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_string()))
        .unwrap()
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// `answer` is an error of `api`, in its shape (one field, its message) and `status`.
fn assert_error(api: Api, answer: &Answer, status: StatusCode, says: &str) {
    let key = match api {
        Api::LibreTranslate => "error",
        Api::DeepL => "message",
    };
    assert_eq!(answer.status, status, "{:?}", answer.json);
    let fields: Vec<&String> = answer.json.as_object().unwrap().keys().collect();
    assert_eq!(fields, [key], "{:?}", answer.json);
    let message = answer.json[key].as_str().unwrap();
    assert!(message.contains(says), "{message}");
}

#[tokio::test]
async fn libretranslate_answers_in_the_shape_of_q_from_json_a_form_or_the_query() {
    let app = server();
    let one = json!({"q": "Hello world", "source": "en", "target": "es"});
    let answer = send(app.clone(), json_post("/libretranslate/translate", &one)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json, json!({"translatedText": "hello world"}));

    let list = json!({"q": ["the red house", "a dog"], "source": "en", "target": "es"});
    let answer = send(app.clone(), json_post("/libretranslate/translate", &list)).await;
    assert_eq!(
        answer.json,
        json!({"translatedText": ["the red house", "a dog"]})
    );

    // libretranslatepy posts a form; deep-translator puts the fields in the query string of
    // an empty POST, with an API key.
    let form = "q=a+dog&source=en&target=es&format=text";
    let answer = send(app.clone(), form_post("/libretranslate/translate", form)).await;
    assert_eq!(answer.json, json!({"translatedText": "a dog"}));
    let query = Request::post(format!("/libretranslate/translate?{form}&api_key=x"))
        .body(Body::empty())
        .unwrap();
    let answer = send(app, query).await;
    assert_eq!(answer.json, json!({"translatedText": "a dog"}));
}

#[tokio::test]
async fn libretranslate_auto_reports_the_models_source_language_undetected() {
    let app = server();
    let one = json!({"q": "a dog", "source": "auto", "target": "es"});
    let answer = send(app.clone(), json_post("/libretranslate/translate", &one)).await;
    assert_eq!(
        answer.json,
        json!({
            "translatedText": "a dog",
            "detectedLanguage": {"confidence": 0.0, "language": "en"}
        })
    );
    let list = json!({"q": ["a dog", "the red house"], "source": "auto", "target": "es"});
    let answer = send(app.clone(), json_post("/libretranslate/translate", &list)).await;
    assert_eq!(answer.json["detectedLanguage"].as_array().unwrap().len(), 2);

    let answer = send(app, form_post("/libretranslate/detect", "q=bonjour")).await;
    assert_eq!(answer.json, json!([{"confidence": 0.0, "language": "en"}]));
}

#[tokio::test]
async fn libretranslate_lists_every_served_language_with_its_targets() {
    let answer = send(server(), get("/libretranslate/languages")).await;
    assert_eq!(
        answer.json,
        json!([
            {"code": "en", "name": "English", "targets": ["es"]},
            {"code": "es", "name": "Spanish", "targets": []},
        ])
    );
}

#[tokio::test]
async fn libretranslate_errors_are_its_shape_and_its_statuses() {
    let app = server();
    let api = Api::LibreTranslate;
    let translate = |body: Value| json_post("/libretranslate/translate", &body);
    for (body, says) in [
        (
            json!({"q": "a dog", "source": "en", "target": "fr"}),
            "this server translates en into es",
        ),
        (
            json!({"q": "<b>a dog</b>", "source": "en", "target": "es", "format": "html"}),
            "format `html` is not supported",
        ),
        (json!({"source": "en", "target": "es"}), "missing field `q`"),
        (json!({"q": "", "source": "en", "target": "es"}), "empty"),
        (
            json!({"q": "a b c d e f g", "source": "en", "target": "es"}),
            "subword",
        ),
        (
            json!({"q": "a dog", "source": "en", "target": "es", "model": "nowhere"}),
            "`nowhere` is not served",
        ),
    ] {
        let answer = send(app.clone(), translate(body)).await;
        assert_error(api, &answer, StatusCode::BAD_REQUEST, says);
    }
    let answer = send(app.clone(), get("/libretranslate/frontend/settings")).await;
    assert_error(api, &answer, StatusCode::NOT_FOUND, "no route");
    let long = format!("q={}&source=en&target=es", "a".repeat(300));
    let answer = send(app, form_post("/libretranslate/translate", &long)).await;
    assert_error(api, &answer, StatusCode::PAYLOAD_TOO_LARGE, "256 bytes");
}

#[tokio::test]
async fn deepl_translates_json_and_forms_and_bills_characters_when_asked() {
    let app = server();
    let body = json!({
        "text": ["Hello world", "a dog"], "target_lang": "ES",
        "show_billed_characters": true,
    });
    let answer = send(app.clone(), json_post("/v2/translate", &body)).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json);
    assert_eq!(
        answer.json,
        json!({"translations": [
            {"detected_source_language": "EN", "text": "hello world", "billed_characters": 11},
            {"detected_source_language": "EN", "text": "a dog", "billed_characters": 5},
        ]})
    );
    let form = "text=a+dog&text=the+red+house&source_lang=EN-GB&target_lang=ES-419";
    let answer = send(app.clone(), form_post("/v2/translate", form)).await;
    assert_eq!(
        answer.json,
        json!({"translations": [
            {"detected_source_language": "EN", "text": "a dog"},
            {"detected_source_language": "EN", "text": "the red house"},
        ]})
    );
    let answer = send(app, get("/v2/usage")).await;
    assert_eq!(
        answer.json,
        json!({"character_count": 34, "character_limit": deepl::CHARACTER_LIMIT})
    );
}

#[tokio::test]
async fn deepl_lists_source_and_target_languages_from_the_query_or_a_form_body() {
    let app = server();
    let source = send(app.clone(), get("/v2/languages")).await;
    assert_eq!(source.json, json!([{"language": "EN", "name": "English"}]));
    // An empty body is no JSON to parse, whatever its type says.
    let request = Request::get("/v2/languages?type=source")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(app.clone(), request).await.json, source.json);
    let expected = json!([{"language": "ES", "name": "Spanish", "supports_formality": false}]);
    let target = send(app.clone(), get("/v2/languages?type=target")).await;
    assert_eq!(target.json, expected);
    // The deepl client's GET with a form body.
    let request = Request::get("/v2/languages")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("type=target"))
        .unwrap();
    assert_eq!(send(app, request).await.json, expected);
}

#[tokio::test]
async fn deepl_errors_are_its_shape_and_its_statuses() {
    let app = server();
    let api = Api::DeepL;
    for (body, status, says) in [
        (
            json!({"text": ["a dog"], "target_lang": "DE"}),
            StatusCode::BAD_REQUEST,
            "no translation from any language into `DE`",
        ),
        (
            json!({"text": ["a dog"], "target_lang": "ES", "source_lang": "FR"}),
            StatusCode::BAD_REQUEST,
            "from `FR`",
        ),
        (
            json!({"text": ["a dog"], "target_lang": "ES", "tag_handling": "xml"}),
            StatusCode::BAD_REQUEST,
            "tag_handling",
        ),
        (
            json!({"text": ["a dog"], "target_lang": "ES", "max_chars": "many"}),
            StatusCode::BAD_REQUEST,
            "max_chars",
        ),
        (
            json!({"text": ["a", "b", "c", "d"], "target_lang": "ES"}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "the limit is 3",
        ),
    ] {
        let answer = send(app.clone(), json_post("/v2/translate", &body)).await;
        assert_error(api, &answer, status, says);
    }
    let answer = send(app.clone(), get("/v2/glossaries")).await;
    assert_error(api, &answer, StatusCode::NOT_FOUND, "no route");
    let answer = send(app, get("/v2/translate")).await;
    assert_error(api, &answer, StatusCode::METHOD_NOT_ALLOWED, "GET");
}

#[tokio::test]
async fn an_overloaded_server_is_429_with_retry_after_in_each_apis_shape() {
    let backend = CopyBackend {
        step_delay: Duration::from_millis(30),
        ..Default::default()
    };
    let app = app(service(backend, 1));
    let text = "one two three four five";
    let native = || json_post("/translate", &json!({"text": text}));
    // The first runs (6 steps), the second waits for its row, the next find the queue full.
    let first = tokio::spawn(send(app.clone(), native()));
    tokio::time::sleep(Duration::from_millis(40)).await;
    let second = tokio::spawn(send(app.clone(), native()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let libre = json!({"q": text, "source": "en", "target": "es"});
    let answer = send(app.clone(), json_post("/libretranslate/translate", &libre)).await;
    assert_error(
        Api::LibreTranslate,
        &answer,
        StatusCode::TOO_MANY_REQUESTS,
        "queue is full",
    );
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    let deepl = json!({"text": [text], "target_lang": "ES"});
    let answer = send(app.clone(), json_post("/v2/translate", &deepl)).await;
    assert_error(
        Api::DeepL,
        &answer,
        StatusCode::TOO_MANY_REQUESTS,
        "queue is full",
    );
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn the_length_fields_and_the_model_reach_both_apis() {
    let app = server();
    // The copy model makes a translation as long as it is asked for in exact mode.
    let deepl = json!({
        "text": ["the red house"], "target_lang": "ES",
        "target_length": 2, "length_mode": "exact",
    });
    let answer = send(app.clone(), json_post("/v2/translate", &deepl)).await;
    assert_eq!(answer.json["translations"][0]["text"], "the red");
    let form = "q=the+red+house&source=en&target=es&max_chars=7&length_mode=exact";
    let answer = send(app.clone(), form_post("/libretranslate/translate", form)).await;
    let text = answer.json["translatedText"].as_str().unwrap_or_default();
    assert!(
        !text.is_empty() && text.chars().count() <= 7,
        "{:?}",
        answer.json
    );
    // dev-copy-abs takes at most 3 subwords: the request went to the model it named.
    let named = json!({"q": "one two three four", "source": "en", "target": "es",
                       "model": "dev-copy-abs"});
    let answer = send(app, json_post("/libretranslate/translate", &named)).await;
    assert_error(
        Api::LibreTranslate,
        &answer,
        StatusCode::BAD_REQUEST,
        "dev-copy-abs",
    );
}

#[tokio::test]
async fn requests_are_counted_by_endpoint_and_compatible_errors_by_type() {
    let infer = service(CopyBackend::default(), 16);
    let app = app(infer.clone());
    let libre = json!({"q": "a dog", "source": "en", "target": "es"});
    send(app.clone(), json_post("/libretranslate/translate", &libre)).await;
    let deepl = json!({"text": ["a dog"], "target_lang": "FR"});
    send(app.clone(), json_post("/v2/translate", &deepl)).await;
    send(app.clone(), get("/v2/usage")).await;
    send(app.clone(), get("/nowhere/1")).await;
    send(app, get("/nowhere/2")).await;
    let text = infer.metrics().render();
    for line in [
        "nmt_http_requests_total{endpoint=\"/libretranslate/translate\"} 1",
        "nmt_http_requests_total{endpoint=\"/v2/translate\"} 1",
        "nmt_http_requests_total{endpoint=\"/v2/usage\"} 1",
        "nmt_http_requests_total{endpoint=\"unmatched\"} 2",
        "nmt_errors_total{type=\"unsupported\"} 1",
        "nmt_errors_total{type=\"not_found\"} 2",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in\n{text}"
        );
    }
}

/// The schema `name` of the document, its `$ref`s to components followed.
fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no schema {name}");
    schema
}

fn keys(object: &Value) -> Vec<String> {
    let mut keys: Vec<String> = object.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn the_openapi_document_describes_the_compatible_answers_and_their_errors() {
    let doc: Value = serde_json::from_str(openapi_json()).unwrap();
    let app = server();
    let libre = json!({"q": "a dog", "source": "auto", "target": "es"});
    let deepl = json!({"text": ["a dog"], "target_lang": "ES", "show_billed_characters": true});
    for (request, name, pick) in [
        (
            json_post("/libretranslate/translate", &libre),
            "LibreTranslateResponse",
            "",
        ),
        (
            get("/libretranslate/languages"),
            "LibreTranslateLanguage",
            "0",
        ),
        (
            json_post("/v2/translate", &deepl),
            "DeepLTranslation",
            "translations.0",
        ),
        (get("/v2/languages?type=target"), "DeepLLanguage", "0"),
        (get("/v2/usage"), "DeepLUsage", ""),
    ] {
        let answer = send(app.clone(), request).await;
        let mut served = &answer.json;
        for step in pick.split('.').filter(|s| !s.is_empty()) {
            served = match step.parse::<usize>() {
                Ok(i) => &served[i],
                Err(_) => &served[step],
            };
        }
        assert_eq!(
            keys(&schema(&doc, name)["properties"]),
            keys(served),
            "{name}"
        );
    }
    // Every status each API's mapping answers is documented for its translate route, with
    // that API's error response, and nothing else is.
    for (path, api, error, retry) in [
        (
            "/libretranslate/translate",
            Api::LibreTranslate,
            "LibreTranslateError",
            "LibreTranslateRetry",
        ),
        ("/v2/translate", Api::DeepL, "DeepLError", "DeepLRetry"),
    ] {
        let mut mapped: Vec<u16> = testing::every_api_error()
            .iter()
            .map(|e| api.answer(e).0.as_u16())
            // Answered before a route is chosen, or for routes that do not exist.
            .filter(|s| ![404, 405, 414, 431, 501].contains(s))
            .collect();
        mapped.sort();
        mapped.dedup();
        let responses = &doc["paths"][path]["post"]["responses"];
        let documented: Vec<u16> = keys(responses)
            .iter()
            .map(|s| s.parse().unwrap())
            .filter(|&s| s >= 400)
            .collect();
        assert_eq!(documented, mapped, "{path}");
        for status in documented {
            let expected = match status {
                429 | 503 => retry,
                _ => error,
            };
            assert_eq!(
                responses[status.to_string()]["$ref"],
                format!("#/components/responses/{expected}"),
                "{path} {status}"
            );
        }
    }
    let error = serde_json::to_value(libretranslate::ErrorBody { error: "x".into() }).unwrap();
    assert_eq!(
        keys(&schema(&doc, "LibreTranslateError")["properties"]),
        keys(&error)
    );
    let error = serde_json::to_value(deepl::ErrorBody {
        message: "x".into(),
    })
    .unwrap();
    assert_eq!(
        keys(&schema(&doc, "DeepLError")["properties"]),
        keys(&error)
    );
}
