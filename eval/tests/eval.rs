//! The real `nmt-eval` binary on the shipped package (`models/en-es-rel-ldpe`, or the
//! directory in `NMT_TEST_PACKAGE`) over the first 20 test verses (Daniel 1:1-20) and the
//! long-input groups built from them (`tests/fixtures/corpus`, copied from
//! `nmt-train corpus` output). Needs ONNX Runtime (`source scripts/env.sh`) and python3 with
//! sacrebleu 2.6.0 (`scripts/setup.sh`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn package() -> PathBuf {
    std::env::var_os("NMT_TEST_PACKAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/en-es-rel-ldpe"))
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus")
}

/// Runs nmt-eval with `args` (and `env`), writing to `out`; returns report.json.
fn eval(out: &Path, args: &[&str], env: &[(&str, &str)]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_nmt-eval"))
        .arg("--corpus")
        .arg(fixture())
        .arg("--out")
        .arg(out)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running nmt-eval");
    assert!(
        output.status.success(),
        "nmt-eval failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let json = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    serde_json::from_str(&json).expect("valid JSON")
}

/// BLEU as `python3 -m sacrebleu REF -i HYP -m bleu -b -w 2` prints it.
fn sacrebleu_cli_bleu(reference: &str, hypotheses: &str) -> f64 {
    let output = Command::new("python3")
        .args(["-m", "sacrebleu", reference, "-i", hypotheses])
        .args(["-m", "bleu", "-b", "-w", "2"])
        .output()
        .expect("running python3 -m sacrebleu");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

fn f64_at(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{pointer} in {v}"))
}

#[test]
fn scores_are_sacrebleus_and_a_package_does_not_differ_from_itself() {
    let out = tempfile::tempdir().unwrap();
    let package = package();
    let p = package.to_str().unwrap();
    let report = eval(
        out.path(),
        &[
            "--package",
            p,
            "--baseline",
            p,
            "--limit",
            "20",
            "--no-concat",
        ],
        &[],
    );
    assert_eq!(report["set"]["sentences"], 20);
    let reference = report["set"]["reference_file"].as_str().unwrap();
    let systems = report["systems"].as_array().unwrap();
    assert_eq!(systems.len(), 2);
    for system in systems {
        let hypotheses = system["hypotheses"].as_str().unwrap();
        let bleu = f64_at(system, "/overall/bleu/score");
        assert!(bleu > 1.0, "BLEU {bleu}: the model translates");
        assert_eq!(bleu, sacrebleu_cli_bleu(reference, hypotheses));
        assert!(f64_at(system, "/overall/bleu/ci") > 0.0);
        assert_eq!(system["overall"]["sentences"], 20);
        let buckets = system["by_source_length"].as_array().unwrap();
        let total: u64 = buckets
            .iter()
            .map(|b| b["sentences"].as_u64().unwrap())
            .sum();
        assert_eq!(total, 20, "{buckets:?}");
    }
    // The same package twice: the same outputs, and no significant difference.
    let paired = &report["paired_bootstrap"]["systems"][1];
    for metric in ["bleu", "chrf", "ter"] {
        assert_eq!(paired[metric]["delta"], 0.0, "{paired}");
        assert_eq!(paired[metric]["significant"], false, "{paired}");
    }
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("| en-es-rel-ldpe-2 |"), "{md}");
    for png in ["bleu_by_length.png", "length_ratio_by_length.png"] {
        let bytes = std::fs::read(out.path().join(png)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{png}");
    }
}

#[test]
fn long_inputs_are_compared_with_their_verses_one_by_one() {
    let out = tempfile::tempdir().unwrap();
    let package = package();
    let report = eval(
        out.path(),
        &["--package", package.to_str().unwrap(), "--limit", "8"],
        &[("NMT_MAX_INPUT_TOKENS", "200")],
    );
    // The first 8 verses: 4 pairs, 2 quadruples and 1 octet.
    let concat = report["systems"][0]["concat"].as_array().unwrap();
    let sizes: Vec<(u64, u64)> = concat
        .iter()
        .map(|c| {
            let n = c["n_verses"].as_u64().unwrap();
            (n, c["concat"]["sentences"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(sizes, [(2, 4), (4, 2), (8, 1)]);
    for c in concat {
        assert_eq!(c["one_by_one"]["refused"], 0, "{c}");
        assert!(f64_at(c, "/one_by_one/bleu/score") > 1.0, "{c}");
        let delta = f64_at(c, "/concat/bleu/score") - f64_at(c, "/one_by_one/bleu/score");
        assert!((f64_at(c, "/bleu_delta") - delta).abs() < 1e-9, "{c}");
    }
    // About 350 subwords: over the server's --max-input-tokens (200 here, from its
    // environment variable), refused as the server does.
    let octet = &concat[2]["concat"];
    assert_eq!(octet["refused"], 1, "{octet}");
    let hypotheses = std::fs::read_to_string(out.path().join("en-es-rel-ldpe/concat-8.hyp"));
    assert_eq!(hypotheses.unwrap(), "\n");
}

#[test]
fn outputs_that_reach_the_servers_budget_are_counted() {
    // The server's own limit, set the way an operator sets it: every output stops at 3.
    let out = tempfile::tempdir().unwrap();
    let package = package();
    let report = eval(
        out.path(),
        &[
            "--package",
            package.to_str().unwrap(),
            "--limit",
            "4",
            "--no-concat",
        ],
        &[("NMT_MAX_OUTPUT_TOKENS", "3")],
    );
    let overall = &report["systems"][0]["overall"];
    assert_eq!(overall["hit_budget"], 4, "{overall}");
    assert_eq!(overall["hit_budget_share"], 1.0);
    assert!(report["paired_bootstrap"].is_null());
    assert_eq!(report["systems"][0]["concat"], serde_json::json!([]));
    assert_eq!(report["systems"][0]["package"]["max_output_tokens"], 3);
}

#[test]
fn asked_lengths_are_met_and_scored_against_their_targets() {
    // Exact mode: every target is met, by any model, unless max_chars makes it cut.
    let out = tempfile::tempdir().unwrap();
    let package = package();
    let report = eval(
        out.path(),
        &[
            "--package",
            package.to_str().unwrap(),
            "--limit",
            "6",
            "--target-length",
            "reference",
            "--reference-length-scale",
            "0.8",
            "--length-mode",
            "exact",
            "--max-chars",
            "60",
        ],
        &[],
    );
    let control = &report["systems"][0]["overall"]["length_control"];
    assert_eq!(control["sentences"], 6, "{control}");
    assert!(
        control["max_chars_seen"].as_u64().unwrap() <= 60,
        "{control}"
    );
    // Exact mode hits every target unless max_chars made it cut an output.
    let cut = control["truncated"].as_u64().unwrap();
    assert!(
        f64_at(control, "/exact_share") >= 1.0 - cut as f64 / 6.0,
        "{control}"
    );
    assert_eq!(report["systems"][0]["concat"], serde_json::json!([]));
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("`max_chars` 60, `length_mode` exact"), "{md}");
}
