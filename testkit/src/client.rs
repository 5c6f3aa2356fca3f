//! The server's HTTP API, typed with the server's own wire types.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nmt_server::{ModelInfo, TranslateResponse};
use reqwest::StatusCode;
use serde_json::Value;

/// A client of one server's HTTP API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base_url: String,
}

/// What `POST /translate` answered.
#[derive(Debug, Clone)]
pub struct TranslateReply {
    pub status: StatusCode,
    /// The translations of a 200; for any other status, the API's error object (or, where
    /// the body is not JSON, its text as a JSON string).
    pub body: std::result::Result<TranslateResponse, Value>,
}

impl TranslateReply {
    /// The translations, or an error naming the status and the API's error.
    pub fn translated(self) -> Result<TranslateResponse> {
        match self.body {
            Ok(response) => Ok(response),
            Err(error) => bail!("POST /translate: HTTP {}: {error}", self.status),
        }
    }
}

/// `GET /models`'s answer, as far as the client reads it (each model says whether it is the
/// default).
#[derive(serde::Deserialize)]
struct Models {
    models: Vec<ModelInfo>,
}

impl ApiClient {
    /// The API at `base_url` (`http://HOST:PORT`), over `http`, whose settings (timeouts,
    /// pooling) every request keeps.
    pub fn new(http: reqwest::Client, base_url: &str) -> Self {
        ApiClient {
            http,
            base_url: base_url.trim_end_matches('/').to_string(),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `POST /translate` with `body`, the response as it came: for checks of the wire format
    /// itself (fields left out, headers).
    pub async fn post_translate(&self, body: &Value) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(format!("{}/translate", self.base_url))
            .json(body)
            .send()
            .await
    }

    /// `POST /translate` with `body`, typed. Fails when no answer comes or a 200's body is
    /// not a [`TranslateResponse`].
    pub async fn translate(&self, body: &Value) -> Result<TranslateReply> {
        let response = self.post_translate(body).await.context("POST /translate")?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .context("POST /translate: the body")?;
        let body = if status == StatusCode::OK {
            Ok(serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "POST /translate: a 200 that is not a TranslateResponse: {}",
                    String::from_utf8_lossy(&bytes)
                )
            })?)
        } else {
            Err(serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())))
        };
        Ok(TranslateReply { status, body })
    }

    /// `GET /models`: the served models, the default one among them.
    pub async fn models(&self) -> Result<Vec<ModelInfo>> {
        let models: Models = self.get_ok("/models").await?.json().await?;
        Ok(models.models)
    }

    /// `GET /metrics`: the Prometheus text exposition.
    pub async fn metrics(&self) -> Result<String> {
        Ok(self.get_ok("/metrics").await?.text().await?)
    }

    /// `GET /health`'s status: 200 while the process serves at all.
    pub async fn health(&self) -> Result<StatusCode> {
        self.status_of("/health").await
    }

    /// `GET /ready`'s status: 200 once the models are loaded and warmed up, 503 before that
    /// and while shutting down.
    pub async fn ready(&self) -> Result<StatusCode> {
        self.status_of("/ready").await
    }

    /// Polls `GET /ready` until it answers 200; a server without `/ready` (404) is polled on
    /// `/health` instead. Returns the path that answered; fails after `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<&'static str> {
        poll_ready(&self.http, &self.base_url, timeout, || Ok(())).await
    }

    async fn get_ok(&self, path: &str) -> Result<reqwest::Response> {
        let response = self
            .http
            .get(format!("{}{path}", self.base_url))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        response
            .error_for_status()
            .with_context(|| format!("GET {path}"))
    }

    async fn status_of(&self, path: &str) -> Result<StatusCode> {
        let response = self
            .http
            .get(format!("{}{path}", self.base_url))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        Ok(response.status())
    }
}

/// The polling behind both `wait_ready`s: `running` is asked between polls, and its error
/// (the process has exited) ends the wait at once.
pub(crate) async fn poll_ready(
    http: &reqwest::Client,
    base_url: &str,
    timeout: Duration,
    mut running: impl FnMut() -> Result<()>,
) -> Result<&'static str> {
    let deadline = Instant::now() + timeout;
    let mut path = "/ready";
    loop {
        let last = match http
            .get(format!("{base_url}{path}"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => return Ok(path),
            // The benchmarks compare older builds, from before `/ready`.
            Ok(r) if r.status() == StatusCode::NOT_FOUND && path == "/ready" => {
                path = "/health";
                continue;
            }
            Ok(r) => format!("HTTP {}", r.status()),
            Err(e) => e.to_string(),
        };
        running()?;
        if Instant::now() >= deadline {
            bail!("{base_url}{path} was not ready within {timeout:?} ({last})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
