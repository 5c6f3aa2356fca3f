//! Command line, start-up and serving.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use tracing_subscriber::EnvFilter;

use crate::decode::SpecialIds;
use crate::http::{app, AppState, Limits};
use crate::onnx::{self, OrtBackend, SessionOptions};
use crate::package::{ModelPackage, TextCodec};
use crate::worker::Translator;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// English -> Spanish translation server: greedy decoding with a KV cache over ONNX Runtime.
#[derive(Clone, Debug, Parser)]
#[command(name = "nmt-server", version, about)]
pub struct Args {
    /// Model package directory (manifest.json, tokenizer.json, encoder.onnx, decoder.onnx).
    #[arg(long, env, default_value = "models/en-es-transformer")]
    pub model_dir: PathBuf,

    /// Address to listen on.
    #[arg(long, env, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on; 0 picks a free port (the real one is printed).
    #[arg(long, env, default_value_t = 8080)]
    pub port: u16,

    /// Threads one ONNX Runtime operator may use. On a 2-core machine 1 was measured
    /// fastest: waking threads costs more than the work of one decoder step.
    #[arg(long, env, default_value_t = 1)]
    pub intra_op_threads: usize,

    /// Most texts in one request (413 above).
    #[arg(long, env, default_value_t = 64)]
    pub max_texts_per_request: usize,

    /// Most subword tokens in one text (413 above). Lowered to the model's own limit when
    /// the manifest has one.
    #[arg(long, env, default_value_t = 256)]
    pub max_input_tokens: usize,

    /// Largest request body in bytes (413 above).
    #[arg(long, env, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,

    /// Output length bound: at most `ratio * source_tokens + offset` tokens per text (and
    /// never more than the manifest's `max_target_tokens`).
    #[arg(long, env, default_value_t = 2.0)]
    pub max_length_ratio: f64,

    /// See `--max-length-ratio`.
    #[arg(long, env, default_value_t = 10)]
    pub max_length_offset: usize,

    /// Requests that may wait for the model; more get 429.
    #[arg(long, env, default_value_t = 256)]
    pub queue_capacity: usize,

    /// ONNX Runtime shared library (libonnxruntime.so). `source scripts/env.sh` sets it
    /// from the onnxruntime PyPI wheel.
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_dylib_path: Option<PathBuf>,

    /// Log format on stderr (stdout carries only the `listening on` line).
    #[arg(long, env, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Args {
    /// The defaults, with `model_dir` (for tests and embedding).
    pub fn for_model(model_dir: impl Into<PathBuf>) -> Self {
        let mut args = Args::parse_from(["nmt-server"]);
        args.model_dir = model_dir.into();
        args
    }
}

/// Logs to stderr; `RUST_LOG` overrides the default `info` level.
pub fn init_tracing(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,ort=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Loads ONNX Runtime and the model package, starts the model worker and returns the
/// state the router needs. Blocking (reads and optimises the graphs).
pub fn load(args: &Args) -> anyhow::Result<AppState> {
    let env = onnx::environment(args.ort_dylib_path.as_deref())?;
    let package = ModelPackage::load(&args.model_dir)?;
    let manifest = &package.manifest;
    let backend = OrtBackend::load(
        &env,
        &package.dir,
        manifest,
        &SessionOptions {
            intra_op_threads: args.intra_op_threads,
        },
    )?;
    let mut max_input_tokens = args.max_input_tokens;
    if let Some(model_max) = manifest.limits.max_source_tokens {
        // The model's limit counts EOS; the request limit does not.
        let model_max = model_max.saturating_sub(1);
        if model_max < max_input_tokens {
            tracing::info!(
                requested = max_input_tokens,
                model_max,
                "max input tokens lowered to the model's limit"
            );
            max_input_tokens = model_max;
        }
    }
    let limits = Limits {
        max_texts_per_request: args.max_texts_per_request,
        max_input_tokens,
        max_body_bytes: args.max_body_bytes,
        max_length_ratio: args.max_length_ratio,
        max_length_offset: args.max_length_offset,
        max_target_tokens: manifest.limits.max_target_tokens,
    };
    let special = SpecialIds {
        bos: manifest.bos_id,
        eos: manifest.eos_id,
    };
    let (translator, _worker) = Translator::spawn(backend, special, args.queue_capacity)
        .context("starting the model worker thread")?;
    tracing::info!(
        model = %manifest.name,
        preset = %manifest.config.preset,
        source_language = %manifest.source_language,
        target_language = %manifest.target_language,
        dir = %package.dir.display(),
        execution_provider = "CPU",
        "model loaded"
    );
    Ok(AppState::new(
        manifest.name.clone(),
        manifest.eos_id,
        TextCodec::new(package.tokenizer),
        translator,
        limits,
    ))
}

/// Loads the model, binds, prints `listening on http://ADDR` on stdout and serves until
/// Ctrl-C or SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let load_args = args.clone();
    let state = tokio::task::spawn_blocking(move || load(&load_args))
        .await
        .context("model loading thread")??;
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let addr: SocketAddr = listener.local_addr()?;
    tracing::info!(%addr, "listening");
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on http://{addr}")?;
        stdout.flush()?;
    }
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("serving HTTP")?;
    tracing::info!("shut down");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutdown signal received; finishing in-flight requests");
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
        assert!(Args::try_parse_from(["nmt-server", "--log-format", "xml"]).is_err());
    }
}
