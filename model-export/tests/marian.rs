//! `nmt-export import-marian` held to transformers: a tiny random `MarianMTModel` saved by
//! `save_pretrained` with transformers' own outputs (`tests/fixtures/marian/*/reference.json`,
//! written by `python3 -m nmt_tools.marian.fixture`), imported, and run as the server runs it
//! (ONNX Runtime through the engine's backend, greedy decoding over one running batch, then
//! the engine's whole pipeline from text to text). No torch or transformers is needed here.
//!
//! - greedy token ids identical to `generate(num_beams=1, do_sample=False)` on every input,
//!   under the server's output budget;
//! - teacher-forced logits within 1e-4 of the model's forward pass (banned tokens aside,
//!   which the graph holds at -1e9 as `generate` holds them at -inf);
//! - the converted tokenizers: transformers' `MarianTokenizer` ids of every input, and its
//!   decoding of every output.

use std::path::{Path, PathBuf};

use model_export::marian::{import_marian, ImportMarianArgs, BANNED_LOGIT};
use model_export::quantize::{quantize_package, Int8Options, QuantizeArgs};
use model_package::{Manifest, Precision};
use nmt_engine::backend::Backend;
use nmt_engine::decode::{greedy_decode, DecodeInput, DecodeOutput, SpecialIds};
use nmt_engine::length::LengthRequest;
use nmt_engine::onnx::{Device, OrtBackend, OrtRows, SessionOptions};
use nmt_engine::{Engine, EngineOptions, RequestLimits};
use serde::Deserialize;

const LOGIT_TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct Reference {
    pad_id: u32,
    cases: Vec<Case>,
    teacher_forced: Vec<Forced>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    source_ids: Vec<i64>,
    budget: usize,
    output_ids: Vec<u32>,
    ended_with_eos: bool,
    translation: String,
}

#[derive(Deserialize)]
struct Forced {
    source_ids: Vec<i64>,
    decoder_ids: Vec<i64>,
    logits: Vec<Vec<f32>>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/marian")
        .join(name)
}

fn reference(dir: &Path) -> Reference {
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn import(hf_dir: &Path, out: &Path) -> Manifest {
    import_marian(&ImportMarianArgs {
        hf_dir: hf_dir.to_path_buf(),
        out: out.to_path_buf(),
        name: None,
        source_language: None,
        target_language: None,
        tokenizers: Some(hf_dir.to_path_buf()),
        check_texts: None,
        python: PathBuf::from("python3"),
        domains: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e:#}"))
}

fn backend(package: &Path, manifest: &Manifest) -> OrtBackend {
    let env = nmt_engine::onnx::environment(None).unwrap_or_else(|e| panic!("{e:#}"));
    OrtBackend::load(&env, package, manifest, &SessionOptions::default()).unwrap()
}

/// The largest |ONNX - transformers| over the teacher-forced logits, all rows in one batch.
fn teacher_forced_difference(backend: &mut OrtBackend, forced: &[Forced], banned: &[u32]) -> f32 {
    let sources: Vec<&[i64]> = forced.iter().map(|f| f.source_ids.as_slice()).collect();
    let encoded = backend.encode(&sources).unwrap();
    let mut rows = OrtRows::default();
    let slots: Vec<usize> = (0..forced.len()).collect();
    backend.place(&mut rows, encoded, &slots).unwrap();
    let steps = forced[0].decoder_ids.len();
    assert!(forced.iter().all(|f| f.decoder_ids.len() == steps));
    let mut worst = 0f32;
    for step in 0..steps {
        let ids: Vec<i64> = forced.iter().map(|f| f.decoder_ids[step]).collect();
        let positions = vec![step as i64; forced.len()];
        let lengths = vec![0; forced.len()];
        let logits = backend.step(&mut rows, &ids, &positions, &lengths).unwrap();
        for (row, f) in forced.iter().enumerate() {
            for (token, (&got, &expected)) in
                logits.row(row).iter().zip(&f.logits[step]).enumerate()
            {
                if banned.contains(&(token as u32)) {
                    assert!(got <= BANNED_LOGIT / 2.0, "banned token {token}: {got}");
                } else {
                    worst = worst.max((got - expected).abs());
                }
            }
        }
    }
    worst
}

/// Every reference input in one running batch, each under its own budget, as the server
/// decodes.
fn greedy(
    backend: &mut OrtBackend,
    manifest: &Manifest,
    reference: &Reference,
) -> Vec<DecodeOutput> {
    let special = SpecialIds {
        bos: manifest.bos_id,
        eos: manifest.eos_id,
    };
    let inputs: Vec<DecodeInput> = reference
        .cases
        .iter()
        .map(|c| DecodeInput::new(c.source_ids.clone(), c.budget))
        .collect();
    greedy_decode(backend, special, &inputs).unwrap()
}

fn check_dir(name: &str, hf_dir: &Path) {
    let reference = reference(hf_dir);
    let work = tempfile::tempdir().unwrap();
    let package = work.path().join("package");
    let manifest = import(hf_dir, &package);
    assert_eq!(manifest.bos_id, reference.pad_id);
    assert_eq!(manifest.pad_id, reference.pad_id);
    assert_eq!(manifest.eos_id, 0);
    // What `GET /models` says of it: imported, and without a length encoding.
    assert_eq!(manifest.origin(), "huggingface-marian");
    assert!(!manifest.config.is_length_aware());
    let mut backend = backend(&package, &manifest);

    let banned = [reference.pad_id];
    let worst = teacher_forced_difference(&mut backend, &reference.teacher_forced, &banned);
    let positions: usize = reference
        .teacher_forced
        .iter()
        .map(|f| f.logits.len())
        .sum();
    println!("{name}: teacher-forced logits: max |onnx - transformers| = {worst:e} over {positions} positions");
    assert!(worst < LOGIT_TOLERANCE, "{name}: logits off by {worst}");

    let outputs = greedy(&mut backend, &manifest, &reference);
    let same = reference
        .cases
        .iter()
        .zip(&outputs)
        .filter(|(c, o)| c.output_ids == o.ids)
        .count();
    let tokens: usize = reference.cases.iter().map(|c| c.output_ids.len()).sum();
    let ended = reference.cases.iter().filter(|c| c.ended_with_eos).count();
    println!(
        "{name}: greedy token ids identical to transformers' generate on {same}/{} inputs \
         ({tokens} tokens, {ended} ended by EOS, the rest at their budget)",
        reference.cases.len()
    );
    for (case, output) in reference.cases.iter().zip(&outputs) {
        assert_eq!(output.ids, case.output_ids, "{name}: {:?}", case.text);
    }

    // The whole pipeline from text to text, as nmt-translate and the server run it.
    let options = EngineOptions {
        device: Device::Cpu,
        intra_op_threads: 1,
        ort_dylib_path: None,
        beyond_input_limit: false,
        limits: RequestLimits::default(),
        placeholder_masking: true,
        workers: 1,
    };
    let mut engine = Engine::load(&package, &options).unwrap_or_else(|e| panic!("{e:#}"));
    let texts: Vec<String> = reference.cases.iter().map(|c| c.text.clone()).collect();
    let lengths = vec![LengthRequest::default(); texts.len()];
    let translations = engine.translate(&texts, &lengths, 16, &mut |_| {}).unwrap();
    for (case, translation) in reference.cases.iter().zip(&translations) {
        let ids = engine.pipeline().codec.encode(&case.text).unwrap();
        let source: Vec<i64> = ids.iter().map(|&t| i64::from(t)).chain([0]).collect();
        assert_eq!(
            source, case.source_ids,
            "{name}: tokenizing {:?}",
            case.text
        );
        assert_eq!(
            translation.text, case.translation,
            "{name}: {:?}",
            case.text
        );
        assert_eq!(
            translation.output_tokens,
            case.output_ids.len(),
            "{:?}",
            case.text
        );
    }
    println!(
        "{name}: the engine's pipeline: tokenization and translations identical to \
         MarianTokenizer + generate on {} texts",
        texts.len()
    );
}

#[test]
fn tiny_swish_matches_transformers() {
    check_dir("tiny-swish", &fixture("tiny-swish"));
}

/// `nmt-export quantize` takes an imported package: the tied projection is untied past
/// `final_logits_bias`, every weight product becomes int8, and the int8 package decodes.
#[test]
fn an_imported_model_quantizes() {
    let hf_dir = fixture("tiny-swish");
    let reference = reference(&hf_dir);
    let work = tempfile::tempdir().unwrap();
    let float = work.path().join("float32");
    import(&hf_dir, &float);
    let int8 = work.path().join("int8");
    let quantized = quantize_package(&QuantizeArgs {
        package: float,
        out: int8.clone(),
        name: None,
        evaluation: None,
        int8: Int8Options::default(),
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let manifest = Manifest::load(&int8).unwrap();
    assert_eq!(manifest.precision, Precision::Int8);
    assert_eq!(manifest.origin(), "huggingface-marian");
    assert!(
        quantized.decoder.untied_logits,
        "the projection behind the bias"
    );
    assert!(quantized.decoder.matmul_integer > 0 && quantized.encoder.matmul_integer > 0);

    let outputs = greedy(&mut backend(&int8, &manifest), &manifest, &reference);
    let (same, all) = reference
        .cases
        .iter()
        .zip(&outputs)
        .fold((0, 0), |(same, all), (c, o)| {
            let agree = c.output_ids.iter().zip(&o.ids).take_while(|(a, b)| a == b);
            (same + agree.count(), all + c.output_ids.len())
        });
    // A random model's logits lie close together, so int8 noise flips some choices early
    // (47.5% when written); a broken graph agrees on next to nothing.
    let share = same as f64 / all.max(1) as f64;
    println!(
        "tiny-swish int8: {same}/{all} reference tokens before the first disagreement ({:.1}%)",
        100.0 * share
    );
    assert!(share > 0.25, "int8 agrees on {:.1}%", 100.0 * share);
    for (case, output) in reference.cases.iter().zip(&outputs) {
        assert!(output.ids.len() <= case.budget);
    }
}

/// The wider sweep (other activations, sizes, SentencePiece normalization), written by
/// `python3 -m nmt_tools.marian.fixture --out DIR --sweep` and checked with
/// `NMT_MARIAN_SWEEP=DIR cargo test -p model-export --test marian -- --ignored`.
#[test]
#[ignore = "needs the sweep's fixtures: NMT_MARIAN_SWEEP=DIR"]
fn sweep_matches_transformers() {
    let dir = PathBuf::from(std::env::var("NMT_MARIAN_SWEEP").expect("NMT_MARIAN_SWEEP"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    for name in names {
        check_dir(&name, &dir.join(&name));
    }
}

#[test]
fn refuses_what_it_does_not_implement() {
    let hf_dir = fixture("tiny-swish");
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("hf");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&hf_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let config_path = copy.join("config.json");
    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    for (key, value, named) in [
        (
            "activation_function",
            serde_json::json!("tanh"),
            "`activation_function`",
        ),
        (
            "normalize_before",
            serde_json::json!(true),
            "`normalize_before`",
        ),
        (
            "layernorm_embedding",
            serde_json::json!(true),
            "`layernorm_embedding`",
        ),
        (
            "share_encoder_decoder_embeddings",
            serde_json::json!(false),
            "`share_encoder_decoder_embeddings`",
        ),
    ] {
        let mut config = original.clone();
        config[key] = value;
        std::fs::write(&config_path, config.to_string()).unwrap();
        let error = import_marian(&ImportMarianArgs {
            hf_dir: copy.clone(),
            out: work.path().join("out"),
            name: None,
            source_language: None,
            target_language: None,
            tokenizers: Some(copy.clone()),
            check_texts: None,
            python: PathBuf::from("python3"),
            domains: Vec::new(),
        })
        .unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains(named), "{key}: {message}");
    }
}

/// The shipped tokenizers are what the converter writes (run when the interpreter of
/// `NMT_EXPORT_PYTHON`, else python3, has transformers and sentencepiece; skipped otherwise),
/// and the importer's own conversion with `--check-texts` finds no mismatch on the inputs.
#[test]
fn the_converter_writes_the_fixture_tokenizers() {
    let python = std::env::var("NMT_EXPORT_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = std::process::Command::new(&python)
        .args(["-c", "import transformers, sentencepiece, tokenizers"])
        .output();
    if !probe.is_ok_and(|p| p.status.success()) {
        println!("skipped: {python} has no transformers/sentencepiece/tokenizers");
        return;
    }
    let hf_dir = fixture("tiny-swish");
    let reference = reference(&hf_dir);
    let work = tempfile::tempdir().unwrap();
    let texts = work.path().join("texts.txt");
    let lines: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    std::fs::write(&texts, lines.join("\n")).unwrap();
    let out = work.path().join("package");
    import_marian(&ImportMarianArgs {
        hf_dir: hf_dir.clone(),
        out: out.clone(),
        name: None,
        source_language: None,
        target_language: None,
        tokenizers: None,
        check_texts: Some(texts),
        python: PathBuf::from(&python),
        domains: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    for name in ["tokenizer.json", "target_tokenizer.json"] {
        let read = |dir: &Path| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
        };
        assert_eq!(read(&out), read(&hf_dir), "{name}");
    }
}
