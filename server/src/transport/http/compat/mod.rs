//! APIs that other translation services speak, so that tools written for them (Weblate,
//! Poedit, editor plugins, the services' own client libraries) can use this server unchanged:
//! LibreTranslate's under `/libretranslate/` ([`libretranslate`]) and DeepL's API v2 under
//! `/v2/` ([`deepl`]).
//!
//! Both are thin: a handler reads its API's fields ([`fields::Fields`]), and sends the texts to
//! the served model for the language pair ([`languages::Ask::translate`]) through the same
//! service as `POST /translate`, which validates, queues and decodes them. Errors stay the
//! service's `ApiError` until the edge: [`in_their_shape`] answers every error of a compatible
//! path (the handler's, the body limits', an unknown route's) in that API's shape and status,
//! from one mapping per API.

pub mod deepl;
pub mod fields;
pub mod languages;
pub mod libretranslate;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use serde_json::json;

use crate::service::{ApiError, Infer};

/// The compatible APIs' routes, merged into the API router.
pub fn routes() -> Router<Infer> {
    libretranslate::routes().merge(deepl::routes())
}

/// Which compatible API a path belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    LibreTranslate,
    DeepL,
}

impl Api {
    /// The API of `path`, by its prefix; `None` for this server's own routes.
    pub fn of(path: &str) -> Option<Api> {
        let under = |prefix: &str| {
            path.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        };
        if under(libretranslate::PREFIX) {
            Some(Api::LibreTranslate)
        } else if under(deepl::PREFIX) {
            Some(Api::DeepL)
        } else {
            None
        }
    }

    /// `error` as this API answers it: its status and its JSON body (LibreTranslate's
    /// `{"error": ...}`, DeepL's `{"message": ...}`).
    pub fn answer(self, error: &ApiError) -> (StatusCode, serde_json::Value) {
        let message = error.to_string();
        let body = match self {
            Api::LibreTranslate => json!(libretranslate::ErrorBody { error: message }),
            Api::DeepL => json!(deepl::ErrorBody { message }),
        };
        (self.status(error), body)
    }

    /// The status this API answers for `error`: a text over a limit, too many texts or a
    /// request too costly to finish in time is 400 in LibreTranslate (its answer to a text
    /// over its character limit) and 413 in DeepL;
    /// whatever else the request got wrong is 400; the HTTP statuses their servers answer
    /// (404, 405, 408, 413, 414, 431), 429 and the server's own failures are as they are.
    pub fn status(self, error: &ApiError) -> StatusCode {
        match error {
            ApiError::TooManyTexts(_)
            | ApiError::InputTooLong(_)
            | ApiError::RequestTooCostly(_) => match self {
                Api::LibreTranslate => StatusCode::BAD_REQUEST,
                Api::DeepL => StatusCode::PAYLOAD_TOO_LARGE,
            },
            ApiError::NotFound(_)
            | ApiError::MethodNotAllowed(_)
            | ApiError::BodyTimeout(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::UriTooLong(_)
            | ApiError::HeadersTooLarge(_)
            | ApiError::Overloaded { .. } => error.status(),
            _ if error.status().is_client_error() => StatusCode::BAD_REQUEST,
            _ => error.status(),
        }
    }
}

/// Answers the errors of a compatible API's paths in that API's shape. The error answered
/// rides along in the response's extensions (`transport::error`), so errors raised before any
/// handler (the body's size and timeout, a route that does not exist) are reshaped too; headers
/// (`Retry-After`, `Connection: close`) and the error's type, which the metrics count, are
/// kept.
pub async fn in_their_shape(request: Request, next: Next) -> Response {
    let api = Api::of(request.uri().path());
    let response = next.run(request).await;
    let Some(api) = api else {
        return response;
    };
    let Some(error) = response.extensions().get::<ApiError>() else {
        return response;
    };
    let (status, body) = api.answer(error);
    let (mut parts, _) = response.into_parts();
    parts.status = status;
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn paths_belong_to_an_api_by_their_prefix_only() {
        assert_eq!(
            Api::of("/libretranslate/translate"),
            Some(Api::LibreTranslate)
        );
        assert_eq!(Api::of("/libretranslate"), Some(Api::LibreTranslate));
        assert_eq!(Api::of("/v2/translate"), Some(Api::DeepL));
        assert_eq!(Api::of("/v2"), Some(Api::DeepL));
        for own in [
            "/translate",
            "/v2x/translate",
            "/libretranslatex",
            "/",
            "/models",
        ] {
            assert_eq!(Api::of(own), None, "{own}");
        }
    }

    #[test]
    fn what_the_request_got_wrong_is_400_or_413_and_the_rest_keeps_its_status() {
        let bad = StatusCode::BAD_REQUEST;
        for error in testing::every_api_error() {
            let libre = Api::LibreTranslate.status(&error);
            let deepl = Api::DeepL.status(&error);
            let expected = match error.error_type() {
                "too_many_texts" | "input_too_long" | "request_too_costly" => {
                    (bad, StatusCode::PAYLOAD_TOO_LARGE)
                }
                "invalid_json"
                | "invalid_request"
                | "empty_text"
                | "model_not_found"
                | "unsupported"
                | "invalid_target_length"
                | "unsupported_media_type"
                | "malformed_request"
                | "invalid_host" => (bad, bad),
                _ => (error.status(), error.status()),
            };
            assert_eq!((libre, deepl), expected, "{error:?}");
            // DeepL's quota status: this server has no quota.
            assert_ne!(deepl.as_u16(), 456);
        }
    }
}
