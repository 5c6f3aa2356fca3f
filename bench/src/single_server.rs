//! What the benchmarks against one server (`overload`, `beside-large`) share, so that both
//! treat the server and describe the run the same way: the options that choose the server
//! ([`SingleServerArgs`]), the server's lifecycle around the measurements
//! ([`ServerSource::with_server`]: started here or already running at `--url`, ready before
//! anything is sent, checked between steps, stopped at the end, Ctrl-C) and the opening lines
//! of their reports ([`RunHeader`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use nmt_testkit::{ApiClient, ServerProcess};
use serde::{Deserialize, Serialize};

use crate::cli::{interrupted, CommonArgs, Durations};
use crate::overload::report::cpu_model;
use crate::overload::{parse_fields, RequestFields};
use crate::report::{nproc, shell_join, utc_now};
use crate::server::{log_paths, server_args, start_ready, warn_without_ort};

/// The options every benchmark against one server takes besides its own: which server, and
/// what every request carries beside its text.
#[derive(Debug, clap::Args)]
pub struct SingleServerArgs {
    /// Drive the server already running at this base URL (e.g. `http://127.0.0.1:8080`)
    /// instead of starting one. The server arguments are then not used to start anything, only
    /// read for the settings the benchmark takes from them (`overload`: `--target-wait` and
    /// `--saturation-clients`; `beside-large`: `--max-texts-per-request`): give the flags that
    /// server runs with.
    #[arg(long, env = "NMT_BENCH_URL")]
    pub url: Option<String>,

    /// A JSON object whose fields every request (in `beside-large`, small and large alike)
    /// carries beside `text`, e.g. `{"target_length":"source"}` to spare a length-aware model
    /// its length predictor.
    #[arg(long, env = "NMT_BENCH_REQUEST_FIELDS", value_parser = parse_fields)]
    pub request_fields: Option<RequestFields>,

    /// Batching mode of the server the bench starts (`--batching MODE`); `default` passes no
    /// `--batching` flag.
    #[arg(long, env = "NMT_BENCH_MODE", default_value = "continuous")]
    pub mode: String,
}

/// Where the server under test comes from ([`ServerSource::new`]).
#[derive(Debug)]
pub struct ServerSource {
    /// `--url`, without a trailing `/`: drive the server already running there, start none.
    url: Option<String>,
    /// Without `--url`, the bench starts `bin args...`, its stderr to `log_path`.
    bin: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
    /// The server arguments the bench was given (in `args` too): all it knows of a server
    /// already running at `--url`.
    given_args: Vec<String>,
    /// How long the server (either one) may take to answer ready.
    startup_timeout: Duration,
}

/// The server the bench started, if it did (none with `--url`). Dropping it stops that
/// server, so an interruption, which drops the whole run, leaves no server behind.
#[derive(Debug)]
pub struct StartedServer(Option<ServerProcess>);

impl StartedServer {
    /// Fails when the server the bench started has exited: what was measured after that is
    /// not the server's. Measurements call it after each step.
    pub fn check_alive(&mut self) -> Result<()> {
        match &self.0 {
            Some(server) => server.ensure_running(""),
            None => Ok(()),
        }
    }

    /// Stops the started server, giving it 30 s to shut down gracefully, and says how it
    /// ended. Off the async threads: stopping waits for the process.
    async fn stop(self) {
        if let Some(s) = self.0 {
            match tokio::task::spawn_blocking(move || s.stop(Duration::from_secs(30))).await {
                Ok(Ok(status)) => eprintln!("server stopped: {status}"),
                Ok(Err(e)) => eprintln!("server stop failed: {e:#}"),
                Err(e) => eprintln!("stopping the server failed: {e}"),
            }
        }
    }
}

/// How a benchmark names itself and the parts of its run, in what it says on stderr.
#[derive(Debug)]
pub struct RunNames {
    /// The subcommand, as in `nmt-bench COMMAND: ...`.
    pub command: &'static str,
    /// What the run is made of (`rates`, `phases`): those that ran are reported.
    pub parts: &'static str,
}

impl ServerSource {
    /// The server under test, as chosen by `options`: the one at `--url`, or the one the
    /// bench is to start with `common`'s server arguments, its log
    /// `nmt-bench-server-LOG_NAME.log` in the log directory (created here). Warns when that
    /// server may not find ONNX Runtime.
    pub fn new(
        options: &SingleServerArgs,
        common: &CommonArgs,
        durations: &Durations,
        log_name: &str,
    ) -> Result<Self> {
        let url = options
            .url
            .as_deref()
            .map(|u| u.trim_end_matches('/').to_string());
        let given_args = common.extra_server_args();
        if url.is_none() {
            warn_without_ort();
        }
        let log_path = log_paths(&common.log_dir()?, &[log_name.to_string()])
            .pop()
            .expect("one name, one path");
        Ok(ServerSource {
            args: server_args(&common.model_dir, &options.mode, &given_args),
            url,
            bin: common.server_bin.clone(),
            given_args,
            log_path,
            startup_timeout: durations.startup_timeout,
        })
    }

    /// Runs `bench` on `runtime` against this server: `--url` once it answers ready, else a
    /// server started here (and ready). `bench` gets the server's base URL and the
    /// [`StartedServer`] to check between its steps. The started server is stopped at the
    /// end, whether `bench` succeeded or not, and on Ctrl-C or SIGTERM.
    ///
    /// Returns whether the run finished. When it did not, it says why on stderr (`nmt-bench
    /// COMMAND: ...`, with the `names`): the error, and that the parts that ran are reported,
    /// or the interruption; the caller then reports what `bench` got done.
    pub fn with_server<B>(
        &self,
        runtime: &tokio::runtime::Runtime,
        client: &reqwest::Client,
        names: &RunNames,
        bench: B,
    ) -> bool
    where
        B: AsyncFnOnce(&str, &mut StartedServer) -> Result<()>,
    {
        let mut failure: Option<anyhow::Error> = None;
        let interrupted_run = runtime.block_on(async {
            let run = async {
                // Dropped on an interruption, the server is stopped.
                let mut server = StartedServer(None);
                let outcome = match self.reach(client, &mut server).await {
                    Ok(base_url) => bench(&base_url, &mut server).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = outcome {
                    failure = Some(e);
                }
                server.stop().await;
            };
            tokio::select! {
                () = run => false,
                () = interrupted() => true,
            }
        });
        let RunNames { command, parts } = names;
        let mut finished = true;
        if let Some(e) = &failure {
            eprintln!("nmt-bench {command}: {e:#}\n(the {parts} that ran are reported)");
            finished = false;
        }
        if interrupted_run {
            eprintln!("nmt-bench {command}: interrupted; partial results follow");
            finished = false;
        }
        finished
    }

    /// The base URL of this server once it is ready: `--url`, or the server started here,
    /// which goes into `started`.
    async fn reach(&self, client: &reqwest::Client, started: &mut StartedServer) -> Result<String> {
        match &self.url {
            Some(url) => {
                ApiClient::new(client.clone(), url)
                    .wait_ready(self.startup_timeout)
                    .await?;
                Ok(url.clone())
            }
            None => {
                let server = start_ready(
                    client,
                    &self.bin,
                    &self.args,
                    &self.log_path,
                    self.startup_timeout,
                )
                .await?;
                let url = server.base_url().to_string();
                started.0 = Some(server);
                Ok(url)
            }
        }
    }
}

/// The server under test, as a report describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerUnderTest {
    /// Set when the bench started the server.
    pub bin: Option<String>,
    /// The full argument list of the started server; with `--url`, the `--server-arg`s the
    /// bench was told the server runs with.
    pub args: Vec<String>,
    /// The URL given with `--url`.
    pub url: Option<String>,
}

impl ServerUnderTest {
    /// The server of `source`: the one the bench started, with its full argument list, or
    /// the one at `--url`, with the server arguments the bench was given.
    pub fn of(source: &ServerSource) -> Self {
        let started = source.url.is_none();
        ServerUnderTest {
            bin: started.then(|| source.bin.display().to_string()),
            args: if started {
                source.args.clone()
            } else {
                source.given_args.clone()
            },
            url: source.url.clone(),
        }
    }
}

/// How a run against one server was made: what its report opens with. The reports flatten
/// it into their JSON, whose top level keeps these fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunHeader {
    /// UTC, `YYYY-MM-DD HH:MM:SS UTC`.
    pub date: String,
    /// How `nmt-bench` was invoked.
    pub command_line: String,
    /// From /proc/cpuinfo, or lscpu.
    pub cpu_model: Option<String>,
    /// `nproc` on the machine that ran the clients (and the server, when the bench started it).
    pub nproc: usize,
    /// Worker threads of the clients' tokio runtime.
    pub client_threads: usize,
    /// The server under test: the one the bench started, or the `--url` it was given.
    pub server: ServerUnderTest,
    /// The model name the server reported.
    pub model: Option<String>,
}

impl RunHeader {
    /// This run's header: the time now, this process's command line, this machine, the
    /// server of `source` and the `model` it reported.
    pub fn now(common: &CommonArgs, source: &ServerSource, model: Option<String>) -> Self {
        RunHeader {
            date: utc_now(),
            command_line: shell_join(&std::env::args().collect::<Vec<_>>()),
            cpu_model: cpu_model(),
            nproc: nproc(),
            client_threads: common.client_threads,
            server: ServerUnderTest::of(source),
            model,
        }
    }

    /// Appends the Markdown list items that open a report: date, command, server, CPU (with
    /// nproc and client threads) and model.
    pub fn write_markdown(&self, s: &mut String) {
        let _ = writeln!(s, "- date: {}", self.date);
        let _ = writeln!(s, "- command: `{}`", self.command_line);
        match (&self.server.bin, &self.server.url) {
            (Some(bin), _) => {
                let _ = writeln!(
                    s,
                    "- server (started by the bench): `{bin} {}`",
                    shell_join(&self.server.args)
                );
            }
            (None, url) => {
                let _ = writeln!(
                    s,
                    "- server: already running at {} (its flags, as given to the bench: `{}`)",
                    url.as_deref().unwrap_or("?"),
                    shell_join(&self.server.args)
                );
            }
        }
        let _ = writeln!(
            s,
            "- CPU: {}; nproc: {} ({}clients on {} tokio worker thread{})",
            self.cpu_model.as_deref().unwrap_or("unknown"),
            self.nproc,
            if self.server.bin.is_some() {
                "server and clients on the same machine; "
            } else {
                ""
            },
            self.client_threads,
            if self.client_threads == 1 { "" } else { "s" }
        );
        if let Some(model) = &self.model {
            let _ = writeln!(s, "- model: {model}");
        }
    }
}

/// A request body as a report shows it: `text` beside the `--request-fields` (`fields`, as
/// the report holds them).
pub fn example_body(fields: Option<&serde_json::Value>, text: serde_json::Value) -> String {
    match fields {
        Some(serde_json::Value::Object(f)) => {
            let mut body = f.clone();
            body.insert("text".into(), text);
            serde_json::Value::Object(body).to_string()
        }
        _ => serde_json::json!({ "text": text }).to_string(),
    }
}

#[cfg(test)]
impl RunHeader {
    /// The header of the reports' tests: `nmt-server SERVER_ARGS` started by the bench on a
    /// 2-core AMD EPYC, clients on one thread.
    pub fn for_tests(command_line: &str, server_args: &[&str], model: Option<&str>) -> Self {
        RunHeader {
            date: "1970-01-01 00:00:00 UTC".into(),
            command_line: command_line.into(),
            cpu_model: Some("AMD EPYC".into()),
            nproc: 2,
            client_threads: 1,
            server: ServerUnderTest {
                bin: Some("nmt-server".into()),
                args: server_args.iter().map(|a| a.to_string()).collect(),
                url: None,
            },
            model: model.map(str::to_string),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markdown(header: &RunHeader) -> String {
        let mut s = String::new();
        header.write_markdown(&mut s);
        s
    }

    #[test]
    fn header_of_a_server_started_by_the_bench() {
        let header = RunHeader::for_tests("nmt-bench overload --x 'y z'", &["--a", "b c"], None);
        assert_eq!(
            markdown(&header),
            "- date: 1970-01-01 00:00:00 UTC\n\
             - command: `nmt-bench overload --x 'y z'`\n\
             - server (started by the bench): `nmt-server --a 'b c'`\n\
             - CPU: AMD EPYC; nproc: 2 (server and clients on the same machine; clients on 1 tokio worker thread)\n"
        );
    }

    #[test]
    fn header_of_a_server_already_running() {
        let mut header = RunHeader::for_tests("nmt-bench beside-large", &["--b"], Some("en-es"));
        header.server.bin = None;
        header.server.url = Some("http://127.0.0.1:8080".into());
        header.cpu_model = None;
        header.client_threads = 2;
        assert_eq!(
            markdown(&header),
            "- date: 1970-01-01 00:00:00 UTC\n\
             - command: `nmt-bench beside-large`\n\
             - server: already running at http://127.0.0.1:8080 (its flags, as given to the bench: `--b`)\n\
             - CPU: unknown; nproc: 2 (clients on 2 tokio worker threads)\n\
             - model: en-es\n"
        );
    }

    fn source(url: Option<&str>) -> ServerSource {
        ServerSource {
            url: url.map(str::to_string),
            bin: PathBuf::from("target/release/nmt-server"),
            args: vec!["--model-dir".into(), "m".into(), "--x".into()],
            log_path: PathBuf::from("server.log"),
            given_args: vec!["--x".into()],
            startup_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_server_under_test_is_the_started_one_or_the_given_url() {
        let started = ServerUnderTest::of(&source(None));
        assert_eq!(started.bin.as_deref(), Some("target/release/nmt-server"));
        assert_eq!(started.args, ["--model-dir", "m", "--x"]);
        assert_eq!(started.url, None);
        let running = ServerUnderTest::of(&source(Some("http://h:1")));
        assert_eq!(running.bin, None);
        assert_eq!(running.args, ["--x"]);
        assert_eq!(running.url.as_deref(), Some("http://h:1"));
    }

    #[test]
    fn example_bodies_carry_the_request_fields() {
        assert_eq!(example_body(None, "VERSE".into()), r#"{"text":"VERSE"}"#);
        let fields = serde_json::json!({"target_length": "source"});
        assert_eq!(
            example_body(Some(&fields), serde_json::json!(["A", "B"])),
            r#"{"target_length":"source","text":["A","B"]}"#
        );
    }

    #[test]
    fn the_header_stays_at_the_top_level_of_the_json() {
        #[derive(Serialize)]
        struct Report {
            #[serde(flatten)]
            header: RunHeader,
            verses: usize,
        }
        let report = Report {
            header: RunHeader::for_tests("c", &[], None),
            verses: 1,
        };
        // Field order as the reports had it before the header was shared.
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            r#"{"date":"1970-01-01 00:00:00 UTC","command_line":"c","cpu_model":"AMD EPYC","nproc":2,"client_threads":1,"server":{"bin":"nmt-server","args":[],"url":null},"model":null,"verses":1}"#
        );
    }
}
