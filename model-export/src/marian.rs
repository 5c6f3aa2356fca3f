//! Hugging Face Marian (OPUS-MT) -> model package: `nmt-export import-marian`.
//!
//! Reads a directory as `MarianMTModel.save_pretrained` and `MarianTokenizer.save_pretrained`
//! write it (`config.json`, `model.safetensors` or `pytorch_model.bin`, `source.spm`,
//! `target.spm`, `vocab.json`, and `generation_config.json` when there is one) and writes the
//! encoder and decoder-step graphs with this crate's graph writer, under the same contract as
//! every other package (`model_package::names`: cross-attention keys and values from the
//! encoder, a self-attention KV cache the server keeps in slots). What transformers'
//! `modeling_marian.py` computes, and so what the graphs compute:
//!
//! - word embeddings scaled by sqrt(d_model) when `scale_embedding`, plus sinusoids laid out
//!   `[sin | cos]` (not interleaved) from position 0, the table of `max_position_embeddings`
//!   rows computed in f64 as transformers does and rounded to f32;
//! - post-norm layers (`LayerNorm(x + f(x))`, eps 1e-5), no final norm, no embedding norm;
//! - the activation `activation_function` names (swish/silu, gelu (erf), relu);
//! - one embedding table for the encoder, the decoder and the output projection, plus
//!   `final_logits_bias`;
//! - decoding starts from `decoder_start_token_id` (the pad id) and stops at `eos_token_id`;
//!   single tokens of `bad_words_ids` (`[[pad]]` in every OPUS-MT config) are banned as
//!   `generate` bans them, by -1e9 on their logit (finite, and lower than any logit).
//!
//! Everything else is refused with an error that names the field: a `config.json` key this
//! importer does not know, a value it does not implement, a tensor it does not place.
//!
//! The tokenizers: Marian cuts a text with `source.spm` and looks the pieces up in the shared
//! `vocab.json`; the package gets `tokenizer.json` (source) and `target_tokenizer.json`
//! (target, what the engine decodes with; manifest `target_tokenizer`), converted by
//! transformers' own converter (`python/marian_tokenizers.py`, run with python3), or copied from
//! `--tokenizers` when they were converted before.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context};
use candle_core::{DType, Device, Tensor};
use model_package::{
    files, names, AbsolutePosition, Architecture, Dim, LengthEncoding, Limits, Manifest,
    ModelConfig, NormPlacement, Precision, RecurrentPosition, RelativeAttention, StateSpec,
};
use serde_json::{json, Map, Value};

use crate::graph::{attr_int, Axis, ElemType, Graph};
use crate::proto::ModelProto;
use crate::transformer::{cache_view, padding_bias};

/// Carried in the binary and run with python3 (`python/marian_tokenizers.py`).
const TOKENIZER_SCRIPT: &str = include_str!("../python/marian_tokenizers.py");

/// The target side's tokenizer inside a package written by this importer.
pub const TARGET_TOKENIZER: &str = "target_tokenizer.json";

/// What `bad_words_ids` does to a banned token's logit.
pub const BANNED_LOGIT: f32 = -1e9;

/// transformers' `nn.LayerNorm` default.
const LAYER_NORM_EPS: f64 = 1e-5;

#[derive(clap::Args, Clone, Debug)]
pub struct ImportMarianArgs {
    /// Hugging Face Marian directory (OPUS-MT): config.json, model.safetensors or
    /// pytorch_model.bin, source.spm, target.spm, vocab.json, tokenizer_config.json, and
    /// generation_config.json if it has one.
    #[arg(long)]
    pub hf_dir: PathBuf,
    /// Output directory of the model package (created or overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// Model name clients use to pick this package. Default: `<source>-<target>-marian`.
    #[arg(long)]
    pub name: Option<String>,
    /// Source language code. Default: tokenizer_config.json's `source_lang`.
    #[arg(long)]
    pub source_language: Option<String>,
    /// Target language code. Default: tokenizer_config.json's `target_lang`.
    #[arg(long)]
    pub target_language: Option<String>,
    /// Folder with tokenizer.json (source) and target_tokenizer.json (target) already
    /// converted from this directory's SentencePiece models (by python/marian_tokenizers.py),
    /// to copy instead of converting them with --python.
    #[arg(long)]
    pub tokenizers: Option<PathBuf>,
    /// Text file (one text a line) on which the converted tokenizers are compared with
    /// SentencePiece + vocab.json (MarianTokenizer's way), both ways; a mismatch is an error.
    #[arg(long)]
    pub check_texts: Option<PathBuf>,
    /// Python interpreter with transformers, tokenizers, sentencepiece and protobuf (no
    /// torch), which convert the SentencePiece models. Not needed with --tokenizers.
    #[arg(long = "python", env = "NMT_EXPORT_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// What the model was trained on, in words its users read (repeat for each domain).
    #[arg(long = "domain")]
    pub domains: Vec<String>,
}

/// The activations transformers' `ACT2FN` names that the graphs implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (`swish`, `silu`): every OPUS-MT model.
    Swish,
    /// `x * (1 + erf(x / sqrt 2)) / 2` (`gelu`, transformers' exact GELU).
    Gelu,
    Relu,
}

/// The architecture a Marian `config.json` (and `generation_config.json`) describes, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct MarianConfig {
    pub vocab_size: usize,
    pub d_model: usize,
    pub heads: usize,
    pub ffn_dim: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub max_positions: usize,
    pub activation: Activation,
    pub scale_embedding: bool,
    pub pad_id: u32,
    pub eos_id: u32,
    pub decoder_start_id: u32,
    /// Single tokens `generate` never produces (`bad_words_ids`).
    pub banned: Vec<u32>,
    /// Keys read but not acted on, with why: reported in the manifest.
    pub notes: Vec<String>,
}

/// `config.json` keys that do not change what greedy decoding computes: training settings,
/// bookkeeping, and outputs nobody asks for here.
const IGNORED_KEYS: &[&str] = &[
    "_name_or_path",
    "activation_dropout",
    "add_cross_attention",
    "architectures",
    "attention_dropout",
    "bos_token_id",
    "chunk_size_feed_forward",
    "classif_dropout",
    "classifier_dropout",
    "cross_attention_hidden_size",
    "dropout",
    "dtype",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "extra_pos_embeddings",
    "finetuning_task",
    "gradient_checkpointing",
    "id2label",
    "init_std",
    "label2id",
    "model_name",
    "num_labels",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "prefix",
    "problem_type",
    "pruned_heads",
    "return_dict",
    "return_dict_in_generate",
    "sep_token_id",
    "task_specific_params",
    "tf_legacy_loss",
    "tokenizer_class",
    "torch_dtype",
    "torchscript",
    "transformers_version",
    "use_bfloat16",
    "use_cache",
    // Beam search, sampling and lengths of `generate`: the server decodes greedily under its
    // own output budget (reported in the manifest's notes when set).
    "num_beams",
    "num_beam_groups",
    "num_return_sequences",
    "diversity_penalty",
    "length_penalty",
    "early_stopping",
    "max_length",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "output_logits",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
];

/// Keys whose value must be exactly this (they would change what is computed otherwise).
/// The first five are BART settings that old OPUS-MT conversions still carry; transformers'
/// Marian ignores them and computes what these values say, so another value means a model
/// that transformers does not run as its author meant.
fn required_values() -> Vec<(&'static str, Value)> {
    vec![
        ("normalize_before", json!(false)),
        ("normalize_embedding", json!(false)),
        ("add_final_layer_norm", json!(false)),
        ("add_bias_logits", json!(false)),
        ("static_position_embeddings", json!(true)),
        ("model_type", json!("marian")),
        ("is_encoder_decoder", json!(true)),
        ("is_decoder", json!(false)),
        ("tie_encoder_decoder", json!(false)),
        ("share_encoder_decoder_embeddings", json!(true)),
        ("tie_word_embeddings", json!(true)),
        ("do_sample", json!(false)),
        ("min_length", json!(0)),
        ("min_new_tokens", json!(0)),
        ("repetition_penalty", json!(1.0)),
        ("no_repeat_ngram_size", json!(0)),
        ("encoder_no_repeat_ngram_size", json!(0)),
        ("forced_bos_token_id", Value::Null),
        ("suppress_tokens", Value::Null),
        ("begin_suppress_tokens", Value::Null),
    ]
}

/// Keys read into [`MarianConfig`].
const READ_KEYS: &[&str] = &[
    "vocab_size",
    "decoder_vocab_size",
    "d_model",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "encoder_layers",
    "decoder_layers",
    "max_position_embeddings",
    "activation_function",
    "scale_embedding",
    "pad_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "forced_eos_token_id",
    "bad_words_ids",
];

fn same_value(found: &Value, expected: &Value) -> bool {
    match (found.as_f64(), expected.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => {
            found == expected || (expected.is_null() && found.as_array().is_some_and(Vec::is_empty))
        }
    }
}

impl MarianConfig {
    /// `config.json` with `generation_config.json`'s keys over it (what `generate` reads).
    pub fn from_json(config: &Map<String, Value>) -> anyhow::Result<Self> {
        let required = required_values();
        for (key, value) in config {
            let known = READ_KEYS.contains(&key.as_str())
                || IGNORED_KEYS.contains(&key.as_str())
                || required.iter().any(|(k, _)| k == key);
            ensure!(
                known,
                "config.json: field `{key}` ({value}) is not one this importer reads: refusing \
                 rather than guessing what it changes"
            );
        }
        for (key, expected) in &required {
            if let Some(found) = config.get(*key) {
                ensure!(
                    same_value(found, expected),
                    "config.json: `{key}` is {found}; only {expected} is supported"
                );
            }
        }
        let usize_of = |key: &str| -> anyhow::Result<usize> {
            config
                .get(key)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .with_context(|| format!("config.json: `{key}` missing or not a whole number"))
        };
        let id_of = |key: &str| -> anyhow::Result<u32> {
            let value = config
                .get(key)
                .with_context(|| format!("config.json: `{key}` missing"))?;
            let single = match value {
                Value::Array(items) if items.len() == 1 => &items[0],
                other => other,
            };
            single
                .as_u64()
                .map(|v| v as u32)
                .with_context(|| format!("config.json: `{key}` is {value}, not one token id"))
        };
        let vocab_size = usize_of("vocab_size")?;
        if let Some(decoder_vocab) = config.get("decoder_vocab_size") {
            ensure!(
                decoder_vocab.is_null() || decoder_vocab.as_u64() == Some(vocab_size as u64),
                "config.json: `decoder_vocab_size` {decoder_vocab} differs from `vocab_size` \
                 {vocab_size}: separate target vocabularies are not supported"
            );
        }
        let pairs = [
            ("encoder_attention_heads", "decoder_attention_heads"),
            ("encoder_ffn_dim", "decoder_ffn_dim"),
        ];
        for (encoder, decoder) in pairs {
            ensure!(
                usize_of(encoder)? == usize_of(decoder)?,
                "config.json: `{encoder}` {} and `{decoder}` {} differ: not supported",
                usize_of(encoder)?,
                usize_of(decoder)?
            );
        }
        let activation = match config.get("activation_function").and_then(Value::as_str) {
            Some("swish" | "silu") => Activation::Swish,
            Some("gelu") => Activation::Gelu,
            Some("relu") => Activation::Relu,
            other => bail!(
                "config.json: `activation_function` {other:?} is not supported (swish, silu, \
                 gelu, relu)"
            ),
        };
        let pad_id = id_of("pad_token_id")?;
        let eos_id = id_of("eos_token_id")?;
        let decoder_start_id = id_of("decoder_start_token_id")?;
        ensure!(
            decoder_start_id == pad_id,
            "config.json: `decoder_start_token_id` {decoder_start_id} is not `pad_token_id` \
             {pad_id}: Marian decoders start from the pad token, and the package's special ids \
             assume it"
        );
        if let Some(forced) = config.get("forced_eos_token_id") {
            ensure!(
                forced.is_null() || id_of("forced_eos_token_id")? == eos_id,
                "config.json: `forced_eos_token_id` {forced} is not `eos_token_id` {eos_id}"
            );
        }
        let mut banned = Vec::new();
        match config.get("bad_words_ids") {
            None | Some(Value::Null) => {}
            Some(Value::Array(sequences)) => {
                for sequence in sequences {
                    let token = sequence
                        .as_array()
                        .filter(|s| s.len() == 1)
                        .and_then(|s| s[0].as_u64());
                    let Some(token) = token else {
                        bail!(
                            "config.json: `bad_words_ids` holds {sequence}: only single tokens \
                             are supported"
                        );
                    };
                    ensure!(
                        (token as usize) < vocab_size,
                        "config.json: `bad_words_ids` token {token} is outside the vocabulary"
                    );
                    banned.push(token as u32);
                }
            }
            Some(other) => bail!("config.json: `bad_words_ids` is {other}, not a list"),
        }
        let mut notes = Vec::new();
        if let Some(beams) = config.get("num_beams").and_then(Value::as_u64) {
            if beams > 1 {
                notes.push(format!(
                    "num_beams {beams}: this server decodes greedily (num_beams 1)"
                ));
            }
        }
        if let Some(length) = config.get("max_length").and_then(Value::as_u64) {
            notes.push(format!(
                "max_length {length}: the server's output budget applies instead"
            ));
        }
        let config = MarianConfig {
            vocab_size,
            d_model: usize_of("d_model")?,
            heads: usize_of("encoder_attention_heads")?,
            ffn_dim: usize_of("encoder_ffn_dim")?,
            encoder_layers: usize_of("encoder_layers")?,
            decoder_layers: usize_of("decoder_layers")?,
            max_positions: usize_of("max_position_embeddings")?,
            activation,
            // transformers' MarianConfig default; every OPUS-MT config sets it true.
            scale_embedding: config
                .get("scale_embedding")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            pad_id,
            eos_id,
            decoder_start_id,
            banned,
            notes,
        };
        for (field, value) in [
            ("d_model", config.d_model),
            ("encoder_attention_heads", config.heads),
            ("encoder_layers", config.encoder_layers),
            ("decoder_layers", config.decoder_layers),
            ("max_position_embeddings", config.max_positions),
        ] {
            ensure!(value > 0, "config.json: `{field}` is 0");
        }
        ensure!(
            config.d_model.is_multiple_of(config.heads) && config.d_model.is_multiple_of(2),
            "config.json: `d_model` {} must be even and divisible by `encoder_attention_heads` {}",
            config.d_model,
            config.heads
        );
        for (field, id) in [("pad_token_id", pad_id), ("eos_token_id", eos_id)] {
            ensure!(
                (id as usize) < vocab_size,
                "config.json: `{field}` {id} is outside the vocabulary ({vocab_size})"
            );
        }
        Ok(config)
    }

    fn head_dim(&self) -> usize {
        self.d_model / self.heads
    }

    /// The package's [`ModelConfig`]: what the server and the tools read of the model.
    pub fn model_config(&self) -> ModelConfig {
        ModelConfig {
            preset: "marian".into(),
            architecture: Architecture::Marian,
            vocab_size: self.vocab_size,
            d_model: self.d_model,
            num_heads: self.heads,
            ffn_dim: self.ffn_dim,
            encoder_layers: self.encoder_layers,
            decoder_layers: self.decoder_layers,
            dropout: 0.0,
            norm: NormPlacement::Post,
            absolute_position: AbsolutePosition::Sinusoidal,
            max_positions: self.max_positions,
            relative_attention: RelativeAttention::None,
            relative_clip: 16,
            recurrent_position: RecurrentPosition::None,
            recurrent_dim: 0,
            length_encoding: LengthEncoding::None,
            length_noise: 0,
            layer_norm_eps: LAYER_NORM_EPS,
        }
    }
}

/// transformers' `MarianSinusoidalPositionalEmbedding.create_weight`: `[positions, d]`, the
/// first half `sin(pos / 10000^(2i/d))`, the second half `cos` of the same angles, computed
/// in f64 and rounded to f32.
pub fn sinusoid_table(positions: usize, d: usize) -> Vec<f32> {
    let half = d / 2;
    let mut table = vec![0f32; positions * d];
    for pos in 0..positions {
        for i in 0..half {
            let angle = pos as f64 / 10000f64.powf((2 * i) as f64 / d as f64);
            table[pos * d + i] = angle.sin() as f32;
            table[pos * d + half + i] = angle.cos() as f32;
        }
    }
    table
}

/// A linear layer as the graph holds it: `W^T` `[in, out]` and the bias.
struct Linear {
    weight_t: Vec<f32>,
    fan_in: usize,
    fan_out: usize,
    bias: Vec<f32>,
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
}

struct FeedForward {
    fc1: Linear,
    fc2: Linear,
}

struct EncoderLayer {
    self_attn: Attention,
    self_attn_norm: Norm,
    ffn: FeedForward,
    ffn_norm: Norm,
}

struct DecoderLayer {
    self_attn: Attention,
    self_attn_norm: Norm,
    cross_attn: Attention,
    cross_attn_norm: Norm,
    ffn: FeedForward,
    ffn_norm: Norm,
}

/// Every weight of the model, checked for shape, each tensor of the file used once.
struct MarianWeights {
    embed: Vec<f32>,
    positions: Vec<f32>,
    logits_bias: Vec<f32>,
    encoder: Vec<EncoderLayer>,
    decoder: Vec<DecoderLayer>,
}

/// The tensors of a checkpoint file, taken by name.
struct TensorFile {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
    used: HashSet<String>,
}

impl TensorFile {
    /// `model.safetensors`, else `pytorch_model.bin` (read by candle's pickle reader, no
    /// torch), any float dtype, as f32.
    fn open(dir: &Path) -> anyhow::Result<Self> {
        let safetensors = dir.join("model.safetensors");
        let bin = dir.join("pytorch_model.bin");
        let (path, tensors) = if safetensors.is_file() {
            let tensors = candle_core::safetensors::load(&safetensors, &Device::Cpu)
                .with_context(|| format!("reading {}", safetensors.display()))?;
            (safetensors, tensors)
        } else if bin.is_file() {
            let tensors = candle_core::pickle::read_all(&bin)
                .with_context(|| format!("reading {}", bin.display()))?;
            (bin, tensors.into_iter().collect())
        } else if dir.join("model.safetensors.index.json").is_file()
            || dir.join("pytorch_model.bin.index.json").is_file()
        {
            bail!(
                "{}: sharded checkpoints are not supported (save the model in one file)",
                dir.display()
            )
        } else {
            bail!(
                "{}: no model.safetensors or pytorch_model.bin (tf_model.h5 and flax are not \
                 read)",
                dir.display()
            )
        };
        Ok(TensorFile {
            path,
            tensors,
            used: HashSet::new(),
        })
    }

    fn shown(&self) -> String {
        self.path.display().to_string()
    }

    /// Tensor `name` as f32 values, of shape `dims`.
    fn take(&mut self, name: &str, dims: &[usize]) -> anyhow::Result<Vec<f32>> {
        let tensor = self
            .tensors
            .get(name)
            .with_context(|| format!("{}: no tensor `{name}`", self.shown()))?;
        ensure!(
            tensor.dims() == dims,
            "{}: `{name}` has shape {:?}, expected {dims:?}",
            self.shown(),
            tensor.dims()
        );
        self.used.insert(name.to_string());
        Ok(tensor
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }

    /// A PyTorch `nn.Linear` (`weight` `[out, in]`, `bias` `[out]`) as [`Linear`].
    fn linear(&mut self, prefix: &str, fan_in: usize, fan_out: usize) -> anyhow::Result<Linear> {
        let weight = self.take(&format!("{prefix}.weight"), &[fan_out, fan_in])?;
        let bias = self.take(&format!("{prefix}.bias"), &[fan_out])?;
        let mut weight_t = vec![0f32; fan_in * fan_out];
        for o in 0..fan_out {
            for i in 0..fan_in {
                weight_t[i * fan_out + o] = weight[o * fan_in + i];
            }
        }
        Ok(Linear {
            weight_t,
            fan_in,
            fan_out,
            bias,
        })
    }

    fn norm(&mut self, prefix: &str, d: usize) -> anyhow::Result<Norm> {
        Ok(Norm {
            weight: self.take(&format!("{prefix}.weight"), &[d])?,
            bias: self.take(&format!("{prefix}.bias"), &[d])?,
        })
    }

    fn attention(&mut self, prefix: &str, d: usize) -> anyhow::Result<Attention> {
        Ok(Attention {
            q: self.linear(&format!("{prefix}.q_proj"), d, d)?,
            k: self.linear(&format!("{prefix}.k_proj"), d, d)?,
            v: self.linear(&format!("{prefix}.v_proj"), d, d)?,
            out: self.linear(&format!("{prefix}.out_proj"), d, d)?,
        })
    }

    fn feed_forward(&mut self, prefix: &str, d: usize, ffn: usize) -> anyhow::Result<FeedForward> {
        Ok(FeedForward {
            fc1: self.linear(&format!("{prefix}.fc1"), d, ffn)?,
            fc2: self.linear(&format!("{prefix}.fc2"), ffn, d)?,
        })
    }
}

/// The tied table: every copy of it that the file holds (transformers saves one, older files
/// several) must be the same.
const EMBEDDING_NAMES: [&str; 4] = [
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
];

fn read_weights(file: &mut TensorFile, config: &MarianConfig) -> anyhow::Result<MarianWeights> {
    let (v, d, ffn) = (config.vocab_size, config.d_model, config.ffn_dim);
    let mut embed: Option<(String, Vec<f32>)> = None;
    for name in EMBEDDING_NAMES {
        if !file.tensors.contains_key(name) {
            continue;
        }
        let table = file.take(name, &[v, d])?;
        match &embed {
            None => embed = Some((name.to_string(), table)),
            Some((first, values)) => ensure!(
                *values == table,
                "{}: `{name}` differs from `{first}`: untied embeddings are not supported",
                file.shown()
            ),
        }
    }
    let Some((_, embed)) = embed else {
        bail!(
            "{}: no embedding table (none of {})",
            file.shown(),
            EMBEDDING_NAMES.join(", ")
        );
    };
    let logits_bias = if file.tensors.contains_key("final_logits_bias") {
        file.take("final_logits_bias", &[1, v])?
    } else {
        // transformers starts it at zeros when the file lacks it.
        vec![0.0; v]
    };
    let computed = sinusoid_table(config.max_positions, d);
    // Not saved by current transformers; older files have them, and transformers loads them.
    let mut positions = None;
    for side in ["encoder", "decoder"] {
        let name = format!("model.{side}.embed_positions.weight");
        if file.tensors.contains_key(&name) {
            let table = file.take(&name, &[config.max_positions, d])?;
            let worst = table
                .iter()
                .zip(&computed)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            ensure!(
                worst <= 1e-4,
                "{}: `{name}` is not the sinusoid table (off by {worst}): learned positions are \
                 not supported",
                file.shown()
            );
            positions.get_or_insert(table);
        }
    }
    let positions = positions.unwrap_or(computed);
    let encoder = (0..config.encoder_layers)
        .map(|i| -> anyhow::Result<EncoderLayer> {
            let p = format!("model.encoder.layers.{i}");
            Ok(EncoderLayer {
                self_attn: file.attention(&format!("{p}.self_attn"), d)?,
                self_attn_norm: file.norm(&format!("{p}.self_attn_layer_norm"), d)?,
                ffn: file.feed_forward(&p, d, ffn)?,
                ffn_norm: file.norm(&format!("{p}.final_layer_norm"), d)?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let decoder = (0..config.decoder_layers)
        .map(|i| -> anyhow::Result<DecoderLayer> {
            let p = format!("model.decoder.layers.{i}");
            Ok(DecoderLayer {
                self_attn: file.attention(&format!("{p}.self_attn"), d)?,
                self_attn_norm: file.norm(&format!("{p}.self_attn_layer_norm"), d)?,
                cross_attn: file.attention(&format!("{p}.encoder_attn"), d)?,
                cross_attn_norm: file.norm(&format!("{p}.encoder_attn_layer_norm"), d)?,
                ffn: file.feed_forward(&p, d, ffn)?,
                ffn_norm: file.norm(&format!("{p}.final_layer_norm"), d)?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let mut unused: Vec<&String> = file
        .tensors
        .keys()
        .filter(|name| !file.used.contains(*name))
        .collect();
    unused.sort();
    if let Some(name) = unused.first() {
        bail!(
            "{}: tensor `{name}` is not part of the model this importer writes ({} such \
             tensors): refusing rather than dropping it",
            file.shown(),
            unused.len()
        );
    }
    Ok(MarianWeights {
        embed,
        positions,
        logits_bias,
        encoder,
        decoder,
    })
}

/// Writes the graphs from the weights.
struct Writer<'a> {
    config: &'a MarianConfig,
    weights: &'a MarianWeights,
}

impl Writer<'_> {
    fn linear(&self, g: &mut Graph, layer: &Linear, x: &str, hint: &str) -> String {
        let w = g.weight(
            &format!("{hint}.weight"),
            &[layer.fan_in, layer.fan_out],
            &layer.weight_t,
        );
        let b = g.weight(&format!("{hint}.bias"), &[layer.fan_out], &layer.bias);
        let y = g.matmul(x, &w);
        g.add(&y, &b)
    }

    fn norm(&self, g: &mut Graph, norm: &Norm, x: &str, hint: &str) -> String {
        let d = self.config.d_model;
        let w = g.weight(&format!("{hint}.weight"), &[d], &norm.weight);
        let b = g.weight(&format!("{hint}.bias"), &[d], &norm.bias);
        g.layer_norm(x, &w, &b, LAYER_NORM_EPS)
    }

    /// `LayerNorm(x + sublayer(x))`: the norm named after the sublayer, as transformers
    /// names it.
    fn post_norm(
        &self,
        g: &mut Graph,
        x: &str,
        norm: &Norm,
        scope: &str,
        norm_name: &str,
        sublayer: impl FnOnce(&mut Graph, &str) -> String,
    ) -> String {
        let y = g.scoped(scope, |g| sublayer(g, x));
        let sum = g.add(x, &y);
        self.norm(g, norm, &sum, norm_name)
    }

    fn activation(&self, g: &mut Graph, x: &str) -> String {
        match self.config.activation {
            Activation::Swish => {
                let s = g.op("Sigmoid", &[x], vec![]);
                g.mul(x, &s)
            }
            Activation::Relu => g.op("Relu", &[x], vec![]),
            Activation::Gelu => {
                let root = g.float_scalar(std::f32::consts::SQRT_2);
                let scaled = g.op("Div", &[x, &root], vec![]);
                let erf = g.op("Erf", &[&scaled], vec![]);
                let one = g.float_scalar(1.0);
                let plus = g.add(&erf, &one);
                let half = g.float_scalar(0.5);
                let half_x = g.mul(x, &half);
                g.mul(&half_x, &plus)
            }
        }
    }

    fn feed_forward(&self, g: &mut Graph, ffn: &FeedForward, x: &str) -> String {
        let h = self.linear(g, &ffn.fc1, x, "fc1");
        let h = self.activation(g, &h);
        self.linear(g, &ffn.fc2, &h, "fc2")
    }

    /// `[batch, len, d]` -> `[batch, heads, len, head_dim]`
    fn split_heads(&self, g: &mut Graph, x: &str) -> String {
        let (h, dh) = (self.config.heads as i64, self.config.head_dim() as i64);
        let x = g.reshape(x, &[0, 0, h, dh]);
        g.transpose(&x, &[0, 2, 1, 3])
    }

    /// A step's `[batch, d]` -> `[batch, heads, 1, head_dim]`, into `out` when given.
    fn split_step_heads(&self, g: &mut Graph, x: &str, out: Option<&str>) -> String {
        let (h, dh) = (self.config.heads as i64, self.config.head_dim() as i64);
        let shape = g.ints(&[0, h, 1, dh]);
        match out {
            Some(out) => {
                g.op_into("Reshape", &[x, &shape], vec![], out);
                out.to_string()
            }
            None => g.op("Reshape", &[x, &shape], vec![]),
        }
    }

    /// `softmax(scores * head_dim^-0.5 + bias)`.
    fn probabilities(&self, g: &mut Graph, scores: &str, bias: &str) -> String {
        let scale = self.scale(g);
        let scores = g.mul(scores, &scale);
        let scores = g.add(&scores, bias);
        g.softmax_last(&scores)
    }

    /// Attention of `query` over precomputed `keys`/`values` `[batch, heads, k_len, dh]`;
    /// `step`: `query` is a decoder step's `[batch, d]`, else `[batch, len, d]`.
    fn attend(
        &self,
        g: &mut Graph,
        attn: &Attention,
        query: &str,
        (keys, values, bias): (&str, &str, &str),
        step: bool,
    ) -> String {
        let q = self.linear(g, &attn.q, query, "q_proj");
        let q = if step {
            self.split_step_heads(g, &q, None)
        } else {
            self.split_heads(g, &q)
        };
        if step {
            let scale = self.scale(g);
            let inputs = [q.as_str(), keys, values, bias, &scale];
            let context = g.fused(crate::fused::attention_step(), &inputs);
            return self.merge_heads(g, attn, &context, true);
        }
        let kt = g.transpose(keys, &[0, 1, 3, 2]);
        let scores = g.matmul(&q, &kt);
        let probs = self.probabilities(g, &scores, bias);
        let context = g.matmul(&probs, values);
        self.merge_heads(g, attn, &context, step)
    }

    /// `head_dim^-0.5`, the scores' scale.
    fn scale(&self, g: &mut Graph) -> String {
        g.float_scalar(1.0 / (self.config.head_dim() as f32).sqrt())
    }

    fn merge_heads(&self, g: &mut Graph, attn: &Attention, context: &str, step: bool) -> String {
        let d = self.config.d_model as i64;
        let context = if step {
            g.reshape(context, &[0, d])
        } else {
            let context = g.transpose(context, &[0, 2, 1, 3]);
            g.reshape(&context, &[0, 0, d])
        };
        self.linear(g, &attn.out, &context, "out_proj")
    }

    fn tables(&self, g: &mut Graph) -> (String, String) {
        let (v, d, p) = (
            self.config.vocab_size,
            self.config.d_model,
            self.config.max_positions,
        );
        (
            g.weight("embed.weight", &[v, d], &self.weights.embed),
            g.weight("embed_positions.weight", &[p, d], &self.weights.positions),
        )
    }

    /// Word embeddings of `ids` (scaled when the config says so) plus the sinusoids at
    /// `positions`.
    fn embed(
        &self,
        g: &mut Graph,
        tables: &(String, String),
        ids: &str,
        positions: &str,
    ) -> String {
        let words = g.gather(&tables.0, ids, 0);
        let words = if self.config.scale_embedding {
            let scale = g.float_scalar((self.config.d_model as f32).sqrt());
            g.mul(&words, &scale)
        } else {
            words
        };
        let pe = g.gather(&tables.1, positions, 0);
        g.add(&words, &pe)
    }

    fn encoder(&self) -> ModelProto {
        let (h, dh) = (self.config.heads, self.config.head_dim());
        let mut g = Graph::new();
        let batch_len: Vec<Axis> = vec!["batch".into(), "source_len".into()];
        let ids = g.input(names::SOURCE_IDS, ElemType::I64, &batch_len);
        let mask = g.input(names::SOURCE_MASK, ElemType::F32, &batch_len);
        let tables = self.tables(&mut g);
        let positions = g.scoped("positions", |g| {
            let shape = g.op("Shape", &[&ids], vec![]);
            let one = g.int_scalar(1);
            let len = g.gather(&shape, &one, 0);
            let zero = g.int_scalar(0);
            g.op("Range", &[&zero, &len, &one], vec![])
        });
        let mut x = g.scoped("embed", |g| self.embed(g, &tables, &ids, &positions));
        let bias = padding_bias(&mut g, &mask);
        let bias = g.unsqueeze(&bias, &[1, 2]);
        for (i, layer) in self.weights.encoder.iter().enumerate() {
            x = g.scoped(&format!("encoder.layers.{i}"), |g| {
                let x = self.post_norm(
                    g,
                    &x,
                    &layer.self_attn_norm,
                    "self_attn",
                    "self_attn_layer_norm",
                    |g, x| {
                        let k = self.linear(g, &layer.self_attn.k, x, "k_proj");
                        let k = self.split_heads(g, &k);
                        let v = self.linear(g, &layer.self_attn.v, x, "v_proj");
                        let v = self.split_heads(g, &v);
                        self.attend(g, &layer.self_attn, x, (&k, &v, &bias), false)
                    },
                );
                self.post_norm(g, &x, &layer.ffn_norm, "ffn", "final_layer_norm", |g, x| {
                    self.feed_forward(g, &layer.ffn, x)
                })
            });
        }
        let head_axes: Vec<Axis> = vec!["batch".into(), h.into(), "source_len".into(), dh.into()];
        for (i, layer) in self.weights.decoder.iter().enumerate() {
            let (k, v) = g.scoped(&format!("decoder.layers.{i}.encoder_attn"), |g| {
                let k = self.linear(g, &layer.cross_attn.k, &x, "k_proj");
                let v = self.linear(g, &layer.cross_attn.v, &x, "v_proj");
                (self.split_heads(g, &k), self.split_heads(g, &v))
            });
            g.output(&k, &names::memory_cross_key(i), ElemType::F32, &head_axes);
            g.output(&v, &names::memory_cross_value(i), ElemType::F32, &head_axes);
        }
        g.output(&mask, names::MEMORY_SOURCE_MASK, ElemType::F32, &batch_len);
        g.finish(
            "encoder",
            "Marian encoder (imported from Hugging Face): source -> cross-attention keys/values \
             of every decoder layer.",
        )
    }

    fn decoder_step(&self) -> ModelProto {
        let cfg = self.config;
        let (h, dh) = (cfg.heads, cfg.head_dim());
        let mut g = Graph::new();
        let ids = g.input(names::TARGET_IDS, ElemType::I64, &["batch".into()]);
        let positions = g.input(names::POSITIONS, ElemType::I64, &["batch".into()]);
        let source_mask = g.input(
            names::MEMORY_SOURCE_MASK,
            ElemType::F32,
            &["batch".into(), "source_len".into()],
        );
        let cross_axes: Vec<Axis> = vec!["batch".into(), h.into(), "source_len".into(), dh.into()];
        let past_axes: Vec<Axis> = vec!["batch".into(), h.into(), "past_len".into(), dh.into()];
        let column_axes: Vec<Axis> = vec!["batch".into(), h.into(), 1usize.into(), dh.into()];
        let tables = self.tables(&mut g);
        // `[batch, d]` throughout: one position per row.
        let mut x = g.scoped("embed", |g| self.embed(g, &tables, &ids, &positions));
        let first_past_key = g.input(
            &names::past(&names::self_key_state(0)),
            ElemType::F32,
            &past_axes,
        );
        let view = g.scoped("cache", |g| cache_view(g, &first_past_key, &positions));
        let (self_bias, split) = (view.bias, view.split);
        let cross_bias = padding_bias(&mut g, &source_mask);
        let cross_bias = g.unsqueeze(&cross_bias, &[1, 2]);
        for (i, layer) in self.weights.decoder.iter().enumerate() {
            let cross_k = g.input(&names::memory_cross_key(i), ElemType::F32, &cross_axes);
            let cross_v = g.input(&names::memory_cross_value(i), ElemType::F32, &cross_axes);
            let key_state = names::self_key_state(i);
            let value_state = names::self_value_state(i);
            let past_k = if i == 0 {
                first_past_key.clone()
            } else {
                g.input(&names::past(&key_state), ElemType::F32, &past_axes)
            };
            let past_v = g.input(&names::past(&value_state), ElemType::F32, &past_axes);
            let (new_k, new_v) = (names::present(&key_state), names::present(&value_state));
            x = g.scoped(&format!("decoder.layers.{i}"), |g| {
                let x = self.post_norm(
                    g,
                    &x,
                    &layer.self_attn_norm,
                    "self_attn",
                    "self_attn_layer_norm",
                    |g, x| {
                        let attn = &layer.self_attn;
                        let k = self.linear(g, &attn.k, x, "k_proj");
                        self.split_step_heads(g, &k, Some(&new_k));
                        let v = self.linear(g, &attn.v, x, "v_proj");
                        self.split_step_heads(g, &v, Some(&new_v));
                        let q = self.linear(g, &attn.q, x, "q_proj");
                        let q = self.split_step_heads(g, &q, None);
                        // The cache is only read: its scores and the new column's are
                        // concatenated, not the keys (one fused node, the engine's kernel
                        // reading each row's own columns).
                        let scale = self.scale(g);
                        let inputs = [
                            q.as_str(),
                            &past_k,
                            &past_v,
                            &new_k,
                            &new_v,
                            &self_bias,
                            &split,
                            &scale,
                        ];
                        let context = g.fused(crate::fused::cached_attention_step(false), &inputs);
                        self.merge_heads(g, attn, &context, true)
                    },
                );
                let x = self.post_norm(
                    g,
                    &x,
                    &layer.cross_attn_norm,
                    "encoder_attn",
                    "encoder_attn_layer_norm",
                    |g, x| {
                        let memory = (cross_k.as_str(), cross_v.as_str(), cross_bias.as_str());
                        self.attend(g, &layer.cross_attn, x, memory, true)
                    },
                );
                self.post_norm(g, &x, &layer.ffn_norm, "ffn", "final_layer_norm", |g, x| {
                    self.feed_forward(g, &layer.ffn, x)
                })
            });
            for column in [&new_k, &new_v] {
                g.output(column, column, ElemType::F32, &column_axes);
            }
        }
        // The tied projection, then `final_logits_bias` (with the banned tokens' -1e9).
        let mut bias = self.weights.logits_bias.clone();
        for &token in &cfg.banned {
            bias[token as usize] = BANNED_LOGIT;
        }
        let projected = g.op("Gemm", &[&x, &tables.0], vec![attr_int("transB", 1)]);
        let bias = g.weight("final_logits_bias", &[cfg.vocab_size], &bias);
        let logits = g.add(&projected, &bias);
        g.output(
            &logits,
            names::LOGITS,
            ElemType::F32,
            &["batch".into(), cfg.vocab_size.into()],
        );
        g.finish(
            "decoder_step",
            "Marian decoder (imported from Hugging Face): one greedy step for a batch of rows \
             at their own positions.",
        )
    }
}

/// The decoder state of the step graph (the manifest's list).
fn decoder_state(config: &MarianConfig) -> Vec<StateSpec> {
    let dims = vec![
        Dim::Batch,
        Dim::Fixed(config.heads),
        Dim::Time,
        Dim::Fixed(config.head_dim()),
    ];
    (0..config.decoder_layers)
        .flat_map(|i| [names::self_key_state(i), names::self_value_state(i)])
        .map(|name| StateSpec {
            name,
            dims: dims.clone(),
        })
        .collect()
}

fn read_json(path: &Path) -> anyhow::Result<Map<String, Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))? {
        Value::Object(map) => Ok(map),
        other => bail!("{}: not a JSON object: {other}", path.display()),
    }
}

/// `config.json` with `generation_config.json` over it, as `generate` reads them.
pub fn read_config(hf_dir: &Path) -> anyhow::Result<(MarianConfig, Value)> {
    let config_path = hf_dir.join("config.json");
    let mut merged = read_json(&config_path)?;
    let recorded = json!({ "config": Value::Object(merged.clone()) });
    let mut recorded = recorded;
    let generation = hf_dir.join("generation_config.json");
    if generation.is_file() {
        let generation = read_json(&generation)?;
        recorded["generation_config"] = Value::Object(generation.clone());
        for (key, value) in generation {
            merged.insert(key, value);
        }
    }
    let config = MarianConfig::from_json(&merged)
        .with_context(|| format!("importing {}", hf_dir.display()))?;
    Ok((config, recorded))
}

/// The special tokens' ids in `vocab.json`.
fn special_ids(hf_dir: &Path) -> anyhow::Result<BTreeMap<String, u32>> {
    let vocab = read_json(&hf_dir.join("vocab.json"))?;
    let mut ids = BTreeMap::new();
    for token in ["</s>", "<unk>", "<pad>"] {
        let id = vocab
            .get(token)
            .and_then(Value::as_u64)
            .with_context(|| format!("{}: no {token}", hf_dir.join("vocab.json").display()))?;
        ids.insert(token.to_string(), id as u32);
    }
    Ok(ids)
}

/// Converts the SentencePiece models with the embedded script into `out`; returns its report.
fn convert_tokenizers(
    python: &Path,
    hf_dir: &Path,
    out: &Path,
    check: Option<&Path>,
) -> anyhow::Result<Value> {
    let mut command = Command::new(python);
    command.arg("-c").arg(TOKENIZER_SCRIPT).arg(hf_dir).arg(out);
    if let Some(check) = check {
        command.arg("--check").arg(check);
    }
    let run = match command.output() {
        Ok(run) => run,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{} not found: the SentencePiece models are converted by transformers' converter; \
             install Python 3 with transformers, tokenizers, sentencepiece and protobuf, name \
             an interpreter with --python, or give converted ones with --tokenizers",
            python.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("running {}", python.display())),
    };
    ensure!(
        run.status.success(),
        "converting the tokenizers of {}: {}",
        hf_dir.display(),
        String::from_utf8_lossy(&run.stderr).trim()
    );
    serde_json::from_slice(&run.stdout).with_context(|| {
        format!(
            "reading the converter's report: {}",
            String::from_utf8_lossy(&run.stdout)
        )
    })
}

fn language(
    given: &Option<String>,
    tokenizer_config: &Map<String, Value>,
    key: &str,
    flag: &str,
) -> anyhow::Result<String> {
    if let Some(language) = given {
        return Ok(language.clone());
    }
    tokenizer_config
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("tokenizer_config.json has no `{key}`: give {flag}"))
}

/// Writes the package and returns its manifest.
pub fn import_marian(args: &ImportMarianArgs) -> anyhow::Result<Manifest> {
    let hf_dir = &args.hf_dir;
    ensure!(hf_dir.is_dir(), "{} is not a directory", hf_dir.display());
    let (config, recorded_config) = read_config(hf_dir)?;
    let special = special_ids(hf_dir)?;
    for (field, id, token) in [
        ("pad_token_id", config.pad_id, "<pad>"),
        ("eos_token_id", config.eos_id, "</s>"),
    ] {
        ensure!(
            special[token] == id,
            "config.json: `{field}` is {id} but vocab.json gives {token} id {}",
            special[token]
        );
    }
    let tokenizer_config_path = hf_dir.join("tokenizer_config.json");
    let tokenizer_config = if tokenizer_config_path.is_file() {
        read_json(&tokenizer_config_path)?
    } else {
        Map::new()
    };
    if tokenizer_config
        .get("separate_vocabs")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        bail!("tokenizer_config.json: `separate_vocabs` is true: separate target vocabularies are not supported");
    }
    let source_language = language(
        &args.source_language,
        &tokenizer_config,
        "source_lang",
        "--source-language",
    )?;
    let target_language = language(
        &args.target_language,
        &tokenizer_config,
        "target_lang",
        "--target-language",
    )?;

    let mut file = TensorFile::open(hf_dir)?;
    let weights = read_weights(&mut file, &config)?;
    let writer = Writer {
        config: &config,
        weights: &weights,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    crate::write_onnx(&args.out.join(files::ENCODER), &writer.encoder())?;
    crate::write_onnx(&args.out.join(files::DECODER), &writer.decoder_step())?;

    let tokenizers = match &args.tokenizers {
        Some(dir) => {
            for name in [files::TOKENIZER, TARGET_TOKENIZER] {
                std::fs::copy(dir.join(name), args.out.join(name))
                    .with_context(|| format!("copying {}", dir.join(name).display()))?;
            }
            json!({ "copied_from": dir.display().to_string() })
        }
        None => convert_tokenizers(&args.python, hf_dir, &args.out, None)?,
    };
    let mut tokenizers = tokenizers;
    if let Some(texts) = &args.check_texts {
        let scratch = tempfile::tempdir()?;
        let report = convert_tokenizers(&args.python, hf_dir, scratch.path(), Some(texts))?;
        let check = &report["check"];
        let mismatches = |key: &str| check[key].as_array().map_or(0, Vec::len);
        ensure!(
            mismatches("encode_mismatches") == 0 && mismatches("decode_mismatches") == 0,
            "the converted tokenizers disagree with SentencePiece + vocab.json on {} of {} \
             texts when encoding and {} when decoding: {}",
            mismatches("encode_mismatches"),
            check["texts"],
            mismatches("decode_mismatches"),
            check
        );
        tokenizers["check"] = json!({ "texts": check["texts"], "mismatches": 0 });
    }

    let weights_file = file.path.clone();
    let mut manifest = Manifest {
        format_version: model_package::manifest::FORMAT_VERSION,
        name: args
            .name
            .clone()
            .unwrap_or_else(|| format!("{source_language}-{target_language}-marian")),
        source_language,
        target_language,
        config: config.model_config(),
        pad_id: config.pad_id,
        bos_id: config.decoder_start_id,
        eos_id: config.eos_id,
        unk_id: special["<unk>"],
        decoder_state: decoder_state(&config),
        limits: Limits {
            // Source positions 0.. hold the EOS too; the decoder's inputs start at 0 with
            // the start token, so a text of n subwords needs positions up to n - 1.
            max_source_tokens: Some(config.max_positions),
            max_target_tokens: config.max_positions - 1,
        },
        precision: Precision::Float32,
        quantization: Value::Null,
        files: Default::default(),
        training: json!({
            "imported": {
                "from": "huggingface-marian",
                "directory": hf_dir.display().to_string(),
                "weights": weights_file.file_name().map(|n| n.to_string_lossy().to_string()),
                "weights_sha256": model_package::manifest::sha256_file(&weights_file)?,
                "hf": recorded_config,
                "banned_tokens": config.banned,
                "notes": config.notes,
                "tokenizers": tokenizers,
            }
        }),
        evaluation: Value::Null,
        domains: args.domains.clone(),
        length_prediction: None,
        target_tokenizer: Some(TARGET_TOKENIZER.to_string()),
    };
    manifest.write(
        &args.out,
        &[
            files::ENCODER,
            files::DECODER,
            files::TOKENIZER,
            TARGET_TOKENIZER,
        ],
    )?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Map<String, Value> {
        let Value::Object(map) = json!({
            "model_type": "marian", "vocab_size": 10, "decoder_vocab_size": 10, "d_model": 8,
            "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
            "decoder_attention_heads": 2, "encoder_ffn_dim": 16, "decoder_ffn_dim": 16,
            "max_position_embeddings": 32, "activation_function": "swish",
            "scale_embedding": true, "pad_token_id": 9, "eos_token_id": 0,
            "decoder_start_token_id": 9, "forced_eos_token_id": 0,
            "bad_words_ids": [[9]], "num_beams": 4, "normalize_before": false,
        }) else {
            unreachable!()
        };
        map
    }

    fn refusal(key: &str, value: Value) -> String {
        let mut map = config();
        map.insert(key.into(), value);
        MarianConfig::from_json(&map).unwrap_err().to_string()
    }

    #[test]
    fn reads_an_opus_mt_config() {
        let config = MarianConfig::from_json(&config()).unwrap();
        assert_eq!(config.activation, Activation::Swish);
        assert_eq!(config.banned, vec![9]);
        assert_eq!(
            (config.pad_id, config.eos_id, config.decoder_start_id),
            (9, 0, 9)
        );
        assert!(
            config.notes[0].contains("num_beams 4"),
            "{:?}",
            config.notes
        );
        config.model_config().validate().unwrap();
    }

    #[test]
    fn refuses_what_it_does_not_implement_naming_the_field() {
        for (key, value, expected) in [
            (
                "activation_function",
                json!("gelu_new"),
                "`activation_function`",
            ),
            ("normalize_before", json!(true), "`normalize_before`"),
            (
                "share_encoder_decoder_embeddings",
                json!(false),
                "`share_encoder_decoder_embeddings`",
            ),
            ("decoder_vocab_size", json!(12), "`decoder_vocab_size`"),
            ("decoder_ffn_dim", json!(32), "`decoder_ffn_dim`"),
            (
                "decoder_start_token_id",
                json!(1),
                "`decoder_start_token_id`",
            ),
            ("bad_words_ids", json!([[3, 4]]), "`bad_words_ids`"),
            ("no_repeat_ngram_size", json!(3), "`no_repeat_ngram_size`"),
            ("layernorm_embedding", json!(true), "`layernorm_embedding`"),
        ] {
            let error = refusal(key, value);
            assert!(error.contains(expected), "{key}: {error}");
        }
    }

    #[test]
    fn sinusoids_are_sin_then_cos_from_position_zero() {
        let table = sinusoid_table(3, 4);
        assert_eq!(&table[..4], &[0.0, 0.0, 1.0, 1.0]);
        let angle = 1.0f64 / 10000f64.powf(0.5);
        assert_eq!(
            &table[4..8],
            &[
                1f64.sin() as f32,
                angle.sin() as f32,
                1f64.cos() as f32,
                angle.cos() as f32
            ]
        );
    }
}
