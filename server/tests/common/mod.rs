//! What the tests against a real model package share: where the package is, and one service
//! per test binary.

use std::path::PathBuf;
use std::sync::OnceLock;

use nmt_server::{Args, Infer};

/// The package that ships with the repo (`models/en-es-rel-ldpe`), or the directory in
/// `NMT_TEST_PACKAGE` (any export of `nmt-export`).
pub fn package_dir() -> PathBuf {
    match std::env::var_os("NMT_TEST_PACKAGE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/en-es-rel-ldpe"),
    }
}

/// One service for the whole test binary (one model worker, one ONNX environment). The
/// warm-up is the end-to-end tests' business; here it is marked ready at once.
pub fn state() -> Infer {
    static STATE: OnceLock<Infer> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let infer = nmt_server::load(&Args::for_model(package_dir()))
                .unwrap_or_else(|e| panic!("starting the server state: {e:#}"));
            infer.set_ready(true);
            infer
        })
        .clone()
}
