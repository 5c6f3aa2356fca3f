//! The servers under test: `nmt-server` child processes ([`nmt_testkit::ServerProcess`]),
//! their arguments and logs; for the default benchmark, one per batching mode, all running
//! side by side for the whole run ([`Fleet`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::Result;
use nmt_testkit::{ServerProcess, StartOptions, Stderr};

use crate::report::shell_join;

/// The mode name that passes no `--batching` flag at all (the server's own default; also
/// what works against a server that has no such flag).
pub const DEFAULT_MODE: &str = "default";

/// How long a server dropped on an error or an interruption gets to shut down gracefully
/// before SIGKILL: a benchmark leaves no server behind, but lets each finish its log.
const DROP_GRACE: Duration = Duration::from_secs(10);

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

/// Starts `bin args...` with stderr to `log_path`, and waits (up to `timeout`) for its
/// `listening on` lines. Dropped, it gets SIGTERM, then SIGKILL 10 s later.
pub fn start(
    bin: &Path,
    args: &[String],
    log_path: &Path,
    timeout: Duration,
) -> Result<ServerProcess> {
    let mut command = Command::new(bin);
    command.args(args);
    ServerProcess::start(
        command,
        StartOptions {
            stderr: Stderr::File(log_path.to_path_buf()),
            startup_timeout: timeout,
            drop_grace: Some(DROP_GRACE),
        },
    )
}

/// [`start`], then waits until the server is ready, saying both on stderr.
pub async fn start_ready(
    client: &reqwest::Client,
    bin: &Path,
    sargs: &[String],
    log_path: &Path,
    startup_timeout: Duration,
) -> Result<ServerProcess> {
    eprintln!(
        "starting {} {} (log: {})",
        bin.display(),
        shell_join(sargs),
        log_path.display()
    );
    let server = {
        let (bin, sargs, log_path) = (bin.to_path_buf(), sargs.to_vec(), log_path.to_path_buf());
        // Off the async threads: starting blocks until the server has announced itself.
        tokio::task::spawn_blocking(move || start(&bin, &sargs, &log_path, startup_timeout))
            .await??
    };
    let endpoint = server.wait_ready(client, startup_timeout).await?;
    eprintln!("{} ready ({endpoint} answered 200)", server.base_url());
    Ok(server)
}

/// The servers of all modes, by the mode's index in `--modes`: `None` for a mode whose server
/// did not start, has failed, or was stopped. Dropping the fleet (at the end, on an error, on
/// Ctrl-C) stops every server it still holds, so none outlives the benchmark.
#[derive(Debug, Default)]
pub struct Fleet {
    pub servers: Vec<Option<ServerProcess>>,
}

impl Fleet {
    /// Stops every server still held: SIGTERM to all of them first (so they shut down in
    /// parallel), then waits for each, up to `grace` before SIGKILL. Returns each stopped
    /// server's mode index and how it ended.
    pub fn stop_all(&mut self, grace: Duration) -> Vec<(usize, Result<ExitStatus>)> {
        for server in self.servers.iter().flatten() {
            server.terminate();
        }
        self.servers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, slot)| slot.take().map(|server| (i, server.stop(grace))))
            .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop_all(DROP_GRACE);
    }
}

/// One server log per mode, `nmt-bench-server-MODE.log` (with `-N` added where two mode names
/// would give the same file name).
pub fn log_paths(dir: &Path, modes: &[String]) -> Vec<PathBuf> {
    let mut names: Vec<String> = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        let mut name = format!("nmt-bench-server-{}", file_safe(mode));
        if names.contains(&name) {
            name = format!("{name}-{i}");
        }
        names.push(name);
    }
    names
        .into_iter()
        .map(|n| dir.join(format!("{n}.log")))
        .collect()
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub fn warn_without_ort() {
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        eprintln!(
            "warning: ORT_DYLIB_PATH is not set; the server may not find ONNX Runtime \
             (`source scripts/env.sh`)"
        );
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

    #[test]
    fn one_log_file_per_mode() {
        let modes: Vec<String> = ["continuous", "a.b", "a_b"].map(String::from).to_vec();
        assert_eq!(
            log_paths(Path::new("/tmp/x"), &modes),
            [
                PathBuf::from("/tmp/x/nmt-bench-server-continuous.log"),
                PathBuf::from("/tmp/x/nmt-bench-server-a_b.log"),
                PathBuf::from("/tmp/x/nmt-bench-server-a_b-2.log"),
            ]
        );
    }
}
