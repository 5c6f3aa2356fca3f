//! What the length head learns from, computed once per split and cached: the frozen BERT's
//! `[CLS]` vector and WordPiece count of every source, and both sides' lengths in the
//! translation model's subwords.
//!
//! The BERT forward pass is nearly all the cost of training the head (minutes per ten
//! thousand verses on one core, against seconds for the head), so the features are written
//! to a file named by a hash of everything they depend on and read back on the next run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use candle_core::{Device, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use crate::model::bert::Bert;
use crate::model::length_head::SPECIAL_TOKENS;

/// The frozen encoder and both tokenizers.
pub struct Encoders {
    pub bert: Bert,
    /// The BERT's own WordPiece tokenizer, as [`load_wordpiece_tokenizer`] gives it.
    pub wordpiece: Tokenizer,
    /// The translation model's tokenizer: the unit of every length predicted.
    pub subword: Tokenizer,
}

/// One split's features, in the order of its pairs.
pub struct Features {
    /// `[count, hidden]`; zero for a source too long for the BERT (see [`Features::fits`]).
    pub cls: Tensor,
    /// WordPiece ids of each source, `[CLS]` and `[SEP]` included (not cached: tokenizing
    /// is quick).
    pub ids: Vec<Vec<u32>>,
    /// WordPiece tokens of each source, `[CLS]` and `[SEP]` not counted.
    pub wordpieces: Vec<u32>,
    /// Source and target lengths in the translation model's subwords (no EOS).
    pub source_subwords: Vec<u32>,
    pub target_subwords: Vec<u32>,
    /// Wall-clock seconds the BERT took over these sources when they were extracted (`None`
    /// for a cache written without it).
    pub bert_seconds: Option<f64>,
}

/// A Hugging Face WordPiece `tokenizer.json` with its truncation and padding switched off:
/// MiniLM's ships with both fixed at 128 tokens, which would cut long inputs short and pad
/// short ones. Encode with special tokens (`encode(text, true)`): `[CLS] .. [SEP]`.
pub fn load_wordpiece_tokenizer(path: &Path) -> Result<Tokenizer> {
    let mut tokenizer = Tokenizer::from_file(path)
        .map_err(|e| anyhow!("loading the tokenizer {}: {e}", path.display()))?;
    tokenizer
        .with_truncation(None)
        .map_err(|e| anyhow!("switching truncation off: {e}"))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// Token ids of `text`, special tokens included.
pub fn wordpiece_ids(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tokenizer
        .encode(text, true)
        .map_err(|e| anyhow!("tokenizing {text:?}: {e}"))?
        .get_ids()
        .to_vec())
}

impl Features {
    pub fn len(&self) -> usize {
        self.wordpieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.wordpieces.is_empty()
    }

    /// Whether row `i`'s source fits the BERT's position table (the server falls back to
    /// the linear fit for those that do not).
    pub fn fits(&self, i: usize, max_positions: usize) -> bool {
        self.wordpieces[i] as usize + SPECIAL_TOKENS <= max_positions
    }

    /// `self`'s rows, then `other`'s.
    pub fn concat(self, other: Features) -> Result<Features> {
        let join = |mut a: Vec<u32>, b: Vec<u32>| {
            a.extend(b);
            a
        };
        let mut ids = self.ids;
        ids.extend(other.ids);
        Ok(Features {
            cls: Tensor::cat(&[&self.cls, &other.cls], 0)?,
            ids,
            wordpieces: join(self.wordpieces, other.wordpieces),
            source_subwords: join(self.source_subwords, other.source_subwords),
            target_subwords: join(self.target_subwords, other.target_subwords),
            bert_seconds: self
                .bert_seconds
                .zip(other.bert_seconds)
                .map(|(a, b)| a + b),
        })
    }

    fn save(&self, path: &Path) -> Result<()> {
        let device = self.cls.device();
        let vector = |v: &[u32]| Tensor::new(v, device);
        let seconds = Tensor::new(&[self.bert_seconds.unwrap_or(f64::NAN)], device)?;
        let tensors: HashMap<String, Tensor> = [
            ("bert_seconds", seconds),
            ("cls", self.cls.clone()),
            ("wordpieces", vector(&self.wordpieces)?),
            ("source_subwords", vector(&self.source_subwords)?),
            ("target_subwords", vector(&self.target_subwords)?),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let partial = path.with_extension("partial");
        candle_core::safetensors::save(&tensors, &partial)?;
        std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))
    }

    /// Reads a cache file; `ids` are the sources' WordPiece ids, which it does not hold.
    fn load(path: &Path, ids: Vec<Vec<u32>>, device: &Device) -> Result<Self> {
        let mut tensors = candle_core::safetensors::load(path, device)?;
        let mut take = |name: &str| {
            tensors
                .remove(name)
                .with_context(|| format!("{} lacks {name}", path.display()))
        };
        Ok(Self {
            cls: take("cls")?,
            ids,
            wordpieces: take("wordpieces")?.to_vec1()?,
            source_subwords: take("source_subwords")?.to_vec1()?,
            target_subwords: take("target_subwords")?.to_vec1()?,
            bert_seconds: tensors
                .remove("bert_seconds")
                .map(|t| t.to_vec1::<f64>())
                .transpose()?
                .and_then(|v| v.first().copied())
                .filter(|s| s.is_finite()),
        })
    }
}

/// Hex sha256 of a file.
pub fn file_sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// The cache file of `pairs`' features under `dir`: its name hashes the pairs and `inputs`
/// (the hashes of the weights and tokenizers they are computed with).
pub fn cache_path(dir: &Path, split: &str, pairs: &[(String, String)], inputs: &[&str]) -> PathBuf {
    let mut hasher = Sha256::new();
    for input in inputs {
        hasher.update(input.as_bytes());
        hasher.update([0]);
    }
    for (en, es) in pairs {
        hasher.update(en.as_bytes());
        hasher.update([b'\t']);
        hasher.update(es.as_bytes());
        hasher.update([b'\n']);
    }
    let key = hex::encode(hasher.finalize());
    dir.join(format!("{split}-{}.safetensors", &key[..16]))
}

/// The features of `pairs`, read from `cache` if it exists, else computed and written there.
pub fn cached(
    cache: &Path,
    label: &str,
    pairs: &[(String, String)],
    encoders: &Encoders,
    batch_tokens: usize,
    progress: bool,
) -> Result<Features> {
    let device = encoders.bert.embeddings.word_embeddings.device().clone();
    if cache.exists() {
        let ids = pairs
            .iter()
            .map(|(en, _)| wordpiece_ids(&encoders.wordpiece, en))
            .collect::<Result<Vec<_>>>()?;
        let features = Features::load(cache, ids, &device)?;
        let consistent = features.len() == pairs.len()
            && (0..features.len())
                .all(|i| features.ids[i].len() == features.wordpieces[i] as usize + SPECIAL_TOKENS);
        if consistent {
            eprintln!("{label}: features from {}", cache.display());
            return Ok(features);
        }
    }
    let features = extract(label, pairs, encoders, batch_tokens, progress)?;
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir)?;
    }
    features.save(cache)?;
    Ok(features)
}

/// Padded `[rows, longest]` ids (u32) and 1/0 mask (f32) of `rows`.
pub fn pad_batch(rows: &[&[u32]], device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(rows.len() * width);
    let mut mask = Vec::with_capacity(rows.len() * width);
    for row in rows {
        ids.extend_from_slice(row);
        ids.resize(ids.len() + width - row.len(), 0);
        mask.extend((0..width).map(|i| if i < row.len() { 1f32 } else { 0.0 }));
    }
    Ok((
        Tensor::from_vec(ids, (rows.len(), width), device)?,
        Tensor::from_vec(mask, (rows.len(), width), device)?,
    ))
}

/// Batches of row indices, shortest first, with `rows * longest <= batch_tokens` (a single
/// row may exceed it).
fn length_batches(lengths: &[usize], batch_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut current = Vec::new();
    for i in order {
        // Sorted: this row is the longest so far.
        if !current.is_empty() && lengths[i] * (current.len() + 1) > batch_tokens {
            batches.push(std::mem::take(&mut current));
        }
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

fn progress_bar(label: &str, rows: usize, show: bool) -> Result<ProgressBar> {
    if !show {
        return Ok(ProgressBar::hidden());
    }
    let bar = ProgressBar::new(rows as u64);
    bar.set_style(ProgressStyle::with_template(
        "{elapsed_precise} {msg} {pos}/{len} sources {wide_bar} eta {eta}",
    )?);
    bar.set_message(label.to_string());
    Ok(bar)
}

/// Tokenizes `pairs` and runs the BERT over every source that fits its position table.
pub fn extract(
    label: &str,
    pairs: &[(String, String)],
    encoders: &Encoders,
    batch_tokens: usize,
    progress: bool,
) -> Result<Features> {
    let subwords = |text: &str| crate::tokenizer::encode_ids(&encoders.subword, text);
    let mut ids = Vec::with_capacity(pairs.len());
    let (mut source_subwords, mut target_subwords) = (Vec::new(), Vec::new());
    for (en, es) in pairs {
        ids.push(wordpiece_ids(&encoders.wordpiece, en)?);
        source_subwords.push(subwords(en)?.len() as u32);
        target_subwords.push(subwords(es)?.len() as u32);
    }
    let bert = &encoders.bert;
    let (hidden, max_positions) = (bert.config.hidden_size, bert.config.max_position_embeddings);
    let device = bert.embeddings.word_embeddings.device().clone();
    let fits: Vec<usize> = (0..ids.len())
        .filter(|&i| ids[i].len() <= max_positions)
        .collect();
    let lengths: Vec<usize> = fits.iter().map(|&i| ids[i].len()).collect();
    let mut cls = vec![0f32; ids.len() * hidden];
    let bar = progress_bar(label, fits.len(), progress)?;
    for batch in length_batches(&lengths, batch_tokens) {
        let rows: Vec<usize> = batch.iter().map(|&j| fits[j]).collect();
        let slices: Vec<&[u32]> = rows.iter().map(|&i| ids[i].as_slice()).collect();
        let (batch_ids, mask) = pad_batch(&slices, &device)?;
        let vectors = bert.cls(&batch_ids, &mask)?.to_vec2::<f32>()?;
        for (&i, vector) in rows.iter().zip(vectors) {
            cls[i * hidden..(i + 1) * hidden].copy_from_slice(&vector);
        }
        bar.inc(rows.len() as u64);
    }
    bar.finish_and_clear();
    eprintln!(
        "{label}: {} sources through the BERT in {:.0} s ({} too long for it)",
        fits.len(),
        bar.elapsed().as_secs_f64(),
        ids.len() - fits.len()
    );
    Ok(Features {
        cls: Tensor::from_vec(cls, (ids.len(), hidden), &device)?,
        wordpieces: ids
            .iter()
            .map(|r| r.len().saturating_sub(SPECIAL_TOKENS) as u32)
            .collect(),
        ids,
        source_subwords,
        target_subwords,
        bert_seconds: Some(bar.elapsed().as_secs_f64()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_hold_the_token_budget_and_every_row_once() {
        let lengths = [5, 1, 9, 3, 3, 20];
        let batches = length_batches(&lengths, 10);
        let mut seen: Vec<usize> = batches.concat();
        seen.sort();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for batch in &batches {
            let longest = batch.iter().map(|&i| lengths[i]).max().unwrap();
            assert!(batch.len() == 1 || longest * batch.len() <= 10, "{batch:?}");
        }
    }

    #[test]
    fn padding_is_trailing_zeros_under_a_zero_mask() {
        let (ids, mask) = pad_batch(&[&[7, 8, 9], &[4]], &Device::Cpu).unwrap();
        assert_eq!(ids.to_vec2::<u32>().unwrap(), [[7, 8, 9], [4, 0, 0]]);
        assert_eq!(
            mask.to_vec2::<f32>().unwrap(),
            [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
        );
    }
}
