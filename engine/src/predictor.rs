//! The learned length predictor of a package (a BERT encoder with a regression head, in its
//! own ONNX graph and with its own WordPiece tokenizer): the natural target length of a
//! source, which `"auto"` asks for and a length-aware decoder is fed by default.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use model_package::{manifest::sha256_file, names, LengthPredictorSpec};
use ort::environment::Environment;
use ort::session::Session;
use ort::value::Tensor;
use tokenizers::Tokenizer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::memory;
use crate::onnx::{session_builder, CpuMemory, SessionOptions};

/// Most requests waiting for the predictor before more are refused (429): little next to a
/// request's decoding, and a lexical predictor's 32 turns take milliseconds.
pub const PREDICTOR_QUEUE_LIMIT: usize = 32;

pub struct LengthPredictor {
    // ONNX Runtime runs one call at a time per session here; predictions are short next to
    // decoding, so requests share it rather than each model worker owning one.
    session: Mutex<Session>,
    /// Requests take turns here, asynchronously, before they take a blocking thread to run
    /// the session: see [`LengthPredictor::turn_unless_busy`].
    turns: Turns,
    tokenizer: Tokenizer,
    max_input_tokens: usize,
}

/// Why a package's predictor was not loaded although the manifest lists one.
#[derive(Debug, thiserror::Error)]
pub enum PredictorError {
    /// Its pretrained files are not installed next to the package: serve without it.
    #[error(
        "{path} is missing ({source_hint}); install it with scripts/install-length-predictor.sh"
    )]
    NotInstalled { path: String, source_hint: String },
    /// Installed but wrong, or the graph does not load: a broken package.
    #[error(transparent)]
    Broken(#[from] anyhow::Error),
}

impl LengthPredictor {
    /// Opens the predictor of the package in `dir`, after checking that every external file
    /// it reads is installed and is the file it was exported against.
    pub fn load(
        env: &Environment,
        dir: &Path,
        spec: &LengthPredictorSpec,
        options: &SessionOptions,
    ) -> Result<Self, PredictorError> {
        for file in &spec.external_files {
            let path = dir.join(&file.path);
            if !path.is_file() {
                return Err(PredictorError::NotInstalled {
                    path: path.display().to_string(),
                    source_hint: file.source.clone(),
                });
            }
            let actual = sha256_file(&path).map_err(anyhow::Error::from)?;
            if actual != file.sha256 {
                return Err(anyhow!(
                    "{}: sha256 {actual} is not the {} the predictor was exported against ({})",
                    path.display(),
                    file.sha256,
                    file.source
                )
                .into());
            }
        }
        let tokenizer_path = dir.join(&spec.tokenizer);
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| anyhow!("loading {}: {e}", tokenizer_path.display()))?;
        // `[SEP]` in user text is text; the tokenizer's post-processor adds the real ones.
        tokenizer.set_encode_special_tokens(true);
        // Pretrained tokenizer files often pad every text to a fixed length and truncate long
        // ones (all-MiniLM-L6-v2's: 128): padding here would count as tokens, and a truncated
        // text would be predicted from its first part. Batches are padded below, with a mask;
        // texts too long for the predictor get the linear fit.
        tokenizer
            .with_truncation(None)
            .map_err(|e| anyhow!("{}: {e}", tokenizer_path.display()))?;
        tokenizer.with_padding(None);
        let graph = dir.join(&spec.graph);
        let (mut builder, _) = session_builder(env, options, CpuMemory::PerRun)?;
        let session = builder
            .commit_from_file(&graph)
            .map_err(|e| anyhow!("{}: ONNX Runtime cannot load it: {e}", graph.display()))?;
        let has = |ports: &[ort::value::Outlet], name: &str| ports.iter().any(|p| p.name() == name);
        for input in [names::PREDICTOR_INPUT_IDS, names::PREDICTOR_ATTENTION_MASK] {
            if !has(session.inputs(), input) {
                return Err(anyhow!("{} has no input `{input}`", graph.display()).into());
            }
        }
        if !has(session.outputs(), names::PREDICTED_LENGTHS) {
            return Err(anyhow!(
                "{} has no output `{}`",
                graph.display(),
                names::PREDICTED_LENGTHS
            )
            .into());
        }
        Ok(LengthPredictor {
            session: Mutex::new(session),
            turns: Turns::new(),
            tokenizer,
            max_input_tokens: spec.max_input_tokens,
        })
    }

    /// Waits, without holding a thread, until the session is free for the caller, who holds
    /// it until the permit drops; `None` at once when [`PREDICTOR_QUEUE_LIMIT`] callers are
    /// already waiting, and the caller should refuse (planning with the linear fit instead would
    /// make a text's translation depend on the load).
    ///
    /// A blocking thread that waited on the session's lock instead could not be taken back: a
    /// flood of requests whose clients then left kept up to the runtime's 512 blocking threads
    /// and a queue of predictions nobody would read. And the queue has to stay short because
    /// it comes before admission: under an open-loop overload (`nmt-bench overload` at 10x)
    /// requests waited out their whole timeout here, at 100-140 predictions a second, before
    /// the scheduler could refuse them at the door.
    pub async fn turn_unless_busy(&self) -> Option<OwnedSemaphorePermit> {
        self.turns.take_unless_queued(PREDICTOR_QUEUE_LIMIT).await
    }

    /// Callers waiting for a turn.
    pub fn waiting(&self) -> usize {
        self.turns.waiting.load(Ordering::SeqCst)
    }

    /// The predicted target length of each text (target subwords, EOS not counted,
    /// unrounded); `None` for a text longer than the predictor takes.
    pub fn predict(&self, texts: &[&str]) -> anyhow::Result<Vec<Option<f64>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| anyhow!("tokenizing for the length predictor: {e}"))?;
        let fits: Vec<usize> = (0..texts.len())
            .filter(|&i| encodings[i].get_ids().len() <= self.max_input_tokens)
            .collect();
        let mut predictions = vec![None; texts.len()];
        let lengths: Vec<usize> = fits.iter().map(|&i| encodings[i].get_ids().len()).collect();
        // Runs of at most one maximal text's attention (the predictor's own input limit is
        // far below the encoder's, and its BERT has three times the heads).
        let pairs_per_run = memory::pairs(1, self.max_input_tokens);
        for piece in memory::pieces(&lengths, pairs_per_run) {
            let rows: Vec<&[u32]> = fits[piece.clone()]
                .iter()
                .map(|&i| encodings[i].get_ids())
                .collect();
            let predicted = self.run(&rows);
            let len = rows.iter().map(|r| r.len()).max().unwrap_or(1);
            memory::after_run(memory::pairs(rows.len(), len));
            for (&i, &p) in fits[piece].iter().zip(&predicted?) {
                // Hundredths: padding in a batch moves the float in its last digits, and a
                // text's prediction (and the length planned from it) should not depend on its
                // neighbours.
                let p = (f64::from(p.max(1.0)) * 100.0).round() / 100.0;
                predictions[i] = p.is_finite().then_some(p);
            }
        }
        Ok(predictions)
    }

    /// One run of the predictor over `rows` of token ids, padded to the longest: a length per
    /// row. Every tensor of the run is dropped when this returns.
    fn run(&self, rows: &[&[u32]]) -> anyhow::Result<Vec<f32>> {
        let len = rows.iter().map(|r| r.len()).max().unwrap_or(1).max(1);
        let mut ids = vec![0i64; rows.len() * len];
        let mut mask = vec![0i64; rows.len() * len];
        for (row, row_ids) in rows.iter().enumerate() {
            for (col, &id) in row_ids.iter().enumerate() {
                ids[row * len + col] = i64::from(id);
                mask[row * len + col] = 1;
            }
        }
        let shape = [rows.len(), len];
        let ids = Tensor::from_array((shape, ids))?;
        let mask = Tensor::from_array((shape, mask))?;
        let mut session = self
            .session
            .lock()
            .map_err(|_| anyhow!("the length predictor session is poisoned"))?;
        let outputs = session
            .run(ort::inputs! {
                names::PREDICTOR_INPUT_IDS => ids,
                names::PREDICTOR_ATTENTION_MASK => mask,
            })
            .context("running the length predictor")?;
        let (_, lengths) = outputs[names::PREDICTED_LENGTHS].try_extract_tensor::<f32>()?;
        if lengths.len() != rows.len() {
            bail!(
                "the length predictor returned {} lengths for {} texts",
                lengths.len(),
                rows.len()
            );
        }
        Ok(lengths.to_vec())
    }
}

/// Turns at a resource one caller at a time, with the number of callers waiting for one.
struct Turns {
    semaphore: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// Counts a caller out of the waiting ones however it stops waiting (its turn came, or its
/// future was dropped because the client left).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Turns {
    fn new() -> Self {
        Turns {
            semaphore: Arc::new(Semaphore::new(1)),
            waiting: AtomicUsize::new(0),
        }
    }

    /// A turn, or `None` at once when `limit` callers are already waiting.
    async fn take_unless_queued(&self, limit: usize) -> Option<OwnedSemaphorePermit> {
        let ahead = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        if ahead >= limit {
            return None;
        }
        Some(
            self.semaphore
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn until_waiting(turns: &Turns, n: usize) {
        while turns.waiting.load(Ordering::SeqCst) != n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn callers_past_the_limit_are_turned_away_at_once_and_the_rest_are_served() {
        let turns = Arc::new(Turns::new());
        let held = turns.take_unless_queued(2).await.expect("a free turn");
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let turns = turns.clone();
                tokio::spawn(async move { turns.take_unless_queued(2).await.is_some() })
            })
            .collect();
        until_waiting(&turns, 2).await;
        assert!(
            turns.take_unless_queued(2).await.is_none(),
            "a third waiter"
        );
        assert_eq!(turns.waiting.load(Ordering::SeqCst), 2);

        // A waiter whose client leaves gives its place back.
        let leaving = {
            let turns = turns.clone();
            tokio::spawn(async move { turns.take_unless_queued(3).await })
        };
        until_waiting(&turns, 3).await;
        leaving.abort();
        until_waiting(&turns, 2).await;

        drop(held);
        for waiter in waiters {
            assert!(waiter.await.unwrap(), "each waiter got its turn");
        }
        assert_eq!(turns.waiting.load(Ordering::SeqCst), 0);
    }
}
