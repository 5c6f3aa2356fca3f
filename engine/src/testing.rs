//! Test doubles for the engine's own tests and for crates that drive it without ONNX
//! Runtime (the server's scheduler and service tests): a pure-Rust [`Backend`], the dev
//! package's manifest and tokenizers.
//!
//! Compiled for the crate's unit tests and with the `testing` feature; a release build has
//! none of it.
//!
//! [`CopyBackend`] has the dev package's semantics: it copies the source (step `p` emits
//! `source[p]`, so EOS comes right after the last word) and checks its own KV cache at every
//! step, failing loudly if the loop fed it the wrong token, position or rows.

use std::path::PathBuf;

use model_package::ModelConfig;
use ndarray::Array2;
use tokenizers::Tokenizer;

use crate::backend::{Backend, BackendError};
use crate::decode::SpecialIds;

pub const VOCAB: usize = 34;
pub const SPECIAL: SpecialIds = SpecialIds { bos: 1, eos: 2 };

#[derive(Default)]
pub struct CopyRows {
    sources: Vec<Vec<i64>>,
    /// Tokens fed so far, per row (the "KV cache").
    cache: Vec<Vec<i64>>,
    ghost: Vec<bool>,
    /// The loop fed this row something other than the copy (an n-gram ban passed over it).
    off_script: Vec<bool>,
}

pub struct CopyBackend {
    /// Batch size of every step, for asserting that finished rows leave the batch.
    pub step_sizes: Vec<usize>,
    /// The `target_lengths` of every step.
    pub target_lengths: Vec<Vec<i64>>,
    /// Fail every step (error-path tests).
    pub fail: bool,
    /// Fail only the step with this number (1 for the first this backend runs): a session
    /// that errors mid-batch once and then works again.
    pub fail_on_step: Option<usize>,
    /// Steps run so far, failed ones included.
    pub steps: usize,
    /// Rows of every encoder run, in order.
    pub encoder_runs: Vec<usize>,
    /// Time each step takes (timeout and queueing tests).
    pub step_delay: std::time::Duration,
    /// Columns of the logits: at least the tokenizer's vocabulary, since the copy emits
    /// source ids.
    pub vocab: usize,
    /// Rows may be fed something other than the copy, as `no_repeat_ngram_size` makes the
    /// loop do when the text repeats itself; such a row's cache is then no longer checked
    /// against its source. Off, a row fed anything but its copy fails the step's assertion.
    pub follows_bans: bool,
    /// What [`Backend::encoder_busy`] says: another worker's turn at a shared encoder.
    pub encoder_busy: bool,
}

impl Default for CopyBackend {
    fn default() -> Self {
        CopyBackend {
            step_sizes: Vec::new(),
            target_lengths: Vec::new(),
            fail: false,
            fail_on_step: None,
            steps: 0,
            encoder_runs: Vec::new(),
            step_delay: std::time::Duration::ZERO,
            vocab: VOCAB,
            follows_bans: false,
            encoder_busy: false,
        }
    }
}

impl Backend for CopyBackend {
    type Rows = CopyRows;
    type Encoded = CopyRows;

    fn encode(&mut self, sources: &[&[i64]]) -> Result<CopyRows, BackendError> {
        self.encoder_runs.push(sources.len());
        Ok(CopyRows {
            sources: sources.iter().map(|s| s.to_vec()).collect(),
            cache: vec![Vec::new(); sources.len()],
            ghost: vec![false; sources.len()],
            off_script: vec![false; sources.len()],
        })
    }

    fn split(&self, encoded: CopyRows) -> Vec<CopyRows> {
        encoded
            .sources
            .into_iter()
            .map(|source| CopyRows {
                sources: vec![source],
                cache: vec![Vec::new()],
                ghost: vec![false],
                off_script: vec![false],
            })
            .collect()
    }

    fn step(
        &mut self,
        rows: &mut CopyRows,
        target_ids: &[i64],
        positions: &[i64],
        target_lengths: &[i64],
    ) -> Result<Array2<f32>, BackendError> {
        self.steps += 1;
        if self.fail {
            return Err(BackendError::Inference("injected failure".into()));
        }
        if self.fail_on_step == Some(self.steps) {
            return Err(BackendError::Inference(format!(
                "injected failure at step {}",
                self.steps
            )));
        }
        std::thread::sleep(self.step_delay);
        let n = rows.sources.len();
        assert_eq!(target_ids.len(), n);
        assert_eq!(positions.len(), n);
        assert_eq!(target_lengths.len(), n);
        self.step_sizes.push(n);
        self.target_lengths.push(target_lengths.to_vec());
        let mut logits = Array2::zeros((n, self.vocab.max(VOCAB)));
        for r in 0..n {
            // A row fed EOS is a ghost (finished, awaiting compaction): nothing to check.
            if target_ids[r] == i64::from(SPECIAL.eos) || rows.ghost[r] {
                rows.ghost[r] = true;
                continue;
            }
            let p = positions[r] as usize;
            let source = &rows.sources[r];
            // The cache holds exactly the tokens fed at positions 0..p; while the row
            // copies its source they are BOS and the source words. (Past the source, a
            // length constraint that bans EOS makes the loop feed other tokens.)
            assert_eq!(rows.cache[r].len(), p, "row {r} cache length");
            if p < source.len() && !rows.off_script[r] {
                let mut expected: Vec<i64> = vec![SPECIAL.bos.into()];
                expected.extend(&source[..p.saturating_sub(1)]);
                expected.truncate(p);
                assert_eq!(rows.cache[r], expected, "row {r} cache at position {p}");
                let fed = if p == 0 {
                    SPECIAL.bos.into()
                } else {
                    source[p - 1]
                };
                if self.follows_bans && target_ids[r] != fed {
                    rows.off_script[r] = true;
                } else {
                    assert_eq!(target_ids[r], fed, "row {r} fed token");
                }
            }
            rows.cache[r].push(target_ids[r]);
            let next = source.get(p).copied().unwrap_or(0) as usize;
            logits[[r, next]] = 10.0;
        }
        Ok(logits)
    }

    fn place(
        &mut self,
        rows: &mut CopyRows,
        new: CopyRows,
        slots: &[usize],
    ) -> Result<(), BackendError> {
        assert_eq!(new.sources.len(), slots.len());
        let width = slots
            .iter()
            .map(|&s| s + 1)
            .max()
            .unwrap_or(0)
            .max(rows.sources.len());
        rows.sources.resize(width, Vec::new());
        rows.cache.resize(width, Vec::new());
        // A slot nobody filled would be a hole the loop does not know about.
        let mut filled = vec![true; width];
        filled[rows.ghost.len()..].fill(false);
        rows.ghost.resize(width, true);
        rows.off_script.resize(width, false);
        for (source, &slot) in new.sources.into_iter().zip(slots) {
            rows.sources[slot] = source;
            rows.cache[slot] = Vec::new();
            rows.ghost[slot] = false;
            rows.off_script[slot] = false;
            filled[slot] = true;
        }
        assert!(filled.iter().all(|&f| f), "slots {slots:?} leave a hole");
        Ok(())
    }

    fn move_row(
        &mut self,
        rows: &mut CopyRows,
        from: usize,
        to: usize,
    ) -> Result<(), BackendError> {
        rows.sources[to] = rows.sources[from].clone();
        rows.cache[to] = rows.cache[from].clone();
        rows.ghost[to] = rows.ghost[from];
        rows.off_script[to] = rows.off_script[from];
        Ok(())
    }

    fn truncate(&mut self, rows: &mut CopyRows, width: usize) -> Result<(), BackendError> {
        rows.sources.truncate(width);
        rows.cache.truncate(width);
        rows.ghost.truncate(width);
        rows.off_script.truncate(width);
        Ok(())
    }

    fn encoder_busy(&self) -> bool {
        self.encoder_busy
    }
}

/// A manifest describing the dev package (two states: a 4-D KV cache and a 2-D state carried
/// whole).
pub fn manifest() -> model_package::Manifest {
    use model_package::{Dim, Limits, StateSpec};
    model_package::Manifest {
        format_version: model_package::manifest::FORMAT_VERSION,
        name: "dev-copy".into(),
        source_language: "en".into(),
        target_language: "es".into(),
        config: ModelConfig::preset("transformer-tiny", VOCAB).unwrap(),
        pad_id: 0,
        bos_id: SPECIAL.bos,
        eos_id: SPECIAL.eos,
        unk_id: 3,
        decoder_state: vec![
            StateSpec {
                name: "self_key.0".into(),
                dims: vec![Dim::Batch, Dim::Fixed(2), Dim::Time, Dim::Fixed(4)],
            },
            StateSpec {
                name: "position_rnn.h".into(),
                dims: vec![Dim::Batch, Dim::Fixed(4)],
            },
        ],
        limits: Limits {
            max_source_tokens: Some(64),
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
    }
}

/// The tokenizer of the shipped model package (`models/en-es-rel-ldpe/tokenizer.json`, an
/// 8000-piece Unigram model).
pub fn shipped_tokenizer() -> Tokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/en-es-rel-ldpe")
        .join(model_package::files::TOKENIZER);
    Tokenizer::from_file(&path)
        .unwrap_or_else(|e| panic!("the shipped tokenizer {}: {e}", path.display()))
}

/// Tokenizer matching the copy model's vocabulary (the dev package's `tokenizer.json`).
pub fn tokenizer() -> tokenizers::Tokenizer {
    let words = "hello world the cat sat on mat a dog runs fast slow red blue green house \
                 tree sun moon star one two three four five six seven eight nine ten";
    let specials = ["<pad>", "<s>", "</s>", "<unk>"];
    let vocab: serde_json::Map<String, serde_json::Value> = specials
        .iter()
        .copied()
        .chain(words.split_whitespace())
        .enumerate()
        .map(|(i, t)| (t.to_string(), i.into()))
        .collect();
    assert_eq!(vocab.len(), VOCAB);
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    json.to_string().parse().expect("test tokenizer")
}
