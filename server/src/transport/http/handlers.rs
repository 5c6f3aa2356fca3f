//! The handlers: each converts its request to the service's, and the service's answer or
//! error back.

use axum::extract::State;
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::ApiJson;
use super::types::{
    Alive, ErrorResponse, Health, Models, Readiness, Ready, RetryResponse, TranslateBody,
    TranslateFields,
};
use crate::service::{ApiError, Infer, TranslateResponse};
use crate::transport::error::ErrorType;

/// Translate one text or a list of texts
///
/// Texts of one request are decoded together and join the server's running batch (continuous
/// batching). Translations come back in input order.
#[utoipa::path(
    post,
    path = "/translate",
    // `request_id::HEADER` and `request_id::MAX_LEN`: utoipa takes only literals here (a test
    // compares).
    params(
        (
            "x-request-id" = Option<String>,
            Header,
            nullable = false,
            max_length = 128,
            description = "Kept and echoed if printable ASCII; otherwise a UUID is made."
        )
    ),
    request_body(
        content = TranslateFields,
        example = json!({
            "text": [
                "In the beginning God created the heavens and the earth.",
                "Jesus wept."
            ],
            "target_length": "source"
        })
    ),
    responses(
        (status = 200, description = "The translations", body = TranslateResponse),
        (status = 400, response = ErrorResponse),
        (status = 404, response = ErrorResponse),
        (status = 408, response = ErrorResponse),
        (status = 413, response = ErrorResponse),
        (status = 415, response = ErrorResponse),
        (status = 422, response = ErrorResponse),
        (status = 429, response = RetryResponse),
        (status = 500, response = ErrorResponse),
        (status = 503, response = RetryResponse),
        (status = 504, response = ErrorResponse),
    )
)]
pub async fn translate(
    State(infer): State<Infer>,
    ApiJson(TranslateBody(request)): ApiJson<TranslateBody>,
) -> Result<Json<TranslateResponse>, ApiError> {
    infer.translate(request).await.map(Json)
}

/// Liveness: the process answers
#[utoipa::path(
    get,
    path = "/health",
    responses((status = 200, description = "Alive", body = inline(Health)))
)]
pub async fn health() -> Json<Health> {
    Json(Health { status: Alive::Ok })
}

/// Readiness: models loaded, a warm-up translation done, not shutting down
#[utoipa::path(
    get,
    path = "/ready",
    responses(
        (status = 200, description = "Ready", body = inline(Readiness)),
        (status = 503, response = RetryResponse),
    )
)]
pub async fn ready(State(infer): State<Infer>) -> Response {
    if infer.is_ready() {
        return Json(Readiness {
            status: Ready::Ready,
        })
        .into_response();
    }
    let mut response = ApiError::NotReady(
        "not ready: the models are loading or warming up, or the server is shutting down".into(),
    )
    .into_response();
    // A probe asking during warm-up or a drain is the answer working, not an error: counted,
    // every rollout would light up the errors panel.
    response.extensions_mut().remove::<ErrorType>();
    response
}

/// The served models
///
/// Name, languages, variant (position switches) and the limits requests to each meet.
#[utoipa::path(
    get,
    path = "/models",
    responses((status = 200, description = "Models", body = Models))
)]
pub async fn models(State(infer): State<Infer>) -> Json<Models> {
    Json(Models {
        default: infer.default_model().to_string(),
        models: infer.model_infos(),
    })
}

/// Prometheus metrics (text exposition format 0.0.4)
#[utoipa::path(
    get,
    path = "/metrics",
    responses((status = 200, description = "Metrics", body = String, content_type = "text/plain"))
)]
pub async fn metrics(State(infer): State<Infer>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        infer.metrics().render(),
    )
        .into_response()
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}
