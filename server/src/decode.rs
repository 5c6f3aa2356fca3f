//! Greedy decoding with the KV cache, for one batch of sentences that start together.
//!
//! Every step feeds one token per live row; the backend carries the cache (the
//! `past.*`/`present.*` state) between steps. A row stops at EOS or at its own length
//! budget, and finished rows are dropped from the batch before the next step, so a short
//! sentence batched with a long one costs nothing once it is done.

use ndarray::ArrayView1;

use crate::backend::{Backend, BackendError};

/// The token ids the loop itself needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: u32,
    pub eos: u32,
}

/// One sentence to translate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeInput {
    /// Source token ids, EOS included, no padding.
    pub source_ids: Vec<i64>,
    /// At most this many tokens are generated (EOS included); 0 generates nothing.
    pub max_output_tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced EOS.
    Eos,
    /// The row reached its `max_output_tokens` without EOS.
    MaxLength,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeOutput {
    /// Generated ids, EOS excluded.
    pub ids: Vec<u32>,
    pub stop: StopReason,
}

/// Decodes `inputs` together and returns one output per input, in input order.
pub fn greedy_decode<B: Backend>(
    backend: &mut B,
    special: SpecialIds,
    inputs: &[DecodeInput],
) -> Result<Vec<DecodeOutput>, BackendError> {
    let mut outputs: Vec<DecodeOutput> = inputs
        .iter()
        .map(|_| DecodeOutput {
            ids: Vec::new(),
            stop: StopReason::MaxLength,
        })
        .collect();
    // `active[r]` is the input index of row `r`.
    let mut active: Vec<usize> = (0..inputs.len())
        .filter(|&i| inputs[i].max_output_tokens > 0)
        .collect();
    if active.is_empty() {
        return Ok(outputs);
    }
    let sources: Vec<&[i64]> = active
        .iter()
        .map(|&i| inputs[i].source_ids.as_slice())
        .collect();
    let mut rows = backend.encode(&sources)?;
    let mut target_ids = vec![i64::from(special.bos); active.len()];
    let mut positions = vec![0i64; active.len()];

    loop {
        let logits = backend.step(&mut rows, &target_ids, &positions)?;
        if logits.nrows() != active.len() {
            return Err(BackendError::Contract(format!(
                "logits have {} rows for a batch of {}",
                logits.nrows(),
                active.len()
            )));
        }
        let mut keep = Vec::with_capacity(active.len());
        for (row, &input) in active.iter().enumerate() {
            let next = argmax(logits.row(row));
            let output = &mut outputs[input];
            if next == special.eos {
                output.stop = StopReason::Eos;
            } else {
                output.ids.push(next);
                if output.ids.len() < inputs[input].max_output_tokens {
                    keep.push(row);
                }
            }
        }
        if keep.is_empty() {
            return Ok(outputs);
        }
        if keep.len() < active.len() {
            backend.retain_rows(&mut rows, &keep)?;
        }
        positions = keep.iter().map(|&row| positions[row] + 1).collect();
        active = keep.iter().map(|&row| active[row]).collect();
        target_ids = active
            .iter()
            .map(|&input| i64::from(*outputs[input].ids.last().expect("kept rows have output")))
            .collect();
    }
}

/// Index of the largest logit; NaNs never win (an all-NaN row gives 0).
pub fn argmax(logits: ArrayView1<'_, f32>) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best as u32
}

#[cfg(test)]
pub(crate) mod testing {
    //! A pure-Rust backend with the dev package's semantics: it copies the source (step `p`
    //! emits `source[p]`, so EOS comes right after the last word) and checks its own KV cache
    //! at every step, failing loudly if the loop fed it the wrong token, position or rows.

    use super::*;
    use ndarray::Array2;

    pub const VOCAB: usize = 34;
    pub const SPECIAL: SpecialIds = SpecialIds { bos: 1, eos: 2 };

    pub struct CopyRows {
        sources: Vec<Vec<i64>>,
        /// Tokens fed so far, per row (the "KV cache").
        cache: Vec<Vec<i64>>,
    }

    #[derive(Default)]
    pub struct CopyBackend {
        /// Batch size of every step, for asserting that finished rows leave the batch.
        pub step_sizes: Vec<usize>,
        /// Fail the next step (error-path tests).
        pub fail: bool,
    }

    impl Backend for CopyBackend {
        type Rows = CopyRows;

        fn encode(&mut self, sources: &[&[i64]]) -> Result<CopyRows, BackendError> {
            Ok(CopyRows {
                sources: sources.iter().map(|s| s.to_vec()).collect(),
                cache: vec![Vec::new(); sources.len()],
            })
        }

        fn step(
            &mut self,
            rows: &mut CopyRows,
            target_ids: &[i64],
            positions: &[i64],
        ) -> Result<Array2<f32>, BackendError> {
            if self.fail {
                return Err(BackendError::Inference("injected failure".into()));
            }
            let n = rows.sources.len();
            assert_eq!(target_ids.len(), n);
            assert_eq!(positions.len(), n);
            self.step_sizes.push(n);
            let mut logits = Array2::zeros((n, VOCAB));
            for r in 0..n {
                let p = positions[r] as usize;
                let source = &rows.sources[r];
                // The cache holds exactly the tokens fed at positions 0..p.
                let mut expected: Vec<i64> = vec![SPECIAL.bos.into()];
                expected.extend(source.iter().take(p.saturating_sub(1)));
                expected.truncate(p);
                assert_eq!(rows.cache[r], expected, "row {r} cache at position {p}");
                let expected_token = if p == 0 {
                    i64::from(SPECIAL.bos)
                } else {
                    source[p - 1]
                };
                assert_eq!(target_ids[r], expected_token, "row {r} fed token");
                rows.cache[r].push(target_ids[r]);
                let next = source.get(p).copied().unwrap_or(0) as usize;
                logits[[r, next]] = 10.0;
            }
            Ok(logits)
        }

        fn retain_rows(&mut self, rows: &mut CopyRows, keep: &[usize]) -> Result<(), BackendError> {
            rows.sources = keep.iter().map(|&r| rows.sources[r].clone()).collect();
            rows.cache = keep.iter().map(|&r| rows.cache[r].clone()).collect();
            Ok(())
        }
    }

    /// A manifest describing the dev package (two states: a 4-D KV cache and a 2-D mask).
    pub fn manifest() -> model_package::Manifest {
        use model_package::{Dim, Limits, ModelConfig, StateSpec};
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
                    name: "self_mask".into(),
                    dims: vec![Dim::Batch, Dim::Time],
                },
            ],
            limits: Limits {
                max_source_tokens: Some(64),
                max_target_tokens: 64,
            },
            files: Default::default(),
            training: serde_json::Value::Null,
            evaluation: serde_json::Value::Null,
        }
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
}

#[cfg(test)]
mod tests {
    use super::testing::{CopyBackend, SPECIAL};
    use super::*;
    use ndarray::array;

    fn input(words: &[i64], max: usize) -> DecodeInput {
        let mut source_ids = words.to_vec();
        source_ids.push(SPECIAL.eos.into());
        DecodeInput {
            source_ids,
            max_output_tokens: max,
        }
    }

    #[test]
    fn copies_every_row_and_retires_finished_rows() {
        let mut backend = CopyBackend::default();
        let inputs = [
            input(&[4, 5, 6], 20),
            input(&[7], 20),
            input(&[8, 9, 10, 11, 12], 20),
        ];
        let out = greedy_decode(&mut backend, SPECIAL, &inputs).unwrap();
        assert_eq!(out[0].ids, vec![4, 5, 6]);
        assert_eq!(out[1].ids, vec![7]);
        assert_eq!(out[2].ids, vec![8, 9, 10, 11, 12]);
        assert!(out.iter().all(|o| o.stop == StopReason::Eos));
        // Row 1 leaves after step 1 (EOS), row 0 after step 3, row 2 after step 5.
        assert_eq!(backend.step_sizes, vec![3, 3, 2, 2, 1, 1]);
    }

    #[test]
    fn stops_at_the_length_budget() {
        let mut backend = CopyBackend::default();
        let inputs = [input(&[4, 5, 6, 7], 2), input(&[8], 5), input(&[9], 0)];
        let out = greedy_decode(&mut backend, SPECIAL, &inputs).unwrap();
        assert_eq!(out[0].ids, vec![4, 5]);
        assert_eq!(out[0].stop, StopReason::MaxLength);
        assert_eq!(out[1].ids, vec![8]);
        assert_eq!(out[1].stop, StopReason::Eos);
        // A zero budget never enters the batch.
        assert_eq!(out[2].ids, Vec::<u32>::new());
        assert_eq!(backend.step_sizes, vec![2, 2]);
    }

    #[test]
    fn empty_batch_runs_nothing() {
        let mut backend = CopyBackend::default();
        assert!(greedy_decode(&mut backend, SPECIAL, &[])
            .unwrap()
            .is_empty());
        assert!(backend.step_sizes.is_empty());
    }

    #[test]
    fn backend_errors_propagate() {
        let mut backend = CopyBackend {
            fail: true,
            ..Default::default()
        };
        let err = greedy_decode(&mut backend, SPECIAL, &[input(&[4], 3)]).unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
    }

    #[test]
    fn argmax_ignores_nan_and_prefers_the_first_maximum() {
        assert_eq!(argmax(array![0.0, 3.0, f32::NAN, 3.0].view()), 1);
        assert_eq!(argmax(array![f32::NAN, f32::NAN].view()), 0);
        assert_eq!(argmax(array![-5.0, -1.0].view()), 1);
    }
}
