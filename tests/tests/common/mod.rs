//! Helpers shared by the end-to-end test binaries (`mod common;` in each): the workspace's
//! binaries, a real `nmt-server` on a loopback port, and its HTTP API.

// Each test binary uses only some of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The default model package that ships with the repo: the one place the tests name it.
pub fn shipped_package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/en-es-rel-ldpe")
}

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
    pipe.write_all(stdin.as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

/// A binary of this workspace, next to the test executable's `deps/` folder.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
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

/// A running `nmt-server`, killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `nmt-server` on free loopback ports (HTTP and gRPC) serving `packages` (one
/// `--model-dir` list; the first is the default model), with `extra` flags.
pub fn start_server(packages: &[&Path], extra: &[&str]) -> Server {
    start_server_with_env(packages, extra, &[])
}

/// [`start_server`] with environment variables (e.g. `RUST_LOG=warn` for a quiet log).
pub fn start_server_with_env(packages: &[&Path], extra: &[&str], env: &[(&str, &str)]) -> Server {
    let model_dirs: Vec<&str> = packages.iter().map(|p| p.to_str().unwrap()).collect();
    let mut child = Command::new(binary("nmt-server"))
        .args(["--model-dir", &model_dirs.join(","), "--port", "0"])
        .args(["--grpc-port", "0"])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting nmt-server");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("listening on ") {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("nmt-server did not print `listening on ...` within 120 s");
    Server { child, url }
}

/// Polls `/ready` until the server has warmed up; `/health` answers before that.
pub async fn wait_until_ready(client: &reqwest::Client, server: &Server) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let response = client
            .get(format!("{}/ready", server.url))
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            return;
        }
        assert_eq!(response.status(), 503, "/ready answers 200 or 503");
        assert!(
            std::time::Instant::now() < deadline,
            "not ready within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `POST /translate` with a JSON body.
pub async fn post_translate(
    client: &reqwest::Client,
    server: &Server,
    body: &Value,
) -> reqwest::Response {
    client
        .post(format!("{}/translate", server.url))
        .json(body)
        .send()
        .await
        .unwrap()
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
