//! The gRPC API against the real model package (as in `package.rs`: the one that ships with
//! the repo, or `NMT_TEST_PACKAGE`), served by [`nmt_server::transport::grpc::serve`] on a loopback port
//! and called with the generated client.

mod common;

use common::state;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use nmt_server::transport::grpc::proto::translate_request::TargetLength as ProtoTargetLength;
use nmt_server::transport::grpc::proto::translator_client::TranslatorClient;
use nmt_server::transport::grpc::proto::{self, TargetLengthMode};
use nmt_server::transport::grpc::{ERROR_TYPE, REQUEST_ID};
use nmt_server::{app, TranslateRequest, TranslateResponse};
use tonic::transport::Channel;
use tonic::Code;
use tower::ServiceExt;

const TEXTS: [&str; 2] = [
    "In the beginning God created the heavens and the earth.",
    "Jesus wept.",
];

/// Serves gRPC on a free loopback port (for as long as the test's runtime lives) and
/// connects a client to it.
async fn client() -> TranslatorClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(nmt_server::transport::grpc::serve(
        state(),
        listener,
        std::future::pending(),
    ));
    TranslatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn request(texts: &[&str]) -> proto::TranslateRequest {
    proto::TranslateRequest {
        text: texts.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    }
}

fn metadata<'a>(metadata: &'a tonic::metadata::MetadataMap, key: &str) -> Option<&'a str> {
    metadata.get(key).map(|v| v.to_str().unwrap())
}

async fn post_translate(body: serde_json::Value) -> TranslateResponse {
    let request = Request::post("/translate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app(state()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn translations_match_the_service_and_http() {
    let mut client = client().await;
    let response = client
        .translate(request(&TEXTS))
        .await
        .unwrap()
        .into_inner();

    let texts: Vec<String> = TEXTS.iter().map(|t| t.to_string()).collect();
    let direct = state()
        .translate(TranslateRequest {
            texts,
            model: None,
            length: Default::default(),
            no_repeat_ngram_size: None,
            split_sentences: false,
        })
        .await
        .unwrap();
    let http = post_translate(serde_json::json!({ "text": TEXTS })).await;
    assert_eq!(direct, http);

    assert_eq!(response.model, direct.model);
    assert_eq!(response.model, state().default_model());
    assert_eq!(response.translations.len(), TEXTS.len());
    for (grpc, direct) in response.translations.iter().zip(&direct.translations) {
        assert!(!grpc.text.is_empty(), "{grpc:?}");
        assert_eq!(grpc.text, direct.text);
        assert_eq!(grpc.source_tokens as usize, direct.source_tokens);
        assert_eq!(grpc.output_tokens as usize, direct.output_tokens);
        // The shipped model is length-aware: each text gets its predicted length.
        assert_eq!(grpc.target_length.map(|n| n as usize), direct.target_length);
        assert_eq!(grpc.predicted_length, direct.predicted_length);
    }

    // Naming the model explicitly gives the same answer.
    let named = proto::TranslateRequest {
        model: Some(direct.model.clone()),
        ..request(&TEXTS)
    };
    let again = client.translate(named).await.unwrap().into_inner();
    assert_eq!(again, response);
}

#[tokio::test]
async fn a_target_length_is_met_and_reported() {
    let mut client = client().await;
    let asked = proto::TranslateRequest {
        target_length: Some(ProtoTargetLength::Tokens(5)),
        length_mode: proto::LengthMode::Exact as i32,
        ..request(&TEXTS)
    };
    let response = client.translate(asked).await.unwrap().into_inner();
    for t in &response.translations {
        assert_eq!((t.output_tokens, t.target_length), (5, Some(5)), "{t:?}");
    }

    let source = proto::TranslateRequest {
        target_length: Some(ProtoTargetLength::Mode(TargetLengthMode::Source as i32)),
        length_mode: proto::LengthMode::Exact as i32,
        ..request(&TEXTS)
    };
    let response = client.translate(source).await.unwrap().into_inner();
    for t in &response.translations {
        assert_eq!(t.target_length, Some(t.source_tokens), "{t:?}");
        assert_eq!(t.output_tokens, t.source_tokens, "{t:?}");
    }
}

#[tokio::test]
async fn characters_and_sentences_are_asked_and_reported_as_over_http() {
    let mut client = client().await;
    let isometric = proto::TranslateRequest {
        target_chars: Some(proto::translate_request::TargetChars::SourceChars(true)),
        ..request(&TEXTS)
    };
    let response = client.translate(isometric).await.unwrap().into_inner();
    let http = post_translate(serde_json::json!({ "text": TEXTS, "target_chars": "source" })).await;
    for (grpc, http) in response.translations.iter().zip(&http.translations) {
        assert_eq!(grpc.text, http.text);
        let candidates = http
            .length_candidates
            .as_ref()
            .expect("candidates over HTTP");
        assert_eq!(grpc.length_candidates.len(), candidates.len(), "{grpc:?}");
        assert_eq!(
            grpc.length_candidates.iter().filter(|c| c.chosen).count(),
            1
        );
    }

    let text = "In the beginning God created the heavens and the earth. And the earth was waste.";
    let split = proto::TranslateRequest {
        split_sentences: true,
        ..request(&[text])
    };
    let response = client.translate(split).await.unwrap().into_inner();
    let http = post_translate(serde_json::json!({ "text": text, "split_sentences": true })).await;
    assert_eq!(response.translations[0].text, http.translations[0].text);
    assert_eq!(response.translations[0].sentences, Some(2));
}

#[tokio::test]
async fn errors_map_to_grpc_codes_and_are_counted() {
    let mut client = client().await;
    let infer = state();
    // The limit `GET /models` reports: the model's own or the server's, whichever is lower.
    let input_limit = infer.model_infos()[0].limits.max_input_tokens;
    let too_long = "the ".repeat(input_limit + 1);
    let oversized = "a".repeat(infer.limits().max_body_bytes + 1);
    let cases = [
        (request(&[]), Code::InvalidArgument, "empty_text"),
        (
            request(&["Jesus wept.", " "]),
            Code::InvalidArgument,
            "empty_text",
        ),
        (
            proto::TranslateRequest {
                model: Some("no-such-model".into()),
                ..request(&TEXTS)
            },
            Code::NotFound,
            "model_not_found",
        ),
        (
            request(&["Jesus wept.", &too_long]),
            Code::InvalidArgument,
            "input_too_long",
        ),
        (
            proto::TranslateRequest {
                length_mode: 9,
                ..request(&TEXTS)
            },
            Code::InvalidArgument,
            "invalid_request",
        ),
        (
            proto::TranslateRequest {
                max_chars: Some(0),
                ..request(&TEXTS)
            },
            Code::InvalidArgument,
            "invalid_target_length",
        ),
        (
            proto::TranslateRequest {
                no_repeat_ngram_size: Some(65),
                ..request(&TEXTS)
            },
            Code::InvalidArgument,
            "invalid_request",
        ),
        (
            proto::TranslateRequest {
                target_length: Some(ProtoTargetLength::Mode(
                    TargetLengthMode::Unspecified as i32,
                )),
                ..request(&TEXTS)
            },
            Code::InvalidArgument,
            "invalid_request",
        ),
        (
            proto::TranslateRequest {
                target_length: Some(ProtoTargetLength::Tokens(0)),
                ..request(&TEXTS)
            },
            Code::InvalidArgument,
            "invalid_target_length",
        ),
        // Refused by tonic's decoder, before the handler, and still answered alike.
        (
            request(&[&oversized]),
            Code::ResourceExhausted,
            "payload_too_large",
        ),
    ];
    for (request, code, error_type) in cases {
        let status = client.translate(request).await.unwrap_err();
        assert_eq!(
            (status.code(), metadata(status.metadata(), ERROR_TYPE)),
            (code, Some(error_type)),
            "{status:?}"
        );
        assert!(!status.message().is_empty(), "{status:?}");
        let id = metadata(status.metadata(), REQUEST_ID).expect("a request id on errors");
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    }
    let status = client.translate(request(&[])).await.unwrap_err();
    assert_eq!(status.message(), "`text` is an empty list");
    let status = client
        .translate(request(&["Jesus wept.", &too_long]))
        .await
        .unwrap_err();
    assert!(
        status
            .message()
            .contains(&format!("the limit is {input_limit}")),
        "{status:?}"
    );

    let metrics = infer.metrics().render();
    for error_type in [
        "empty_text",
        "model_not_found",
        "input_too_long",
        "invalid_request",
        "invalid_target_length",
        "payload_too_large",
    ] {
        let counted = format!("nmt_errors_total{{type=\"{error_type}\"}} ");
        assert!(
            metrics.lines().any(|l| l.starts_with(&counted)),
            "{error_type} not counted in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn request_ids_are_echoed_or_made() {
    let mut client = client().await;
    let mut sent = tonic::Request::new(request(&["Jesus wept."]));
    sent.metadata_mut()
        .insert(REQUEST_ID, "grpc-client-7".parse().unwrap());
    let response = client.translate(sent).await.unwrap();
    assert_eq!(
        metadata(response.metadata(), REQUEST_ID),
        Some("grpc-client-7")
    );

    let mut sent = tonic::Request::new(request(&[]));
    sent.metadata_mut()
        .insert(REQUEST_ID, "grpc-client-8".parse().unwrap());
    let status = client.translate(sent).await.unwrap_err();
    assert_eq!(
        metadata(status.metadata(), REQUEST_ID),
        Some("grpc-client-8")
    );

    let response = client.translate(request(&["Jesus wept."])).await.unwrap();
    let made = metadata(response.metadata(), REQUEST_ID).expect("a request id");
    assert!(uuid::Uuid::parse_str(made).is_ok(), "{made}");
}

#[tokio::test]
async fn shutdown_lets_calls_in_flight_finish() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(nmt_server::transport::grpc::serve(
        state(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let mut client = TranslatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    // A connection that stays open, idle, must not hold the server up.
    let mut idle = TranslatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    idle.translate(request(&["Jesus wept."])).await.unwrap();

    let long = proto::TranslateRequest {
        target_length: Some(ProtoTargetLength::Tokens(200)),
        length_mode: proto::LengthMode::Exact as i32,
        ..request(&TEXTS)
    };
    let in_flight = tokio::spawn(async move { client.translate(long).await });
    // 2 x 200 decoder steps take far longer than the call takes to arrive.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    stop.send(()).unwrap();
    let response = in_flight
        .await
        .unwrap()
        .expect("the call in flight finished");
    assert!(response
        .into_inner()
        .translations
        .iter()
        .all(|t| t.output_tokens == 200));
    tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("the server returned after draining")
        .unwrap()
        .unwrap();
}
