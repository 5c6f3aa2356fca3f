//! Helpers shared by the end-to-end test binaries (`mod common;` in each): a real
//! `nmt-server` on loopback ports and its HTTP API, the way these tests use them, over the
//! workspace's one harness (`nmt_testkit`).

// Each test binary uses only some of these.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nmt_testkit::StartOptions;
pub use nmt_testkit::{shipped_package, workspace_binary as binary, ServerProcess};
use serde_json::Value;

/// `nmt-translate --model-dir <shipped package> args...` with `stdin` on its standard input.
pub fn translate_cli(args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(binary("nmt-translate"))
        .arg("--model-dir")
        .arg(shipped_package())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting nmt-translate");
    let mut pipe = child.stdin.take().unwrap();
    // One that refuses its flags exits before it reads its input, closing the pipe.
    if let Err(e) = pipe.write_all(stdin.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

/// Runs a command to completion; panics with its output when it fails.
pub fn run(cmd: &mut Command) {
    let output = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The arguments that start `nmt-server` on free loopback ports (HTTP and gRPC) serving
/// `packages` (one `--model-dir` list; the first is the default model).
pub fn server_args(packages: &[&Path]) -> Vec<String> {
    let model_dirs: Vec<&str> = packages.iter().map(|p| p.to_str().unwrap()).collect();
    [
        "--model-dir",
        &model_dirs.join(","),
        "--port",
        "0",
        "--grpc-port",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

/// Starts `nmt-server` on free loopback ports serving `packages` (see [`server_args`]), with
/// `extra` flags; its log goes to the test's stderr, and it is killed on drop.
pub fn start_server(packages: &[&Path], extra: &[&str]) -> ServerProcess {
    start_server_with_env(packages, extra, &[])
}

/// [`start_server`] with environment variables (e.g. `RUST_LOG=warn` for a quiet log).
pub fn start_server_with_env(
    packages: &[&Path],
    extra: &[&str],
    env: &[(&str, &str)],
) -> ServerProcess {
    let mut command = Command::new(binary("nmt-server"));
    command
        .args(server_args(packages))
        .args(extra)
        .envs(env.iter().copied());
    ServerProcess::start(command, StartOptions::default()).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Waits until the server has warmed up (`/ready` answers 200; `/health` answers before that).
pub async fn wait_until_ready(client: &reqwest::Client, server: &ServerProcess) {
    if let Err(e) = server.wait_ready(client, Duration::from_secs(60)).await {
        panic!("{e:#}");
    }
}

/// `POST /translate` with a JSON body, the response as it came.
pub async fn post_translate(
    client: &reqwest::Client,
    server: &ServerProcess,
    body: &Value,
) -> reqwest::Response {
    server
        .api(client.clone())
        .post_translate(body)
        .await
        .unwrap()
}

/// `GET /metrics`.
pub async fn scrape(client: &reqwest::Client, server: &ServerProcess) -> String {
    server.api(client.clone()).metrics().await.unwrap()
}

/// The sum of a metric's samples (every label set) in a Prometheus exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A flag's default as `nmt-server --help` prints it.
pub fn server_default(flag: &str) -> String {
    let help = Command::new(binary("nmt-server"))
        .arg("--help")
        .output()
        .unwrap()
        .stdout;
    let help = String::from_utf8(help).unwrap();
    let section = help
        .split(&format!("--{flag} "))
        .nth(1)
        .unwrap_or_else(|| panic!("--{flag} in nmt-server --help"));
    let default = section.split("[default: ").nth(1).unwrap();
    default[..default.find(']').unwrap()].to_string()
}
