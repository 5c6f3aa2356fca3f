//! Prometheus metrics, named by Prometheus conventions: one `nmt_` prefix, base units,
//! `_total` counters, and bounded labels. The headline dashboard is latency by input
//! length, so every latency histogram carries an `input_length` label whose values are the
//! fixed buckets of [`input_length_bucket`], never the raw length.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

// The buckets are the engine's, so that nmt-eval reports by the same ones as the dashboards.
pub use nmt_engine::limits::{input_length_bucket, INPUT_LENGTH_BUCKETS};

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TOKEN_LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
const LENGTH_BUCKETS: &[f64] = &[1.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
const DEVIATION_BUCKETS: &[f64] = &[
    -32.0, -16.0, -8.0, -4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0,
];

/// Every metric the server exports, in its own registry (so tests can run several servers
/// in one process).
pub struct Metrics {
    registry: Registry,
    pub request_duration: HistogramVec,
    pub queue_duration: HistogramVec,
    pub inference_duration: HistogramVec,
    pub time_per_output_token: HistogramVec,
    pub input_length: HistogramVec,
    pub output_length: HistogramVec,
    pub batch_size: HistogramVec,
    pub encoder_run_texts: HistogramVec,
    pub queue_depth: IntGaugeVec,
    pub sequences_in_flight: IntGaugeVec,
    pub expected_queue_wait: GaugeVec,
    /// Cost units per busy second: the speed admission assumes.
    pub throughput: GaugeVec,
    /// Tokens per busy second.
    pub token_throughput: GaugeVec,
    pub admission_lateness: GaugeVec,
    pub length_deviation: HistogramVec,
    pub errors: IntCounterVec,
    /// Requests by route: the router's path templates, so the label's values are bounded by
    /// the routes.
    pub http_requests: IntCounterVec,
    /// Characters of the texts translated through the DeepL-compatible `POST /v2/translate`:
    /// what `GET /v2/usage` reports.
    pub deepl_characters: IntCounter,
}

/// A path that no route matched, as the `endpoint` label counts it.
pub const UNMATCHED_ENDPOINT: &str = "unmatched";

/// One model's handles of the metrics its worker threads keep.
#[derive(Clone)]
pub struct WorkerMetrics {
    pub batch_size: Histogram,
    pub encoder_run_texts: Histogram,
    pub queue_depth: IntGauge,
    pub sequences_in_flight: IntGauge,
    pub expected_queue_wait: Gauge,
    pub throughput: Gauge,
    pub token_throughput: Gauge,
    pub admission_lateness: Gauge,
}

/// `metric`, registered in `registry`.
fn registered<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    registered(
        registry,
        HistogramVec::new(opts, labels).expect("valid histogram"),
    )
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    registered(registry, metric)
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    registered(registry, metric)
}

fn float_gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let metric = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    registered(registry, metric)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let by_length = &["model", "input_length"];
        Metrics {
            request_duration: histogram(
                &r,
                "nmt_request_duration_seconds",
                "Time from a valid request's arrival to its translations, labelled by its longest text (refusals and timeouts are counted in nmt_errors_total instead).",
                LATENCY_BUCKETS,
                by_length,
            ),
            queue_duration: histogram(
                &r,
                "nmt_queue_duration_seconds",
                "Time a request waited for the model before its first text joined the running batch.",
                LATENCY_BUCKETS,
                by_length,
            ),
            inference_duration: histogram(
                &r,
                "nmt_inference_duration_seconds",
                "Time from a request's first text joining the batch to its last text being decoded.",
                LATENCY_BUCKETS,
                by_length,
            ),
            time_per_output_token: histogram(
                &r,
                "nmt_time_per_output_token_seconds",
                "Decoding time of one text divided by its output tokens.",
                TOKEN_LATENCY_BUCKETS,
                by_length,
            ),
            input_length: histogram(
                &r,
                "nmt_input_length_tokens",
                "Subword tokens per input text.",
                LENGTH_BUCKETS,
                &["model"],
            ),
            output_length: histogram(
                &r,
                "nmt_output_length_tokens",
                "Subword tokens per output text.",
                LENGTH_BUCKETS,
                &["model"],
            ),
            batch_size: histogram(
                &r,
                "nmt_batch_size",
                "Rows in the decoder batch at each step (finished rows awaiting compaction included).",
                BATCH_BUCKETS,
                &["model"],
            ),
            encoder_run_texts: histogram(
                &r,
                "nmt_encoder_run_texts",
                "Texts encoded in one run as texts join the batch: those joining, and the waiting texts of like length encoded ahead with them.",
                BATCH_BUCKETS,
                &["model"],
            ),
            queue_depth: gauge(
                &r,
                "nmt_queue_depth",
                "Requests with texts waiting to join the running batch.",
                &["model"],
            ),
            sequences_in_flight: gauge(
                &r,
                "nmt_sequences_in_flight",
                "Texts being decoded in the running batches (every model worker's).",
                &["model"],
            ),
            expected_queue_wait: float_gauge(
                &r,
                "nmt_expected_queue_wait_seconds",
                "Expected time for the model to finish all the work it has accepted (queued \
                 and running) at its measured throughput: the Retry-After of a refused request. \
                 With several model workers, the least loaded one's, where a new request goes.",
                &["model"],
            ),
            throughput: float_gauge(
                &r,
                "nmt_throughput_cost_units_per_second",
                "Cost units (one unit: one row of a decoder step with nothing to attend to; \
                 a step's rows cost more with the sources and outputs they attend to, \
                 an encoding with its tokens and their pairs) per second of the model worker's \
                 busy time, a moving average: the speed admission assumes. With several model \
                 workers, summed over those that have run.",
                &["model"],
            ),
            token_throughput: float_gauge(
                &r,
                "nmt_throughput_tokens_per_second",
                "Tokens (sources encoded and tokens decoded) per second of the model worker's \
                 busy time, a moving average. Admission assumes the cost units' speed \
                 (nmt_throughput_cost_units_per_second) instead: a long text's tokens take \
                 longer than a short one's. With several model workers, summed over those that \
                 have run.",
                &["model"],
            ),
            admission_lateness: float_gauge(
                &r,
                "nmt_admission_lateness",
                "The 98th percentile of accepted requests' time to finish over the door's \
                 estimate, tracked online: every estimate (and the expected queue wait) is \
                 scaled by it. With several model workers, the worst worker's.",
                &["model"],
            ),
            length_deviation: histogram(
                &r,
                "nmt_length_deviation_tokens",
                "Output length minus the requested target length, for texts that asked one.",
                DEVIATION_BUCKETS,
                &["model"],
            ),
            errors: counter(
                &r,
                "nmt_errors_total",
                "Failed requests by error type (the `error_type` of the JSON error body).",
                &["type"],
            ),
            http_requests: counter(
                &r,
                "nmt_http_requests_total",
                "HTTP requests by endpoint: the route's path (`/translate`, \
                 `/libretranslate/translate`, `/v2/translate`, ...), or `unmatched`.",
                &["endpoint"],
            ),
            deepl_characters: registered(
                &r,
                IntCounter::new(
                    "nmt_deepl_characters_total",
                    "Characters of the texts translated through the DeepL-compatible \
                     POST /v2/translate (GET /v2/usage's character_count).",
                )
                .expect("valid counter"),
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }

    /// The worker's metric handles for `model`.
    pub fn worker(&self, model: &str) -> WorkerMetrics {
        WorkerMetrics {
            batch_size: self.batch_size.with_label_values(&[model]),
            encoder_run_texts: self.encoder_run_texts.with_label_values(&[model]),
            queue_depth: self.queue_depth.with_label_values(&[model]),
            sequences_in_flight: self.sequences_in_flight.with_label_values(&[model]),
            expected_queue_wait: self.expected_queue_wait.with_label_values(&[model]),
            throughput: self.throughput.with_label_values(&[model]),
            token_throughput: self.token_throughput.with_label_values(&[model]),
            admission_lateness: self.admission_lateness.with_label_values(&[model]),
        }
    }

    pub fn record_error(&self, error_type: &str) {
        self.errors.with_label_values(&[error_type]).inc();
    }

    /// Counts a request to `endpoint`: a route's path template, or [`UNMATCHED_ENDPOINT`].
    pub fn record_request(&self, endpoint: &str) {
        self.http_requests.with_label_values(&[endpoint]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_length_once() {
        assert_eq!(input_length_bucket(0), "1-16");
        assert_eq!(input_length_bucket(16), "1-16");
        assert_eq!(input_length_bucket(17), "17-32");
        assert_eq!(input_length_bucket(128), "65-128");
        assert_eq!(input_length_bucket(129), "129-256");
        assert_eq!(input_length_bucket(257), "257-512");
        assert_eq!(input_length_bucket(513), "513+");
        assert_eq!(input_length_bucket(usize::MAX), "513+");
    }

    #[test]
    fn renders_the_text_format() {
        let metrics = Metrics::new();
        metrics
            .request_duration
            .with_label_values(&["m", "1-16"])
            .observe(0.02);
        metrics.record_error("overloaded");
        let text = metrics.render();
        assert!(
            text.contains("# TYPE nmt_request_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(
                "nmt_request_duration_seconds_bucket{input_length=\"1-16\",model=\"m\",le=\"0.025\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("nmt_errors_total{type=\"overloaded\"} 1"),
            "{text}"
        );
    }
}
