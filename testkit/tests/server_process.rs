//! The harness against the real debug `nmt-server` (`cargo build --workspace --bins` first)
//! on the shipped package.

use std::process::Command;
use std::time::Duration;

use nmt_testkit::{shipped_package, workspace_binary, ServerProcess, StartOptions, Stderr};
use serde_json::json;

fn server_command(extra: &[&str]) -> Command {
    let mut command = Command::new(workspace_binary("nmt-server"));
    command
        .arg("--model-dir")
        .arg(shipped_package())
        .args(["--port", "0", "--grpc-port", "0"])
        .args(extra)
        .env("RUST_LOG", "warn");
    command
}

fn logged() -> StartOptions {
    StartOptions {
        stderr: Stderr::TempFile,
        ..StartOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_both_ports_translates_and_stops_gracefully() {
    let server = ServerProcess::start(server_command(&[]), logged()).unwrap();
    let http_port = server.http_addr().rsplit(':').next().unwrap();
    let grpc_port = server.grpc_addr().rsplit(':').next().unwrap();
    assert_ne!(http_port, "0");
    assert_ne!(grpc_port, "0");
    assert_ne!(http_port, grpc_port);
    assert_eq!(server.base_url(), format!("http://{}", server.http_addr()));
    // The gRPC port takes connections.
    std::net::TcpStream::connect(server.grpc_addr()).unwrap();

    let api = server.api(reqwest::Client::new());
    assert_eq!(api.health().await.unwrap(), 200);
    assert_eq!(
        server
            .wait_ready(api.http(), Duration::from_secs(120))
            .await
            .unwrap(),
        "/ready"
    );
    assert_eq!(api.ready().await.unwrap(), 200);

    let models = api.models().await.unwrap();
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].name, "en-es-rel-ldpe");
    assert!(models[0].default);

    let reply = api
        .translate(&json!({"text": ["Jesus wept."], "target_length": 4, "length_mode": "exact"}))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    let response = reply.translated().unwrap();
    assert_eq!(response.model, "en-es-rel-ldpe");
    assert_eq!(response.translations.len(), 1);
    assert_eq!(response.translations[0].output_tokens, 4);

    let refused = api.translate(&json!({"text": []})).await.unwrap();
    assert_eq!(refused.status, 422);
    let error = refused.body.as_ref().unwrap_err();
    assert!(error["error_type"].is_string(), "{error}");
    let message = refused.translated().unwrap_err().to_string();
    assert!(message.contains("422"), "{message}");

    let metrics = api.metrics().await.unwrap();
    assert!(
        metrics.contains("nmt_request_duration_seconds"),
        "{metrics}"
    );
    assert!(server.peak_rss_mib().unwrap() > 1.0);

    let status = server.stop(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    assert!(server.try_wait().unwrap().is_some());
    assert_eq!(server.peak_rss_mib(), None);
    assert!(
        api.health().await.is_err(),
        "the port answers after the stop"
    );
}

#[test]
fn a_server_that_exits_early_names_its_log_and_quotes_it() {
    let started = ServerProcess::start(server_command(&["--no-such-flag"]), logged());
    let message = format!("{:#}", started.unwrap_err());
    assert!(message.contains("its log ("), "{message}");
    assert!(message.contains(".log) ends:"), "{message}");
    // clap's own words, from the log.
    assert!(message.contains("--no-such-flag"), "{message}");
}

#[test]
fn a_log_file_is_kept_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server.log");
    let options = StartOptions {
        stderr: Stderr::File(path.clone()),
        startup_timeout: Duration::from_millis(1),
        drop_grace: None,
    };
    // Far too short to load a model: the timeout is what fails.
    let message = format!(
        "{:#}",
        ServerProcess::start(server_command(&[]), options).unwrap_err()
    );
    assert!(message.contains("within 1ms"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(path.exists());
}

#[test]
fn a_missing_binary_says_how_to_build_it() {
    let command = Command::new("/nonexistent/nmt-server");
    let message = format!(
        "{:#}",
        ServerProcess::start(command, StartOptions::default()).unwrap_err()
    );
    assert!(message.contains("cargo build -p nmt-server"), "{message}");
}
