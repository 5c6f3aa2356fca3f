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
    // Exact mode hits every target unless max_chars made it cut an output (a cut output
    // counts the subwords it kept, as the server reports them).
    let cut = control["truncated"].as_u64().unwrap();
    assert!(
        f64_at(control, "/exact_share") >= (6 - cut) as f64 / 6.0 - 1e-9,
        "{control}"
    );
    assert_eq!(report["systems"][0]["concat"], serde_json::json!([]));
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("`max_chars` 60, `length_mode` exact"), "{md}");
}

#[test]
fn bucket_edges_split_the_scores_and_the_paired_bootstrap_runs_per_bucket() {
    let out = tempfile::tempdir().unwrap();
    let package = package();
    let p = package.to_str().unwrap();
    let args = [
        "--package",
        p,
        "--package",
        p,
        "--baseline",
        p,
        "--limit",
        "12",
        "--bucket-edges",
        "32",
        "--bootstrap-samples",
        "200",
    ];
    let report = eval(out.path(), &args, &[]);
    assert_eq!(report["decoding"]["bucket_edges"], serde_json::json!([32]));
    let systems = report["systems"].as_array().unwrap();
    let baseline = systems.last().unwrap()["label"].clone();
    assert_eq!(report["paired_bootstrap"]["baseline"], baseline);
    for system in systems {
        let buckets = system["by_source_length"].as_array().unwrap();
        let labels: Vec<&str> = buckets
            .iter()
            .map(|b| b["bucket"].as_str().unwrap())
            .collect();
        // Daniel 1:1-12 has verses on both sides of 32 subwords.
        assert_eq!(labels, ["1-32", "33+"], "{buckets:?}");
        assert!(f64_at(&buckets[0], "/mean_source_subwords") <= 32.0);
        assert!(f64_at(&buckets[1], "/mean_source_subwords") > 32.0);
        let total: u64 = buckets
            .iter()
            .map(|b| b["sentences"].as_u64().unwrap())
            .sum();
        assert_eq!(total, 12);
    }
    // One row per bucket and non-baseline system, each with sacrebleu's p-values; the same
    // package on both sides, so no difference.
    let buckets = &systems[0]["by_source_length"];
    let by_bucket = report["paired_bootstrap"]["by_bucket"].as_array().unwrap();
    let rows: Vec<(&str, &str)> = by_bucket
        .iter()
        .map(|r| (r["bucket"].as_str().unwrap(), r["system"].as_str().unwrap()))
        .collect();
    let (a, b) = ("en-es-rel-ldpe", "en-es-rel-ldpe-2");
    assert_eq!(rows, [("1-32", a), ("1-32", b), ("33+", a), ("33+", b)]);
    for (k, row) in by_bucket.iter().enumerate() {
        assert_eq!(row["sentences"], buckets[k / 2]["sentences"], "{row}");
        // The paired bootstrap's scores come unrounded (sacrebleu's `-w 2` rounds the others).
        let single = f64_at(&buckets[k / 2], "/bleu/score");
        assert!((f64_at(row, "/bleu") - single).abs() <= 0.005, "{row}");
        for metric in ["bleu", "chrf"] {
            let p = f64_at(row, &format!("/{metric}_p"));
            assert!(p > 0.0 && p <= 1.0, "{row}");
            assert_eq!(row[format!("{metric}_delta")], 0.0, "{row}");
            assert_eq!(row[format!("{metric}_significant")], false, "{row}");
        }
    }
    // The long-input set's group sizes get the same comparison: 6 pairs, 3 quadruples, 1 octet.
    let by_n_verses = report["paired_bootstrap"]["by_n_verses"]
        .as_array()
        .unwrap();
    let groups: Vec<(u64, u64)> = by_n_verses
        .iter()
        .map(|r| {
            (
                r["n_verses"].as_u64().unwrap(),
                r["sentences"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(groups, [(2, 6), (2, 6), (4, 3), (4, 3), (8, 1), (8, 1)]);
    assert!(by_n_verses.iter().all(|r| r["bleu_p"].is_f64()));
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("## en-es-rel-ldpe: by source length (subwords, bucket edges 32)"));
    assert!(md.contains("| 33+ | 8 | en-es-rel-ldpe-2 | "), "{md}");
}

#[test]
fn saved_translations_score_again_without_the_package() {
    let first = tempfile::tempdir().unwrap();
    let package = package();
    let p = package.to_str().unwrap();
    let decoded = eval(first.path(), &["--package", p, "--limit", "8"], &[]);
    let saved = first.path().join("en-es-rel-ldpe/decoded.json");
    let s = saved.to_str().unwrap();

    // Scored again from the file, with other buckets: the same translations and scores.
    let again = tempfile::tempdir().unwrap();
    let args = ["--package", s, "--limit", "8", "--bucket-edges", "32"];
    let rescored = eval(again.path(), &args, &[]);
    let (a, b) = (&decoded["systems"][0], &rescored["systems"][0]);
    assert_eq!(a["overall"], b["overall"]);
    assert_eq!(a["concat"], b["concat"]);
    let hyp = |dir: &Path| std::fs::read_to_string(dir.join("en-es-rel-ldpe/test.hyp")).unwrap();
    assert_eq!(hyp(first.path()), hyp(again.path()));
    let labels: Vec<&str> = b["by_source_length"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bucket"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["1-32", "33+"]);
    // Without its long-input groups too.
    let third = tempfile::tempdir().unwrap();
    let short = eval(
        third.path(),
        &["--package", s, "--limit", "8", "--no-concat"],
        &[],
    );
    assert_eq!(short["systems"][0]["overall"], a["overall"]);

    // Another set, or other length flags, would compare unlike things: refused.
    for other in [
        &["--limit", "6"][..],
        &["--limit", "8", "--target-length", "source"][..],
    ] {
        let out = tempfile::tempdir().unwrap();
        let status = Command::new(env!("CARGO_BIN_EXE_nmt-eval"))
            .arg("--corpus")
            .arg(fixture())
            .arg("--out")
            .arg(out.path())
            .args(["--package", s])
            .args(other)
            .output()
            .unwrap();
        assert!(!status.status.success(), "{other:?}");
        let stderr = String::from_utf8_lossy(&status.stderr);
        assert!(stderr.contains("was decoded otherwise"), "{stderr}");
    }
}
