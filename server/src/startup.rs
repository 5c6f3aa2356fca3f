//! Start-up and serving: the model packages loaded into the service, and the HTTP and gRPC
//! servers run in front of it until a shutdown signal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

use crate::cli::{Args, LogFormat};
use crate::metrics::Metrics;
use crate::scheduler::{SchedulerConfig, Translator};
use crate::service::{Infer, Model, RequestLimits};
use crate::transport::connections::{self, ConnectionGate};
use crate::transport::grpc;
use crate::transport::http::app_with_body_timeout;
use nmt_engine::decode::SpecialIds;
use nmt_engine::length::LengthModel;
use nmt_engine::limits::model_input_limit;
use nmt_engine::memory::{MemoryBound, ServingShape};
use nmt_engine::onnx::{self, OrtBackend, SessionOptions};
use nmt_engine::package::{ModelPackage, TextCodec};
use nmt_engine::pipeline::Pipeline;

/// Logs to stderr, with the spans (request id, and queue/encode/decode timings when they
/// close) on every line.
pub fn init_tracing(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,ort=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Otherwise a log line that cannot be written (stderr's reader gone) is reported with
        // `eprintln!`, which panics the task that logged: the signal task among them, and a
        // SIGTERM would then never shut the server down.
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

/// Loads ONNX Runtime and every model package and starts one model worker per package. The
/// service is not ready until [`Infer::warm_up`]. Blocking (reads and optimises the graphs).
pub fn load(args: &Args) -> anyhow::Result<Infer> {
    let env = onnx::environment(args.ort_dylib_path.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let limits = args.request_limits()?;
    let request_timeout = limits.request_timeout;
    let max_queue_wait = args.max_queue_wait()?;
    if max_queue_wait >= request_timeout {
        tracing::warn!(
            max_queue_wait = max_queue_wait.as_secs_f64(),
            request_timeout = request_timeout.as_secs_f64(),
            "--max-queue-wait is not below --request-timeout: accepted requests may time out"
        );
    }
    let mut models: Vec<Model> = Vec::new();
    for dir in &args.model_dir {
        let model = load_model(&env, dir, args, &limits, &metrics)?;
        if models.iter().any(|m| m.name() == model.name()) {
            anyhow::bail!(
                "two model packages are named `{}` (the second in {}); names must be unique",
                model.name(),
                dir.display()
            );
        }
        models.push(model);
    }
    let default = match &args.default_model {
        Some(name) => name.clone(),
        None => models
            .first()
            .map(|m| m.name().to_string())
            .context("no --model-dir given")?,
    };
    Infer::new(models, &default, limits, metrics)
}

/// One package: checked, its sessions opened, its worker thread started.
fn load_model(
    env: &ort::environment::Environment,
    dir: &std::path::Path,
    args: &Args,
    limits: &RequestLimits,
    metrics: &Metrics,
) -> anyhow::Result<Model> {
    let package = ModelPackage::load(dir)?;
    let manifest = &package.manifest;
    let scheduler = SchedulerConfig {
        batching: args.batching,
        max_batch_size: args.max_batch_size.rows(manifest.precision),
        max_batch_tokens: args.max_batch_tokens.max(1),
        max_queued_requests: args.max_queued_requests.max(1),
        max_queue_wait: args.max_queue_wait()?,
        request_timeout: limits.request_timeout,
    };
    let options = SessionOptions {
        intra_op_threads: args.intra_op_threads,
        device: args.device,
    };
    let backends = OrtBackend::load_workers(
        env,
        &package.dir,
        manifest,
        &options,
        usize::from(args.model_workers),
    )?;
    let length = LengthModel::load(env, &package.dir, manifest, &options)?;
    let execution_provider = backends[0].execution_provider();
    let special = SpecialIds {
        bos: manifest.bos_id,
        eos: manifest.eos_id,
    };
    let (translator, _workers) = Translator::spawn_workers(
        backends,
        special,
        scheduler.clone(),
        metrics.worker(&manifest.name),
    )
    .context("starting the model worker threads")?;
    tracing::info!(
        model = %manifest.name,
        preset = %manifest.config.preset,
        source_language = %manifest.source_language,
        target_language = %manifest.target_language,
        dir = %package.dir.display(),
        execution_provider,
        model_workers = args.model_workers,
        length_aware = length.length_aware,
        length_predictor = length.predictor.is_some(),
        precision = ?manifest.precision,
        batching = ?scheduler.batching,
        max_batch_size = scheduler.max_batch_size,
        max_queue_wait = scheduler.max_queue_wait.as_secs_f64(),
        "model loaded"
    );
    if manifest.precision == model_package::Precision::Int8 && execution_provider == "CUDA" {
        // Measured on an H100 (docs/benchmarks/cuda.md, session 33, the GPU to itself):
        // nmt-eval over the test books at 67 sentences/s for the int8 package against 101 for
        // its float32 twin, and 329 of 461 translations the CPU's int8 kernel would give.
        tracing::warn!(
            model = %manifest.name,
            "an int8 package on CUDA runs slower than its float32 twin there (its products run \
             as ONNX Runtime's generic integer nodes), and some of its translations differ from \
             the same package's on a CPU: int8 packages are made for CPUs; serve the float32 package on a GPU"
        );
    }
    let bound = MemoryBound::new(
        manifest,
        ServingShape {
            max_input_tokens: limits.max_input_tokens,
            max_output_tokens: limits.max_output_tokens,
            max_batch_size: scheduler.max_batch_size,
            workers: usize::from(args.model_workers),
        },
    );
    let mib = |bytes: u64| bytes >> 20;
    tracing::info!(
        model = %manifest.name,
        above_idle_mib = mib(bound.above_idle()),
        encoder_run_mib = mib(bound.encoder_run),
        caches_mib = mib(bound.caches),
        predictor_run_mib = mib(bound.predictor_run),
        "memory bound: serving adds at most this to the idle process (docs/serving.md, \"Memory\")"
    );
    Ok(Model {
        pipeline: Pipeline {
            name: manifest.name.clone(),
            codec: TextCodec::new(package.tokenizer)
                .with_target(package.target_tokenizer)
                .with_masking(!args.decoding.no_placeholder_masking),
            eos_id: manifest.eos_id,
            length,
            max_source_tokens: model_input_limit(manifest),
            max_target_tokens: manifest.limits.max_target_tokens,
            limits: limits.clone(),
        },
        config: manifest.config.clone(),
        source_language: manifest.source_language.clone(),
        target_language: manifest.target_language.clone(),
        translator,
        precision: manifest.precision,
        domains: manifest.domains.clone(),
        origin: manifest.origin(),
    })
}

/// Loads the model, binds, prints `listening on http://ADDR` then `grpc listening on ADDR`
/// on stdout, warms up (the server answers `/health` meanwhile and `/ready` once done) and
/// serves HTTP and gRPC until Ctrl-C or SIGTERM. Then both stop accepting connections, close
/// the ones without a request in flight (a request whose body is still arriving is not in
/// flight), let in-flight requests finish within `--shutdown-grace` seconds, and it returns
/// at the latest [`LINGER_AFTER_LAST_ANSWER`] after the last answer; an error if the grace ran
/// out first (the requests still in flight are dropped, and the log says how many).
pub async fn run(args: Args) -> anyhow::Result<()> {
    let grace = args.shutdown_grace()?;
    let timeouts = args.connection_timeouts()?;
    let body_read_timeout = args.body_read_timeout()?;
    let grpc_options = args.grpc_options()?;
    let gate = ConnectionGate::new(connection_cap(&args));
    tracing::info!(
        max_connections = gate.max_connections(),
        header_read_timeout = timeouts.header_read.as_secs_f64(),
        keep_alive_timeout = timeouts.keep_alive.unwrap_or_default().as_secs_f64(),
        body_read_timeout = body_read_timeout.as_secs_f64(),
        "connection limits"
    );
    let load_args = args.clone();
    let infer = tokio::task::spawn_blocking(move || load(&load_args))
        .await
        .context("model loading thread")??;
    let (listener, grpc_listener) = bind(&args).await?;

    let warm = infer.clone();
    tokio::spawn(async move {
        if let Err(e) = warm.warm_up().await {
            tracing::error!("warm-up translation failed; the server stays unready: {e}");
        }
    });

    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    let draining = infer.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        // Load balancers stop sending work as soon as readiness fails.
        draining.set_ready(false);
        on_signal.cancel();
    });

    let app = app_with_body_timeout(infer.clone(), body_read_timeout);
    let http = connections::serve_http(
        listener,
        app,
        gate.clone(),
        timeouts,
        infer.shared_metrics(),
        shutdown.clone(),
    );
    let http = async {
        http.await;
        anyhow::Ok(())
    };
    let in_flight = infer.clone();
    let open = gate.clone();
    let grpc = grpc::serve_with(infer, grpc_listener, grpc_options, gate, shutdown.clone());
    // Both drain on the same signal; `run` returns when both are done (or gRPC failed).
    let server = async { tokio::try_join!(http, grpc).map(|_| ()) };
    until_drained(server, &shutdown, grace, &in_flight, &open).await?;
    tracing::info!("shut down");
    Ok(())
}

/// Runs `server` until it is done, or, once `shutdown` is cancelled, until `grace` has passed
/// or [`LINGER_AFTER_LAST_ANSWER`] since the last translation request in flight was answered,
/// whichever comes first. An error if translation requests were still in flight then.
async fn until_drained(
    server: impl std::future::Future<Output = anyhow::Result<()>>,
    shutdown: &CancellationToken,
    grace: Duration,
    infer: &Infer,
    gate: &ConnectionGate,
) -> anyhow::Result<()> {
    let deadline = async {
        shutdown.cancelled().await;
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            () = async {
                infer.requests_answered().await;
                tokio::time::sleep(LINGER_AFTER_LAST_ANSWER).await;
            } => {}
        }
    };
    tokio::select! {
        served = server => return served,
        () = deadline => {}
    }
    let dropped = infer.requests_in_flight();
    if dropped > 0 {
        tracing::error!(
            grace_seconds = grace.as_secs_f64(),
            dropped,
            "the shutdown grace ran out with {dropped} translation requests in flight; \
             dropping them"
        );
        anyhow::bail!(
            "the shutdown grace of {} s ran out; {dropped} translation requests in flight were \
             dropped",
            grace.as_secs_f64()
        );
    }
    tracing::warn!(
        open_connections = gate.open_connections(),
        "no translation request in flight; closing the connections still open"
    );
    Ok(())
}

/// Once shutting down, how long connections may stay open after the last translation request
/// in flight is answered: enough to write that answer. What still holds a connection then is
/// no request of the API's (a client that stopped reading, a gRPC stream whose message never
/// came), and the exit waits for it no longer.
const LINGER_AFTER_LAST_ANSWER: Duration = Duration::from_secs(1);

/// Binds the HTTP and gRPC listeners and prints their addresses on stdout.
async fn bind(args: &Args) -> anyhow::Result<(TcpListener, TcpListener)> {
    use std::io::Write;
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let addr: SocketAddr = listener.local_addr()?;
    let grpc_listener = TcpListener::bind((args.host.as_str(), args.grpc_port))
        .await
        .with_context(|| format!("binding {}:{} for gRPC", args.host, args.grpc_port))?;
    let grpc_addr: SocketAddr = grpc_listener.local_addr()?;
    tracing::info!(%addr, %grpc_addr, "listening");
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}")?;
    writeln!(stdout, "grpc listening on {grpc_addr}")?;
    stdout.flush()?;
    Ok((listener, grpc_listener))
}

/// Raises the soft open-file limit to the hard one (the limit a service manager hands a
/// process is often 1024 soft), and returns `--max-connections`, or its default under the
/// limit.
fn connection_cap(args: &Args) -> usize {
    let soft = match connections::raise_open_file_limit() {
        Ok(files) => {
            tracing::info!(
                soft_before = files.soft_before,
                soft = files.soft,
                hard = files.hard,
                "open-file limit"
            );
            files.soft
        }
        Err(e) => {
            tracing::warn!("cannot read or raise the open-file limit: {e}");
            1024
        }
    };
    let max = args
        .max_connections
        .unwrap_or_else(|| connections::default_max_connections(soft));
    if max as u64 + connections::RESERVED_FILE_DESCRIPTORS > soft {
        tracing::warn!(
            max_connections = max,
            open_file_limit = soft,
            "--max-connections leaves fewer than {} descriptors under the open-file limit: \
             accepting may fail for lack of descriptors (it backs off and recovers)",
            connections::RESERVED_FILE_DESCRIPTORS
        );
    }
    max
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
