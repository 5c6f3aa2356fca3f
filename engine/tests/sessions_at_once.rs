//! Packages opened on several threads at once in a fresh process: ONNX Runtime registers the
//! fused operators' domain with ONNX's process-wide table as the first session holding it is
//! created, unguarded, and two first sessions at once used to fail the second ("the domain is
//! already exist"); `fused::commit_session` creates them one at a time until one has
//! succeeded. This file is its own test binary, so its process is fresh. The race's window is
//! narrow (this test seldom lost it without the guard); the guard's ordering is unit-tested in
//! `fused.rs`, this checks that real loads at once go through it.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};

use nmt_engine::onnx::{environment, OrtBackend, SessionOptions};
use nmt_engine::package::ModelPackage;

#[test]
fn sessions_created_at_once_all_open() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/en-es-l10n");
    let package = Arc::new(ModelPackage::load(&dir).unwrap_or_else(|e| panic!("{e:#}")));
    let env = Arc::new(environment(None).unwrap_or_else(|e| panic!("{e:#}")));
    let threads = 6;
    let start = Arc::new(Barrier::new(threads));
    let opened: Vec<_> = (0..threads)
        .map(|_| {
            let (package, env, start) = (package.clone(), env.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                OrtBackend::load(
                    &env,
                    &package.dir,
                    &package.manifest,
                    &SessionOptions::default(),
                )
                .map(|backend| backend.execution_provider())
                .map_err(|e| format!("{e:#}"))
            })
        })
        .collect();
    for thread in opened {
        let opened = thread.join().expect("no panic");
        assert!(opened.is_ok(), "{opened:?}");
    }
}
