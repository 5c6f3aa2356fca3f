//! The command line: every flag of `nmt-server`, each also settable by an environment
//! variable, and the settings of the other layers read from them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::scheduler::Batching;
use crate::service::RequestLimits;
use crate::transport::connections::Timeouts;
use crate::transport::grpc::GrpcOptions;
use nmt_engine::limits::{self, DecodingArgs};
use nmt_engine::onnx::Device;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// English -> Spanish translation server: greedy decoding with a KV cache over ONNX Runtime,
/// continuous batching across requests, Prometheus metrics at /metrics.
///
/// Every flag but `--print-openapi` can also be set by the environment variable named after
/// it (`NMT_` + the flag in upper snake case, e.g. `NMT_PORT=9000`).
#[derive(Clone, Debug, Parser)]
#[command(name = "nmt-server", version, about, long_about)]
pub struct Args {
    /// Model package directories (manifest.json, tokenizer.json, encoder.onnx,
    /// decoder.onnx): repeat the flag or separate with commas to serve several models; a
    /// request picks one by its manifest name with `"model"`. Each model gets its own worker
    /// thread and batch.
    #[arg(
        long,
        env = "NMT_MODEL_DIR",
        value_delimiter = ',',
        default_value = "models/en-es-l10n,models/en-es-rel-ldpe"
    )]
    pub model_dir: Vec<PathBuf>,

    /// The model that answers requests naming none (default: the first `--model-dir`).
    #[arg(long, env = "NMT_DEFAULT_MODEL")]
    pub default_model: Option<String>,

    /// Address to listen on (HTTP and gRPC).
    #[arg(long, env = "NMT_HOST", default_value = "127.0.0.1")]
    pub host: String,

    /// HTTP port; 0 picks a free port. The bound address is printed on stdout as
    /// `listening on http://ADDR`.
    #[arg(long, env = "NMT_PORT", default_value_t = 8080)]
    pub port: u16,

    /// gRPC port (service nmt.v1.Translator, proto/translate.proto); 0 picks a free port,
    /// printed as `grpc listening on ADDR`.
    #[arg(long, env = "NMT_GRPC_PORT", default_value_t = 50051)]
    pub grpc_port: u16,

    /// Where the graphs run: `auto` takes CUDA when the ONNX Runtime library has it and a
    /// GPU answers, `cuda` insists (falling back to CPU with a warning), `cpu` never tries.
    /// The log says which one is in use.
    #[arg(long, env = "NMT_DEVICE", value_enum, default_value_t = Device::Auto)]
    pub device: Device,

    /// Threads one ONNX Runtime operator may use. 1 leaves the other cores to HTTP and to
    /// other workers (as many workers as cores is the fastest under many clients); on a 2-core
    /// machine 2 made one client's float32 translations about 1.4-1.6x faster, int8's 1.05x
    /// (docs/serving.md).
    #[arg(long, env = "NMT_INTRA_OP_THREADS", default_value_t = 1)]
    pub intra_op_threads: usize,

    /// Model workers per model, each with its own decoder session and its own running batch on
    /// its own thread, taking turns at one encoder session (CTranslate2's `inter_threads`,
    /// whose replicas share one model). A request goes whole to the
    /// worker expected to finish its accepted work first. One worker with one intra-op thread
    /// keeps a core for HTTP and tokenization; under many concurrent clients, as many workers as
    /// cores (times `--intra-op-threads`) use them all (docs/benchmarks/).
    #[arg(long, env = "NMT_MODEL_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub model_workers: u16,

    /// `continuous`: requests join the running decoder batch between steps.
    /// `off`: one request at a time (the baseline for benchmarks).
    #[arg(long, env = "NMT_BATCHING", value_enum, default_value_t = Batching::Continuous)]
    pub batching: Batching,

    /// Most texts decoded together in a worker's running batch (1 to 4096), or `auto`: 32
    /// for a package with float32 weights, 8 for int8. A step reads every row's keys and
    /// values beside the weights: float32 weights come from memory every step, and more rows
    /// share that read; int8 weights stay in the CPU's cache while the rows leave room. On a
    /// 2-core AMD EPYC at 64 clients with two workers, int8 made 20,238 target subwords/s at 8
    /// rows against 15,593 at 32 (and a third less memory), float32 8,064 at 32 against 7,164
    /// at 16 (docs/benchmarks/ctranslate2-gap.md, "Session 30").
    #[arg(long, env = "NMT_MAX_BATCH_SIZE", default_value = "auto")]
    pub max_batch_size: limits::BatchRows,

    /// Most tokens in the running batch, counting each text's source and output budget: bounds
    /// the memory of the caches.
    #[arg(long, env = "NMT_MAX_BATCH_TOKENS", default_value_t = 16384)]
    pub max_batch_tokens: usize,

    /// Requests that may wait to join the batch; more get 429 with Retry-After. A backstop:
    /// `--max-queue-wait` usually refuses first.
    #[arg(long, env = "NMT_MAX_QUEUED_REQUESTS", default_value_t = 256)]
    pub max_queued_requests: usize,

    /// Seconds a request may expect to take, and what every accepted request is promised:
    /// when its model, sharing rows fairly among the requests it has accepted, is expected to
    /// finish it later than this at its measured speed (work counted in cost units: a step
    /// costs more with its rows and the sources and outputs they attend to), or taking
    /// it would make an accepted request finish later than promised, it gets 429 at once, with
    /// a Retry-After of when the accepted work should be done, instead of being accepted to
    /// time out. A request that finds the model idle is taken even when it needs longer, unless
    /// it needs longer than the request timeout allows (413). Default: half of
    /// `--request-timeout`, leaving room for the estimate's error.
    #[arg(long, env = "NMT_MAX_QUEUE_WAIT")]
    pub max_queue_wait: Option<f64>,

    /// Seconds from a request's arrival to its answer; later gives 504 and the request's
    /// texts leave the batch. A request whose own work is expected to take more than 90% of
    /// it even on an idle model is refused at once (413 `request_too_costly`).
    #[arg(long, env = "NMT_REQUEST_TIMEOUT", default_value_t = limits::DEFAULT_REQUEST_TIMEOUT_SECONDS)]
    pub request_timeout: f64,

    /// Most texts in one request (413 above).
    #[arg(long, env = "NMT_MAX_TEXTS_PER_REQUEST", default_value_t = limits::DEFAULT_MAX_TEXTS_PER_REQUEST)]
    pub max_texts_per_request: usize,

    /// How texts are decoded: input and output bounds, length rules, placeholder masking
    /// (the engine's flags, shared with nmt-translate and nmt-eval).
    #[command(flatten)]
    pub decoding: DecodingArgs,

    /// Largest request body in bytes (413 above). A `Content-Length` over it is refused
    /// before the body is read.
    #[arg(long, env = "NMT_MAX_BODY_BYTES", default_value_t = limits::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,

    /// Seconds a client has to send a complete request head: from connecting for the first
    /// request of a connection, from the head's first byte for the next ones (from the
    /// previous answer for a head whose first bytes came with the previous request). Slower,
    /// the connection is closed without an answer. gRPC: the HTTP/2 connection preface is due
    /// this long after connecting.
    #[arg(long, env = "NMT_HEADER_READ_TIMEOUT", default_value_t = 10.0)]
    pub header_read_timeout: f64,

    /// Seconds from the end of a request head to the end of its body; later gives 408 and the
    /// connection closes. `--request-timeout` starts once the body is in.
    #[arg(long, env = "NMT_BODY_READ_TIMEOUT", default_value_t = 30.0)]
    pub body_read_timeout: f64,

    /// Seconds an HTTP connection may stay open between a response and the next request's
    /// first byte; 0 closes every connection after one request. Above the 60 s idle timeout
    /// of common load balancers, so that they, not the server, close idle connections.
    #[arg(long, env = "NMT_KEEP_ALIVE_TIMEOUT", default_value_t = 75.0)]
    pub keep_alive_timeout: f64,

    /// Most open connections, HTTP and gRPC together (default: the open-file limit less 128,
    /// at most 10000). Beyond it new connections wait in the listen backlog, and HTTP
    /// connections that are waiting for a request without having sent a byte of it for
    /// 250 ms are closed to make room.
    #[arg(long, env = "NMT_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// Seconds between HTTP/2 pings on a quiet gRPC connection; a peer that does not answer
    /// within 20 s is dropped. 0 sends none.
    #[arg(long, env = "NMT_GRPC_KEEPALIVE_INTERVAL", default_value_t = 60.0)]
    pub grpc_keepalive_interval: f64,

    /// Seconds in-flight requests get to finish after SIGTERM or Ctrl-C; then the server
    /// exits anyway. Connections without a translation request in flight (idle, or still
    /// sending a head or a body) are not waited for, and the server exits at most 1 s after
    /// the last translation's answer.
    #[arg(long, env = "NMT_SHUTDOWN_GRACE", default_value_t = 30.0)]
    pub shutdown_grace: f64,

    /// ONNX Runtime shared library (libonnxruntime.so). `source scripts/env.sh` sets it
    /// from the onnxruntime PyPI wheel.
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_dylib_path: Option<PathBuf>,

    /// Log format on stderr (stdout carries only the `listening on` lines). `RUST_LOG`
    /// sets the levels (default `info`).
    #[arg(long, env = "NMT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Print the OpenAPI document of the HTTP API (what `GET /openapi.json` serves) on
    /// stdout and exit, without loading a model. A command rather than a setting, so it has
    /// no environment variable.
    #[arg(long)]
    pub print_openapi: bool,
}

impl Args {
    /// The defaults, with `model_dir` (for tests and embedding).
    pub fn for_model(model_dir: impl Into<PathBuf>) -> Self {
        let mut args = Args::parse_from(["nmt-server"]);
        args.model_dir = vec![model_dir.into()];
        args
    }

    /// The limits every request is checked against.
    pub fn request_limits(&self) -> anyhow::Result<RequestLimits> {
        self.decoding.apply(RequestLimits {
            max_texts_per_request: self.max_texts_per_request,
            max_body_bytes: self.max_body_bytes,
            request_timeout: Args::seconds(self.request_timeout, "request-timeout")?,
            ..RequestLimits::default()
        })
    }

    /// `--max-queue-wait`, or its default.
    pub fn max_queue_wait(&self) -> anyhow::Result<Duration> {
        match self.max_queue_wait {
            Some(seconds) => Args::positive_seconds(seconds, "max-queue-wait"),
            None => Ok(Args::seconds(self.request_timeout, "request-timeout")? / 2),
        }
    }

    /// How long HTTP connections may wait for a request.
    pub fn connection_timeouts(&self) -> anyhow::Result<Timeouts> {
        let keep_alive = Args::seconds(self.keep_alive_timeout, "keep-alive-timeout")?;
        Ok(Timeouts {
            header_read: Args::positive_seconds(self.header_read_timeout, "header-read-timeout")?,
            keep_alive: (!keep_alive.is_zero()).then_some(keep_alive),
        })
    }

    pub fn body_read_timeout(&self) -> anyhow::Result<Duration> {
        Args::positive_seconds(self.body_read_timeout, "body-read-timeout")
    }

    pub fn shutdown_grace(&self) -> anyhow::Result<Duration> {
        Args::seconds(self.shutdown_grace, "shutdown-grace")
    }

    pub fn grpc_options(&self) -> anyhow::Result<GrpcOptions> {
        let interval = Args::seconds(self.grpc_keepalive_interval, "grpc-keepalive-interval")?;
        Ok(GrpcOptions {
            preface_timeout: self.connection_timeouts()?.header_read,
            keepalive_interval: (!interval.is_zero()).then_some(interval),
        })
    }

    fn seconds(value: f64, flag: &str) -> anyhow::Result<Duration> {
        Duration::try_from_secs_f64(value)
            .map_err(|_| anyhow::anyhow!("--{flag} must be a non-negative number of seconds"))
    }

    fn positive_seconds(value: f64, flag: &str) -> anyhow::Result<Duration> {
        match Args::seconds(value, flag)? {
            zero if zero.is_zero() => anyhow::bail!("--{flag} must be more than 0 seconds"),
            duration => Ok(duration),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
        let args =
            Args::try_parse_from(["nmt-server", "--port", "0", "--intra-op-threads", "2"]).unwrap();
        assert_eq!(args.port, 0);
        assert_eq!(args.intra_op_threads, 2);
        assert_eq!(args.model_workers, 1);
        assert!(Args::try_parse_from(["nmt-server", "--log-format", "xml"]).is_err());
        assert!(Args::try_parse_from(["nmt-server", "--model-workers", "0"]).is_err());
        let mut negative = Args::parse_from(["nmt-server", "--runaway-ratio=-1"]);
        assert!(negative.request_limits().is_err());
        negative.decoding.runaway_ratio = 0.0;
        assert_eq!(negative.request_limits().unwrap().runaway_ratio, 0.0);
        assert!(!args.print_openapi);
        assert!(Args::parse_from(["nmt-server", "--print-openapi"]).print_openapi);
        // The offline tools decode under the engine's defaults: the server's must be them.
        assert_eq!(
            Args::parse_from(["nmt-server"]).request_limits().unwrap(),
            RequestLimits::default()
        );
    }

    #[test]
    fn connection_flags_have_the_library_defaults_and_are_checked() {
        let args = Args::parse_from(["nmt-server"]);
        assert_eq!(
            args.body_read_timeout().unwrap(),
            crate::transport::http::DEFAULT_BODY_READ_TIMEOUT
        );
        let grpc = args.grpc_options().unwrap();
        let defaults = GrpcOptions::default();
        assert_eq!(
            (grpc.preface_timeout, grpc.keepalive_interval),
            (defaults.preface_timeout, defaults.keepalive_interval)
        );
        assert_eq!(args.max_connections, None);

        let args = Args::parse_from([
            "nmt-server",
            "--header-read-timeout",
            "0.5",
            "--keep-alive-timeout",
            "0",
            "--grpc-keepalive-interval",
            "0",
            "--max-connections",
            "64",
        ]);
        let timeouts = args.connection_timeouts().unwrap();
        assert_eq!(timeouts.header_read, Duration::from_millis(500));
        assert_eq!(timeouts.keep_alive, None, "0 turns keep-alive off");
        assert_eq!(args.grpc_options().unwrap().keepalive_interval, None);
        assert_eq!(args.max_connections, Some(64));

        let args = Args::parse_from(["nmt-server"]);
        assert_eq!(args.max_queue_wait().unwrap(), Duration::from_secs(15));
        let args = Args::parse_from(["nmt-server", "--request-timeout", "9"]);
        assert_eq!(args.max_queue_wait().unwrap(), Duration::from_secs_f64(4.5));
        let args = Args::parse_from(["nmt-server", "--max-queue-wait", "2.5"]);
        assert_eq!(args.max_queue_wait().unwrap(), Duration::from_secs_f64(2.5));

        assert!(Args::parse_from(["nmt-server", "--max-queue-wait=0"])
            .max_queue_wait()
            .is_err());
        for flag in [
            "--header-read-timeout=0",
            "--body-read-timeout=0",
            "--keep-alive-timeout=-1",
        ] {
            let args = Args::parse_from(["nmt-server", flag]);
            let checked = args
                .connection_timeouts()
                .and_then(|_| args.body_read_timeout());
            assert!(checked.is_err(), "{flag}");
        }
    }
}
