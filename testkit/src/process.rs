//! `nmt-server` as a child process: started, its addresses read from its stdout, stopped.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::client::{poll_ready, ApiClient};

/// The announcements a starting server prints on stdout, in this order, once it is bound.
const ANNOUNCEMENTS: &str = "`listening on http://ADDR` and `grpc listening on ADDR`";

/// How many of the log's last lines an error quotes.
const LOG_TAIL_LINES: usize = 20;

/// Where the server's stderr (its log) goes.
#[derive(Debug, Clone, Default)]
pub enum Stderr {
    /// This process's stderr: the log shows up among the caller's own output.
    #[default]
    Inherit,
    /// A file, created (or truncated) at start and left behind for a person to read.
    File(PathBuf),
    /// A temporary file, deleted with the [`ServerProcess`]: for callers that read the log
    /// ([`ServerProcess::log`]) or want its tail in errors, but keep no file.
    TempFile,
}

/// How a server is started, and what dropping it does.
#[derive(Debug, Clone)]
pub struct StartOptions {
    pub stderr: Stderr,
    /// How long it may take to print both addresses (its models are loaded first).
    pub startup_timeout: Duration,
    /// Dropping the server sends SIGTERM and gives it this long to shut down gracefully before
    /// SIGKILL; `None` kills it at once.
    pub drop_grace: Option<Duration>,
}

impl Default for StartOptions {
    /// Stderr inherited, two minutes to start (a debug build on a loaded 2-core machine), killed
    /// on drop.
    fn default() -> Self {
        StartOptions {
            stderr: Stderr::Inherit,
            startup_timeout: Duration::from_secs(120),
            drop_grace: None,
        }
    }
}

/// Where the log went, as the running server keeps it.
#[derive(Debug)]
enum Log {
    Inherited,
    File(PathBuf),
    /// Held so that the file lives as long as the server.
    Temp(tempfile::NamedTempFile),
}

impl Log {
    fn path(&self) -> Option<&Path> {
        match self {
            Log::Inherited => None,
            Log::File(path) => Some(path),
            Log::Temp(file) => Some(file.path()),
        }
    }
}

#[derive(Debug)]
struct Process {
    child: Child,
    /// SIGTERM has been sent. It is sent once: a second one could cut the graceful shutdown
    /// short.
    term_sent: bool,
}

/// A running `nmt-server` (or a command that execs one), with the addresses it announced.
/// Dropped, it is stopped as [`StartOptions::drop_grace`] says.
#[derive(Debug)]
pub struct ServerProcess {
    /// Behind a lock so that a server shared by reference (by client tasks, by helpers that
    /// take `&ServerProcess`) can still be asked whether it has exited, and stopped.
    process: Mutex<Process>,
    pid: u32,
    base_url: String,
    grpc_addr: String,
    log: Log,
    drop_grace: Option<Duration>,
}

enum Announcement {
    Http(String),
    Grpc(String),
}

impl ServerProcess {
    /// Spawns `command` (its stdin closed, stdout read here, stderr as `options` says) and
    /// waits until it has printed both of its addresses. `command` is usually the
    /// `nmt-server` binary with `--port 0 --grpc-port 0`, but may be anything that ends up
    /// running it in the same process (e.g. `sh -c 'ulimit -n 256 && exec "$0" "$@"'`).
    ///
    /// Fails, with the tail of the log where there is one, when it exits or closes its stdout
    /// before that, or when `options.startup_timeout` runs out.
    pub fn start(mut command: Command, options: StartOptions) -> Result<Self> {
        let program = command.get_program().to_string_lossy().into_owned();
        let (log, stderr) = match options.stderr {
            Stderr::Inherit => (Log::Inherited, Stdio::inherit()),
            Stderr::File(path) => {
                let file = File::create(&path)
                    .with_context(|| format!("creating the server log {}", path.display()))?;
                (Log::File(path), Stdio::from(file))
            }
            Stderr::TempFile => {
                let file = tempfile::Builder::new()
                    .prefix("nmt-server-")
                    .suffix(".log")
                    .tempfile()
                    .context("creating a temporary server log")?;
                let handle = file.as_file().try_clone()?;
                (Log::Temp(file), Stdio::from(handle))
            }
        };
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {program} (build it with `cargo build -p nmt-server`, with \
                     `--release` for target/release)"
                )
            })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || read_announcements(stdout, &tx));
        let mut server = ServerProcess {
            pid: child.id(),
            process: Mutex::new(Process {
                child,
                term_sent: false,
            }),
            base_url: String::new(),
            grpc_addr: String::new(),
            log,
            drop_grace: options.drop_grace,
        };

        let timeout = options.startup_timeout;
        let deadline = Instant::now() + timeout;
        let (mut base_url, mut grpc_addr) = (None, None);
        let (base_url, grpc_addr) = loop {
            if let (Some(url), Some(addr)) = (&base_url, &grpc_addr) {
                break (url, addr);
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Announcement::Http(url)) => {
                    base_url.get_or_insert(url);
                }
                Ok(Announcement::Grpc(addr)) => {
                    grpc_addr.get_or_insert(addr);
                }
                Err(RecvTimeoutError::Timeout) => {
                    server.ensure_running(&format!("before printing {ANNOUNCEMENTS}"))?;
                    if Instant::now() >= deadline {
                        bail!(
                            "no {ANNOUNCEMENTS} from the server within {timeout:?}; {}",
                            server.log_excerpt()
                        );
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Its stdout is closed: the process is exiting.
                    let status = server.wait_exit(Duration::from_secs(5));
                    bail!(
                        "the server closed its stdout before printing {ANNOUNCEMENTS} (exit: {}); {}",
                        status.map_or("unknown".into(), |s| s.to_string()),
                        server.log_excerpt()
                    );
                }
            }
        };
        server.base_url = base_url.trim_end_matches('/').to_string();
        server.grpc_addr = grpc_addr.clone();
        Ok(server)
    }

    /// `http://ADDR`, as announced, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The HTTP `HOST:PORT`, for raw sockets.
    pub fn http_addr(&self) -> &str {
        self.base_url
            .strip_prefix("http://")
            .unwrap_or(&self.base_url)
    }

    /// The gRPC `HOST:PORT`, as announced.
    pub fn grpc_addr(&self) -> &str {
        &self.grpc_addr
    }

    /// The process id (of the server itself, when `command` exec'd it).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A typed client of this server's HTTP API over `http`.
    pub fn api(&self, http: reqwest::Client) -> ApiClient {
        ApiClient::new(http, &self.base_url)
    }

    /// Polls `/ready` until it answers 200 (see [`ApiClient::wait_ready`]); fails at once,
    /// with the log's tail, when the process exits first. Returns the path that answered.
    pub async fn wait_ready(
        &self,
        http: &reqwest::Client,
        timeout: Duration,
    ) -> Result<&'static str> {
        poll_ready(http, &self.base_url, timeout, || {
            self.ensure_running("before it was ready")
        })
        .await
    }

    /// The log file, unless stderr was inherited.
    pub fn log_path(&self) -> Option<&Path> {
        self.log.path()
    }

    /// Everything logged so far, unless stderr was inherited.
    pub fn log(&self) -> Option<String> {
        let path = self.log.path()?;
        Some(std::fs::read_to_string(path).unwrap_or_default())
    }

    /// What errors say about the log: its path and last lines.
    fn log_excerpt(&self) -> String {
        let Some(path) = self.log.path() else {
            return "its log went to this process's stderr".to_string();
        };
        let text = self.log().unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        if tail.is_empty() {
            format!("its log ({}) is empty", path.display())
        } else {
            format!("its log ({}) ends:\n{}", path.display(), tail.join("\n"))
        }
    }

    fn process(&self) -> MutexGuard<'_, Process> {
        // A panic elsewhere while holding the lock leaves the child as it was.
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&self) -> Result<Option<ExitStatus>> {
        Ok(self.process().child.try_wait()?)
    }

    /// Fails, with the log's tail, when the process has exited; `when` says when that was
    /// noticed (e.g. `during the cell`; may be empty).
    pub fn ensure_running(&self, when: &str) -> Result<()> {
        if let Some(status) = self.try_wait()? {
            let when = if when.is_empty() {
                String::new()
            } else {
                format!(" {when}")
            };
            bail!("the server exited ({status}){when}; {}", self.log_excerpt());
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit; `None` if it has not.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_wait() {
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
    pub fn terminate(&self) {
        let mut process = self.process();
        if process.term_sent || !matches!(process.child.try_wait(), Ok(None)) {
            return;
        }
        // Checked and sent under the lock: the process is not reaped in between, so its pid
        // cannot have been reused.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        process.term_sent = true;
    }

    /// SIGTERM ([`ServerProcess::terminate`]), then up to `grace` for a graceful shutdown;
    /// SIGKILL after that. Returns how it ended (at once if it had already).
    pub fn stop(&self, grace: Duration) -> Result<ExitStatus> {
        self.terminate();
        if let Some(status) = self.wait_exit(grace) {
            return Ok(status);
        }
        eprintln!(
            "server (pid {}) still running {grace:?} after SIGTERM: SIGKILL",
            self.pid
        );
        self.kill()
    }

    /// SIGKILL, and the exit status.
    fn kill(&self) -> Result<ExitStatus> {
        let mut process = self.process();
        let _ = process.child.kill();
        Ok(process.child.wait()?)
    }

    /// The server's peak resident memory so far (`VmHWM`), in MiB; `None` once it has exited
    /// or where `/proc` does not say.
    pub fn peak_rss_mib(&self) -> Option<f64> {
        self.proc_status_mib("VmHWM:")
    }

    /// The server's resident memory now (`VmRSS`), in MiB.
    pub fn rss_mib(&self) -> Option<f64> {
        self.proc_status_mib("VmRSS:")
    }

    /// Starts [`Self::peak_rss_mib`] again from the memory resident now (Linux's
    /// `clear_refs` 5), so that a peak can be read per request.
    pub fn reset_peak_rss(&self) -> Result<()> {
        let path = format!("/proc/{}/clear_refs", self.pid);
        std::fs::write(&path, "5").with_context(|| format!("writing {path}"))
    }

    /// A `/proc/PID/status` field in kB, as MiB; `None` once the server has exited.
    fn proc_status_mib(&self, field: &str) -> Option<f64> {
        let mut process = self.process();
        if !matches!(process.child.try_wait(), Ok(None)) {
            return None;
        }
        proc_status_mib(&self.pid.to_string(), field)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = match self.drop_grace {
            Some(grace) => self.stop(grace),
            None => self.kill(),
        };
    }
}

/// Sends the server's address announcements as they come, then reads its stdout to the end:
/// a full pipe would block the server.
fn read_announcements(stdout: ChildStdout, tx: &mpsc::Sender<Announcement>) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim();
        let announcement = if let Some(addr) = line.strip_prefix("grpc listening on ") {
            Announcement::Grpc(addr.trim().to_string())
        } else if let Some(url) = line.strip_prefix("listening on ") {
            Announcement::Http(url.trim().to_string())
        } else {
            continue;
        };
        // Once the server has started nobody receives; the lines are drained all the same.
        let _ = tx.send(announcement);
    }
}

/// A field of `/proc/PROCESS/status` given in kB (`VmHWM:`, `VmRSS:`), as MiB; `PROCESS` is a
/// pid or `self`. `None` where `/proc` does not say.
pub fn proc_status_mib(process: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
