//! The page at `GET /`: a text box, the model picker, a length control, and the translation
//! with its lengths and latency. Its three files are compiled into the binary, so the page
//! needs no build step, no CDN and no files beside the executable.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("../../../web/index.html");
const APP_JS: &str = include_str!("../../../web/app.js");
const STYLE_CSS: &str = include_str!("../../../web/style.css");

/// Scripts and styles only from this server: user text is shown with `textContent`, and this
/// keeps anything injected from running even so.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; frame-ancestors 'none'";

/// The page's routes, merged into the API router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/static/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/static/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get_page(path: &str) -> (StatusCode, String, String) {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let response = routes::<()>().oneshot(request).await.unwrap();
        let status = response.status();
        let content_type = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_string();
        assert!(response
            .headers()
            .contains_key(header::CONTENT_SECURITY_POLICY));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn the_page_and_its_assets_are_served_from_the_binary() {
        let (status, content_type, html) = get_page("/").await;
        assert_eq!(status, StatusCode::OK);
        assert!(content_type.starts_with("text/html"));
        // Every asset the page links is one of ours, and nothing comes from elsewhere.
        for asset in ["/static/app.js", "/static/style.css"] {
            assert!(html.contains(asset), "the page links {asset}");
            let (status, _, body) = get_page(asset).await;
            assert_eq!(status, StatusCode::OK);
            assert!(!body.is_empty());
        }
        assert!(!html.contains("http://") && !html.contains("https://"));
        let (_, content_type, js) = get_page("/static/app.js").await;
        assert!(content_type.starts_with("text/javascript"));
        // The API calls the page makes exist under these paths.
        assert!(js.contains("fetch(\"/models\")") && js.contains("fetch(\"/translate\""));
    }
}
