//! The Kubernetes manifests in deploy/kubernetes agree with the server and the image they
//! deploy: the probes ask routes the server answers (readiness = warmed models, liveness =
//! the process), the ports are the server's defaults, Prometheus is told the port /metrics is
//! on, the pod runs as the image's non-root user, the grace period outlasts the server's
//! shutdown grace, so SIGTERM drains rather than SIGKILL cutting requests, and every
//! environment variable set is one the server reads.

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
