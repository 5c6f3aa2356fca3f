//! The servers under test: one `nmt-server` child process per batching mode, all running side
//! by side for the whole benchmark ([`Fleet`]).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The mode name that passes no `--batching` flag at all (the server's own default; also
/// what works against a server that has no such flag).
pub const DEFAULT_MODE: &str = "default";

/// The arguments `nmt-server` gets for `mode`: `--model-dir DIR --port 0 --grpc-port 0
/// [--batching MODE]`, then `extra`.
pub fn server_args(model_dir: &Path, mode: &str, extra: &[String]) -> Vec<String> {
    let mut args = vec![
        "--model-dir".to_string(),
        model_dir.display().to_string(),
        "--port".to_string(),
        "0".to_string(),
        "--grpc-port".to_string(),
        "0".to_string(),
    ];
    if mode != DEFAULT_MODE {
        args.push("--batching".to_string());
        args.push(mode.to_string());
    }
    args.extend(extra.iter().cloned());
    args
}

/// A running server. Dropping it stops the process (SIGTERM, then SIGKILL).
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    /// SIGTERM has been sent (it is sent once: a second one could cut the graceful shutdown
    /// short).
    term_sent: bool,
    /// `http://ADDR` from the `listening on` line.
    pub base_url: String,
    /// Where the server's stderr (its log) goes.
    pub log_path: PathBuf,
}

impl Server {
    /// The server's peak resident memory so far (`VmHWM`), in MiB; `None` once it has exited
    /// or where `/proc` does not say.
    pub fn peak_rss_mib(&self) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }

    /// Starts `bin args...` with stderr to `log_path`, and waits (up to `timeout`) for the one
    /// `listening on http://ADDR` line on its stdout.
    pub fn start(bin: &Path, args: &[String], log_path: &Path, timeout: Duration) -> Result<Self> {
        let log = File::create(log_path)
            .with_context(|| format!("creating the server log {}", log_path.display()))?;
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build it with `cargo build --release -p nmt-server`)",
                    bin.display()
                )
            })?;
        // Read stdout on a thread: the first `listening on` line goes back through the
        // channel, anything after it is drained so the pipe never fills.
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.trim().strip_prefix("listening on ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(rest.trim().to_string());
                    }
                }
            }
        });
        let mut server = Server {
            child: Some(child),
            term_sent: false,
            base_url: String::new(),
            log_path: log_path.to_path_buf(),
        };
        let deadline = Instant::now() + timeout;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(url) => {
                    server.base_url = url.trim_end_matches('/').to_string();
                    return Ok(server);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed without the line: the process is exiting.
                    let status = server.wait_exit(Duration::from_secs(5));
                    bail!(
                        "the server closed its stdout before printing `listening on` (exit: {}); its log:\n{}",
                        status.map_or("unknown".into(), |s| s.to_string()),
                        log_tail(log_path)
                    );
                }
            }
            if let Some(status) = server.try_wait()? {
                bail!(
                    "the server exited ({status}) before printing `listening on`; its log:\n{}",
                    log_tail(log_path)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "no `listening on` line from the server within {timeout:?}; its log:\n{}",
                    log_tail(log_path)
                );
            }
        }
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => Ok(None),
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => return None,
            }
        }
    }

    /// Sends SIGTERM (through `kill PID`) unless it was sent already or the process has
    /// exited; does not wait.
    pub fn terminate(&mut self) {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return;
        };
        if self.term_sent || !matches!(self.try_wait(), Ok(None)) {
            return;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.term_sent = true;
    }

    /// SIGTERM ([`Server::terminate`]), then waits up to `grace` for a graceful shutdown;
    /// SIGKILL after that. Returns how it ended.
    pub fn stop(&mut self, grace: Duration) -> Result<ExitStatus> {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            bail!("server already stopped");
        };
        self.terminate();
        let status = match self.wait_exit(grace) {
            Some(status) => status,
            None => {
                let child = self.child.as_mut().expect("child");
                eprintln!("server (pid {pid}) still running {grace:?} after SIGTERM: SIGKILL");
                let _ = child.kill();
                child.wait()?
            }
        };
        self.child = None;
        Ok(status)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop(Duration::from_secs(10));
        }
    }
}

/// The servers of all modes, by the mode's index in `--modes`: `None` for a mode whose server
/// did not start, has failed, or was stopped. Dropping the fleet (at the end, on an error, on
/// Ctrl-C) stops every server it still holds, so none outlives the benchmark.
#[derive(Debug, Default)]
pub struct Fleet {
    pub servers: Vec<Option<Server>>,
}

impl Fleet {
    /// Stops every server still held: SIGTERM to all of them first (so they shut down in
    /// parallel), then waits for each, up to `grace` before SIGKILL. Returns each stopped
    /// server's mode index and how it ended.
    pub fn stop_all(&mut self, grace: Duration) -> Vec<(usize, Result<ExitStatus>)> {
        for server in self.servers.iter_mut().flatten() {
            server.terminate();
        }
        self.servers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, slot)| slot.take().map(|mut server| (i, server.stop(grace))))
            .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop_all(Duration::from_secs(10));
    }
}

/// The last lines of the server's log, for error messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(20)..];
    if tail.is_empty() {
        format!("({} is empty)", path.display())
    } else {
        tail.join("\n")
    }
}

/// Polls `GET /ready` until 200 (the server answers 503 until its warm-up is done). A server
/// without `/ready` (404) is polled on `/health` instead. Fails after `timeout` or if the process
/// exits.
pub async fn wait_ready(
    client: &reqwest::Client,
    server: &mut Server,
    timeout: Duration,
) -> Result<&'static str> {
    let deadline = Instant::now() + timeout;
    let mut path = "/ready";
    let mut last;
    loop {
        let url = format!("{}{path}", server.base_url);
        match client
            .get(&url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(resp) if resp.status().is_success() => return Ok(path),
            Ok(resp) if resp.status() == reqwest::StatusCode::NOT_FOUND && path == "/ready" => {
                path = "/health";
                continue;
            }
            Ok(resp) => last = format!("GET {path}: HTTP {}", resp.status()),
            Err(e) => last = format!("GET {path}: {e}"),
        }
        if let Some(status) = server.try_wait()? {
            bail!(
                "the server exited ({status}) before it was ready; its log:\n{}",
                log_tail(&server.log_path)
            );
        }
        if Instant::now() >= deadline {
            bail!("the server was not ready within {timeout:?} ({last})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_mode_passes_no_batching_flag() {
        let extra = vec!["--intra-op-threads".to_string(), "1".to_string()];
        assert_eq!(
            server_args(Path::new("models/m"), DEFAULT_MODE, &extra),
            [
                "--model-dir",
                "models/m",
                "--port",
                "0",
                "--grpc-port",
                "0",
                "--intra-op-threads",
                "1"
            ]
        );
        assert_eq!(
            server_args(Path::new("models/m"), "continuous", &[]),
            [
                "--model-dir",
                "models/m",
                "--port",
                "0",
                "--grpc-port",
                "0",
                "--batching",
                "continuous"
            ]
        );
    }
}
