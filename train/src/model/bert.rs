//! A BERT encoder (MiniLM and its kin) for inference, read from a Hugging Face checkpoint
//! directory (`config.json`, `model.safetensors`) under the checkpoint's own key names, with
//! or without the `bert.` prefix of task models.
//!
//! Post-norm blocks, absolute learned positions, GELU (erf), every token of segment 0: what
//! `BertModel` computes for a single sentence. The length predictor uses it frozen; the
//! exported graph (`model-export`) reads the same file.

use std::path::Path;

use anyhow::{ensure, Context};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use crate::ops::attention::{self_attention, Keys};
use crate::ops::layer_norm::layer_norm;
use crate::ops::linear::linear;

/// Weights file of a checkpoint directory.
pub const BERT_WEIGHTS: &str = "model.safetensors";
/// Config file of a checkpoint directory.
pub const BERT_CONFIG: &str = "config.json";
/// Tokenizer file of a checkpoint directory.
pub const BERT_TOKENIZER: &str = "tokenizer.json";

/// The fields of a Hugging Face `BertConfig` this encoder reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub hidden_act: String,
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn absolute() -> String {
    "absolute".into()
}

impl BertConfig {
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join(BERT_CONFIG);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let config: Self =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        config.validate()?;
        Ok(config)
    }

    /// Refuses what neither this encoder nor the exported graph computes.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.hidden_act == "gelu",
            "hidden_act {:?}: only \"gelu\" (erf) is implemented",
            self.hidden_act
        );
        ensure!(
            self.position_embedding_type == "absolute",
            "position_embedding_type {:?}: only \"absolute\" is implemented",
            self.position_embedding_type
        );
        ensure!(
            self.num_attention_heads > 0
                && self.hidden_size.is_multiple_of(self.num_attention_heads),
            "hidden_size {} is not a multiple of {} heads",
            self.hidden_size,
            self.num_attention_heads
        );
        ensure!(self.type_vocab_size > 0, "no token type embeddings");
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// Weight `[out, in]` and bias `[out]`, as the checkpoint stores them.
#[derive(Clone, Debug)]
pub struct Dense {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Dense {
    fn new(inputs: usize, outputs: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get((outputs, inputs), "weight")?,
            bias: vb.get(outputs, "bias")?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        linear(x, &self.weight, Some(&self.bias))
    }
}

#[derive(Clone, Debug)]
pub struct Norm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl Norm {
    fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get(size, "weight")?,
            bias: vb.get(size, "bias")?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}

/// `embeddings.*`.
#[derive(Clone, Debug)]
pub struct Embeddings {
    pub word_embeddings: Tensor,
    pub position_embeddings: Tensor,
    pub token_type_embeddings: Tensor,
    pub layer_norm: Norm,
}

/// `encoder.layer.N.*`.
#[derive(Clone, Debug)]
pub struct BertLayer {
    /// `attention.self.{query,key,value}` stacked into one `[3 * hidden, hidden]` projection,
    /// the layout the fused attention kernel reads.
    pub query_key_value: Dense,
    pub attention_output: Dense,
    pub attention_layer_norm: Norm,
    pub intermediate: Dense,
    pub output: Dense,
    pub output_layer_norm: Norm,
}

#[derive(Clone, Debug)]
pub struct Bert {
    pub config: BertConfig,
    pub embeddings: Embeddings,
    pub layers: Vec<BertLayer>,
}

impl Bert {
    /// Reads `config.json` and `model.safetensors` from a checkpoint directory.
    pub fn load(dir: &Path, device: &Device) -> anyhow::Result<Self> {
        let config = BertConfig::load(dir)?;
        let weights = dir.join(BERT_WEIGHTS);
        // SAFETY: the file is only read, and not modified while the process runs.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, device)? };
        Self::new(config, vb).with_context(|| format!("loading {}", weights.display()))
    }

    pub fn new(config: BertConfig, vb: VarBuilder) -> Result<Self> {
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let (d, eps) = (config.hidden_size, config.layer_norm_eps);
        let e = vb.pp("embeddings");
        let embeddings = Embeddings {
            word_embeddings: e.get((config.vocab_size, d), "word_embeddings.weight")?,
            position_embeddings: e.get(
                (config.max_position_embeddings, d),
                "position_embeddings.weight",
            )?,
            token_type_embeddings: e
                .get((config.type_vocab_size, d), "token_type_embeddings.weight")?,
            layer_norm: Norm::new(d, eps, e.pp("LayerNorm"))?,
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| BertLayer::new(&config, vb.pp(format!("encoder.layer.{i}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config,
            embeddings,
            layers,
        })
    }

    /// Hidden states `[batch, len, hidden]` of `ids` `[batch, len]` (u32) under `mask`
    /// `[batch, len]` (f32, 1 = token; padding trailing).
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let d = self.config.hidden_size;
        if t > self.config.max_position_embeddings {
            candle_core::bail!(
                "{t} tokens: the position table ends at {}",
                self.config.max_position_embeddings
            );
        }
        let e = &self.embeddings;
        let words = e
            .word_embeddings
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, d))?;
        let positions = e.position_embeddings.narrow(0, 0, t)?;
        let segment = e.token_type_embeddings.narrow(0, 0, 1)?;
        let summed = words.broadcast_add(&(positions.broadcast_add(&segment)?))?;
        let mut x = e.layer_norm.forward(&summed)?;
        let keys = Keys::from_mask(mask)?;
        for layer in &self.layers {
            x = layer.forward(&x, keys.clone(), self.config.num_attention_heads)?;
        }
        Ok(x)
    }

    /// The `[CLS]` (first) position's top hidden state `[batch, hidden]`.
    pub fn cls(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        self.forward(ids, mask)?.narrow(1, 0, 1)?.squeeze(1)
    }
}

impl BertLayer {
    fn new(config: &BertConfig, vb: VarBuilder) -> Result<Self> {
        let (d, ffn, eps) = (
            config.hidden_size,
            config.intermediate_size,
            config.layer_norm_eps,
        );
        let attention = vb.pp("attention");
        let projections = ["query", "key", "value"]
            .iter()
            .map(|name| Dense::new(d, d, attention.pp("self").pp(*name)))
            .collect::<Result<Vec<_>>>()?;
        let stack = |part: fn(&Dense) -> &Tensor| {
            Tensor::cat(&projections.iter().map(part).collect::<Vec<_>>(), 0)
        };
        Ok(Self {
            query_key_value: Dense {
                weight: stack(|p| &p.weight)?,
                bias: stack(|p| &p.bias)?,
            },
            attention_output: Dense::new(d, d, attention.pp("output.dense"))?,
            attention_layer_norm: Norm::new(d, eps, attention.pp("output.LayerNorm"))?,
            intermediate: Dense::new(d, ffn, vb.pp("intermediate.dense"))?,
            output: Dense::new(ffn, d, vb.pp("output.dense"))?,
            output_layer_norm: Norm::new(d, eps, vb.pp("output.LayerNorm"))?,
        })
    }

    fn forward(&self, x: &Tensor, keys: Keys, heads: usize) -> Result<Tensor> {
        let qkv = self.query_key_value.forward(x)?;
        let context = self_attention(&qkv, heads, keys, None)?;
        let attended = self
            .attention_layer_norm
            .forward(&(self.attention_output.forward(&context)? + x)?)?;
        let hidden = self.intermediate.forward(&attended)?.gelu_erf()?;
        self.output_layer_norm
            .forward(&(self.output.forward(&hidden)? + &attended)?)
    }
}
