//! The engine carries no transport: no web framework, RPC stack, API-document generator or
//! metrics registry among its dependencies, however deep. Those are the server's; the
//! offline tools that link the engine do not pay for them.

use std::process::Command;

const TRANSPORT_CRATES: [&str; 6] = ["axum", "hyper", "tonic", "tower", "utoipa", "prometheus"];

#[test]
fn the_engine_links_no_transport() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Every feature on: `clap` and `testing` must not bring a transport in either.
    let output = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--package",
            "nmt-engine",
            "--all-features",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8(output.stdout).unwrap();
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"ort"),
        "the tree lists the engine's dependencies: {tree}"
    );
    let found: Vec<&&str> = crates
        .iter()
        .filter(|name| {
            TRANSPORT_CRATES
                .iter()
                .any(|t| *name == t || name.starts_with(&format!("{t}-")))
        })
        .collect();
    assert!(found.is_empty(), "nmt-engine depends on {found:?}");
}
