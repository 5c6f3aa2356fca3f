//! The Kubernetes manifests in deploy/kubernetes agree with the server and the image they
//! deploy: the probes ask routes the server answers (readiness = warmed models, liveness =
//! the process), the ports are the server's defaults, Prometheus is told the port /metrics is
//! on, the pod runs as the image's non-root user, the grace period outlasts the server's
//! shutdown grace, so SIGTERM drains rather than SIGKILL cutting requests, every
//! environment variable set is one the server reads, and the memory limit holds the server
//! at its worst (docs/serving.md, "Memory").

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{binary, server_default};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml(name: &str) -> Value {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes").join(name)).unwrap();
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn port_named<'a>(ports: &'a Value, name: &str) -> &'a Value {
    ports
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no port {name}"))
}

#[test]
fn deployment_and_service_match_the_server_and_the_image() {
    let deployment = yaml("deployment.yaml");
    assert_eq!(deployment["kind"], "Deployment");
    let pod = &deployment["spec"]["template"];
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        pod["metadata"]["labels"]
    );
    let container = &pod["spec"]["containers"][0];
    let ports = &container["ports"];
    let http: u64 = server_default("port").parse().unwrap();
    let grpc: u64 = server_default("grpc-port").parse().unwrap();
    assert_eq!(port_named(ports, "http")["containerPort"], http);
    assert_eq!(port_named(ports, "grpc")["containerPort"], grpc);

    // Probes: startup and readiness on /ready, liveness on /health, all on the HTTP port.
    for (probe, path) in [
        ("startupProbe", "/ready"),
        ("readinessProbe", "/ready"),
        ("livenessProbe", "/health"),
    ] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
    }
    let printed = Command::new(binary("nmt-server"))
        .arg("--print-openapi")
        .output()
        .unwrap();
    assert!(printed.status.success(), "nmt-server --print-openapi");
    let openapi: Value = serde_json::from_slice(&printed.stdout).unwrap();
    for path in ["/ready", "/health", "/metrics"] {
        assert!(
            openapi["paths"][path].is_object(),
            "the server serves {path}"
        );
    }

    // The value the pod sets for an environment variable, if it sets one.
    let env = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    // The grace period outlasts the server's own, as set in the pod or by default.
    let grace: f64 = env("NMT_SHUTDOWN_GRACE")
        .unwrap_or_else(|| server_default("shutdown-grace"))
        .parse()
        .unwrap();
    let termination = pod["spec"]["terminationGracePeriodSeconds"]
        .as_f64()
        .unwrap();
    assert!(
        termination > grace,
        "{termination} s <= the server's {grace} s"
    );

    // Every variable the pod sets is one the server reads (a typo would be ignored silently),
    // and model workers never outnumber the cores of the CPU limit.
    let help = Command::new(binary("nmt-server"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for variable in container["env"].as_array().unwrap() {
        let name = variable["name"].as_str().unwrap();
        assert!(
            help.contains(&format!("[env: {name}=")),
            "nmt-server reads no {name}"
        );
    }
    let setting = |name: &str| env(name).map_or(1, |v| v.parse::<u64>().unwrap());
    let cores: u64 = container["resources"]["limits"]["cpu"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(setting("NMT_MODEL_WORKERS") * setting("NMT_INTRA_OP_THREADS") <= cores);

    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], http.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");

    // The image's user, from the Dockerfile.
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let uid = pod["spec"]["securityContext"]["runAsUser"]
        .as_u64()
        .unwrap();
    assert!(dockerfile.contains(&format!("useradd --system --uid {uid} ")));
    assert!(container["resources"]["limits"]["memory"].is_string());

    let service = yaml("service.yaml");
    assert_eq!(service["kind"], "Service");
    assert_eq!(service["spec"]["selector"], pod["metadata"]["labels"]);
    for name in ["http", "grpc"] {
        let port = port_named(&service["spec"]["ports"], name);
        assert_eq!(port["targetPort"], name);
        assert_eq!(port["port"], port_named(ports, name)["containerPort"]);
    }
}

/// Kubernetes quantities as bytes: `2Gi`, `512Mi`, `1G`, plain bytes.
fn quantity_bytes(quantity: &str) -> u64 {
    let units: [(&str, u64); 6] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, scale) in units {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return number.parse::<u64>().unwrap() * scale;
        }
    }
    quantity.parse().unwrap()
}

/// The pod's memory limit holds the server at its worst: idle as measured here (the shipped
/// package, started with the pod's environment) plus the bound of docs/serving.md, "Memory"
/// (every worker's encoder run and full batch of caches, one predictor run) at the pod's
/// flags; and the pod's request holds the idle server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_limit_covers_the_worst_case_at_the_pods_flags() {
    use nmt_engine::memory::{MemoryBound, ServingShape};

    let deployment = yaml("deployment.yaml");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env: Vec<(String, String)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let value = v["value"].as_str().unwrap().to_string();
            (v["name"].as_str().unwrap().to_string(), value)
        })
        .collect();
    let setting = |name: &str, flag: &str| -> String {
        let value = env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        value.unwrap_or_else(|| server_default(flag))
    };
    let number = |name: &str, flag: &str| -> usize { setting(name, flag).parse().unwrap() };
    let package = common::shipped_package();
    let manifest = model_package::Manifest::load(&package).unwrap();
    let batch_rows: nmt_engine::limits::BatchRows = setting("NMT_MAX_BATCH_SIZE", "max-batch-size")
        .parse()
        .unwrap();
    let shape = ServingShape {
        max_input_tokens: number("NMT_MAX_INPUT_TOKENS", "max-input-tokens"),
        max_output_tokens: number("NMT_MAX_OUTPUT_TOKENS", "max-output-tokens"),
        max_batch_size: batch_rows.rows(manifest.precision),
        workers: number("NMT_MODEL_WORKERS", "model-workers"),
    };
    let bound = MemoryBound::new(&manifest, shape);

    let env_refs: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let server = common::start_server_with_env(&[&package], &[], &env_refs);
    let client = reqwest::Client::new();
    common::wait_until_ready(&client, &server).await;
    let warm = serde_json::json!({"text": "Good morning."});
    assert_eq!(
        common::post_translate(&client, &server, &warm)
            .await
            .status(),
        200
    );
    let idle = (server.rss_mib().unwrap() * (1u64 << 20) as f64) as u64;

    let resources = &container["resources"];
    let limit = quantity_bytes(resources["limits"]["memory"].as_str().unwrap());
    let request = quantity_bytes(resources["requests"]["memory"].as_str().unwrap());
    let mib = |b: u64| b >> 20;
    eprintln!(
        "idle {} MiB + bound {} MiB ({shape:?}: encoder run {} MiB, caches {} MiB per worker, \
         predictor {} MiB) against a limit of {} MiB",
        mib(idle),
        mib(bound.above_idle()),
        mib(bound.encoder_run),
        mib(bound.caches),
        mib(bound.predictor_run),
        mib(limit)
    );
    assert!(
        idle + bound.above_idle() <= limit,
        "the pod's memory limit ({} MiB) is below idle ({} MiB) plus the bound ({} MiB)",
        mib(limit),
        mib(idle),
        mib(bound.above_idle())
    );
    assert!(
        request >= idle,
        "the pod requests less memory than the idle server holds"
    );
}

#[test]
fn kubernetes_quantities() {
    assert_eq!(quantity_bytes("2Gi"), 2 << 30);
    assert_eq!(quantity_bytes("512Mi"), 512 << 20);
    assert_eq!(quantity_bytes("1G"), 1_000_000_000);
    assert_eq!(quantity_bytes("4096"), 4096);
}
