//! A real Prometheus (Debian's `prometheus`, which scripts/setup.sh installs) on a loopback
//! port, and its HTTP query API. Include with `#[path = "common/prometheus.rs"] mod prometheus;`.

// Each test binary uses only some of these.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running Prometheus, killed on drop, its storage in a temporary directory.
pub struct Prometheus {
    child: Child,
    pub url: String,
    _data: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (bound, then released: Prometheus cannot take port 0 and say which
/// port it got).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts Prometheus with `config` (written as JSON, which is YAML too) and waits until it
/// answers `/-/ready`. Relative `rule_files` would resolve against the temporary directory, so
/// callers give absolute paths.
pub async fn start(client: &reqwest::Client, config: &Value) -> Prometheus {
    let data = tempfile::tempdir().unwrap();
    let config_path = data.path().join("prometheus.yml");
    std::fs::write(&config_path, serde_json::to_string_pretty(config).unwrap()).unwrap();
    let port = free_port();
    let log = std::fs::File::create(data.path().join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            data.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting prometheus (scripts/setup.sh installs it)");
    let mut prometheus = Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _data: data,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = client
            .get(format!("{}/-/ready", prometheus.url))
            .send()
            .await;
        if matches!(&ready, Ok(r) if r.status() == 200) {
            return prometheus;
        }
        // A config Prometheus rejects ends the process; its log says why.
        if let Some(status) = prometheus.child.try_wait().unwrap() {
            panic!("prometheus exited ({status}):\n{}", prometheus.log());
        }
        assert!(
            Instant::now() < deadline,
            "prometheus not ready within 30 s:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Prometheus {
    /// What Prometheus logged (stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._data.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query: the result vector, or Prometheus' error (a query it cannot parse or
    /// evaluate) as text.
    pub async fn query(
        &self,
        client: &reqwest::Client,
        promql: &str,
    ) -> Result<Vec<Value>, String> {
        self.get(client, "/api/v1/query", &[("query", promql)])
            .await
            .and_then(|data| match data["resultType"].as_str() {
                Some("vector") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
                other => Err(format!("result type {other:?}, not an instant vector")),
            })
    }

    /// `data` of a successful answer to `GET path?params`, or the error Prometheus gave.
    pub async fn get(
        &self,
        client: &reqwest::Client,
        path: &str,
        params: &[(&str, &str)],
    ) -> Result<Value, String> {
        let answer = client
            .get(format!("{}{path}", self.url))
            .query(params)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let json: Value = answer.json().await.map_err(|e| e.to_string())?;
        if json["status"] == "success" {
            Ok(json["data"].clone())
        } else {
            Err(format!("{}: {}", json["errorType"], json["error"]))
        }
    }

    /// Polls `promql` until `accept` takes its result (then returns it) or `limit` passes (then
    /// returns the last result or error).
    pub async fn query_until(
        &self,
        client: &reqwest::Client,
        promql: &str,
        limit: Duration,
        accept: impl Fn(&[Value]) -> bool,
    ) -> Result<Vec<Value>, String> {
        let deadline = Instant::now() + limit;
        loop {
            let result = self.query(client, promql).await;
            if matches!(&result, Ok(samples) if accept(samples)) || Instant::now() >= deadline {
                return result;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// A sample's value (`"NaN"` and `"+Inf"` included).
pub fn value(sample: &Value) -> f64 {
    let text = sample["value"][1].as_str().unwrap_or("NaN");
    text.parse()
        .unwrap_or_else(|_| panic!("sample value {text:?} is not a number"))
}

/// A sample's labels as `{a="x", b="y"}`, for messages; the metric name and the scrape
/// address (a random port) left out.
pub fn labels(sample: &Value) -> String {
    let labels: Vec<String> = sample["metric"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "__name__" | "instance"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        })
        .unwrap_or_default();
    format!("{{{}}}", labels.join(", "))
}
