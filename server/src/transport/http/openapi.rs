//! The OpenAPI 3.1 document of the JSON API, and the handler that serves it.

use std::sync::LazyLock;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;

// Glob: `paths(...)` needs each handler's generated `__path_*` type in scope, and a handler
// named by its module path would be tagged with that module in the document.
use super::compat::{deepl, libretranslate};
use super::handlers::*;
use super::types::{ErrorOf, ErrorResponse, RetryOf, RetryResponse};
use crate::transport::error::ErrorBody;

/// The OpenAPI 3.1 description of the JSON API, generated from the handlers and their types.
/// `/openapi.json` serves it as [`openapi_json`] writes it.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "nmt-server",
        description = "Length-robust, length-controllable machine translation. Every error is \
                       a JSON object {error, error_type} (on the LibreTranslate- and \
                       DeepL-compatible paths, those APIs' own shapes); every response carries \
                       an x-request-id header (the client's, or a new UUID)."
    ),
    paths(
        translate,
        health,
        ready,
        metrics,
        openapi,
        models,
        libretranslate::translate,
        libretranslate::languages,
        libretranslate::detect,
        deepl::translate,
        deepl::languages,
        deepl::usage,
    ),
    components(
        schemas(
            ErrorBody,
            libretranslate::ErrorBody,
            deepl::ErrorBody,
            deepl::LanguageKind
        ),
        responses(
            ErrorResponse,
            RetryResponse,
            ErrorOf<libretranslate::ErrorBody>,
            RetryOf<libretranslate::ErrorBody>,
            ErrorOf<deepl::ErrorBody>,
            RetryOf<deepl::ErrorBody>,
        )
    )
)]
pub struct ApiDoc;

/// [`ApiDoc`] as JSON, built once.
pub fn openapi_json() -> &'static str {
    static JSON: LazyLock<String> = LazyLock::new(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("the OpenAPI document serializes")
    });
    &JSON
}

/// This document
#[utoipa::path(
    get,
    path = "/openapi.json",
    responses((status = 200, description = "OpenAPI 3.1", body = Object))
)]
pub async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        openapi_json(),
    )
        .into_response()
}
