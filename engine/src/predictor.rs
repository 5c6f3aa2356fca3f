//! The learned length predictor of a package: the natural target length of a source, which
//! `"auto"` asks for and a length-aware decoder is fed by default. Either a graph of its own
//! with its own WordPiece tokenizer (a BERT with a regression head, or its lexical table), or
//! a head on the translation model's own encoder states, an output of the encoder graph read
//! from the encoder inputs the pipeline already built.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use model_package::{manifest::sha256_file, names, LengthPredictorSpec, PredictorGraph};
use ort::environment::Environment;
use ort::session::{OutputSelector, Session};
use ort::value::Tensor;
use tokenizers::Tokenizer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::memory;
use crate::onnx::{
    open_session, padded_sources, whole_input_run_options, RunPattern, SessionOptions,
};

/// Most requests waiting for a neural predictor (a BERT, a head on the encoder) before more
/// are refused (429): the queue comes before admission, so it must stay short next to a
/// request's timeout (a quarter of a second of BERT predictions).
pub const PREDICTOR_QUEUE_LIMIT: usize = 32;

/// The same for a table lookup (lexical or subword table), whose turn is a thread handoff
/// and a lookup: 64 clients arriving at once filled a queue of 32, and 17 of their 461
/// requests were refused.
pub const LOOKUP_QUEUE_LIMIT: usize = 1024;

pub struct LengthPredictor {
    // ONNX Runtime runs one call at a time per session here; predictions are short next to
    // decoding, so requests share it rather than each model worker owning one.
    session: Mutex<Session>,
    /// Requests take turns here, asynchronously, before they take a blocking thread to run
    /// the session: see [`LengthPredictor::turn_unless_busy`].
    turns: Turns,
    reads: PredictorInput,
    max_input_tokens: usize,
    /// Most callers that may wait for a turn.
    queue_limit: usize,
}

/// What the predictor's graph is fed.
enum PredictorInput {
    /// The text in its own tokenizer's ids with their special tokens, and an i64 mask.
    Text(Box<Tokenizer>),
    /// The encoder's inputs (the text's subword ids, EOS appended) and its float mask: a head
    /// on the encoder (its output alone is computed) or a table of the package's subwords.
    EncoderIds { pad_id: i64 },
}

/// A text to predict the length of, as the pipeline has it.
#[derive(Clone, Copy, Debug)]
pub struct SourceText<'a> {
    pub text: &'a str,
    /// Encoder input (placeholders masked, EOS appended).
    pub source_ids: &'a [i64],
    /// Subwords of the text (EOS not counted).
    pub source_tokens: usize,
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
    /// it reads is installed and is the file it was exported against. `pad_id` pads the
    /// encoder's inputs for a head on the encoder.
    pub fn load(
        env: &Environment,
        dir: &Path,
        spec: &LengthPredictorSpec,
        pad_id: i64,
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
        let reads = match spec.computes {
            PredictorGraph::Encoder | PredictorGraph::SubwordTable => {
                PredictorInput::EncoderIds { pad_id }
            }
            PredictorGraph::Bert | PredictorGraph::Lexical => {
                PredictorInput::Text(Box::new(text_tokenizer(&dir.join(&spec.tokenizer))?))
            }
        };
        let graph = dir.join(&spec.graph);
        let session = open_session(env, options, RunPattern::OncePerText, &graph)?.session;
        let has = |ports: &[ort::value::Outlet], name: &str| ports.iter().any(|p| p.name() == name);
        let inputs = match reads {
            PredictorInput::Text(_) => {
                [names::PREDICTOR_INPUT_IDS, names::PREDICTOR_ATTENTION_MASK]
            }
            PredictorInput::EncoderIds { .. } => [names::SOURCE_IDS, names::SOURCE_MASK],
        };
        for input in inputs {
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
            reads,
            max_input_tokens: spec.max_input_tokens,
            queue_limit: match spec.computes {
                PredictorGraph::Bert | PredictorGraph::Encoder => PREDICTOR_QUEUE_LIMIT,
                PredictorGraph::Lexical | PredictorGraph::SubwordTable => LOOKUP_QUEUE_LIMIT,
            },
        })
    }

    /// Waits, without holding a thread, until the session is free for the caller, who holds
    /// it until the permit drops; `None` at once when [`LengthPredictor::queue_limit`] callers
    /// are already waiting, and the caller should refuse (planning with the linear fit instead would
    /// make a text's translation depend on the load).
    ///
    /// A blocking thread that waited on the session's lock instead could not be taken back: a
    /// flood of requests whose clients then left kept up to the runtime's 512 blocking threads
    /// and a queue of predictions nobody would read. And the queue has to stay short because
    /// it comes before admission: under an open-loop overload (`nmt-bench overload` at 10x)
    /// requests waited out their whole timeout here, at 100-140 predictions a second, before
    /// the scheduler could refuse them at the door.
    pub async fn turn_unless_busy(&self) -> Option<OwnedSemaphorePermit> {
        self.turns.take_unless_queued(self.queue_limit).await
    }

    /// Most callers that may wait for a turn ([`PREDICTOR_QUEUE_LIMIT`] for a neural network,
    /// [`LOOKUP_QUEUE_LIMIT`] for a table).
    pub fn queue_limit(&self) -> usize {
        self.queue_limit
    }

    /// Callers waiting for a turn.
    pub fn waiting(&self) -> usize {
        self.turns.waiting.load(Ordering::SeqCst)
    }

    /// The predicted target length of each text (target subwords, EOS not counted,
    /// unrounded); `None` for a text longer than the predictor takes.
    pub fn predict(&self, texts: &[SourceText]) -> anyhow::Result<Vec<Option<f64>>> {
        let rows: Vec<Vec<i64>> = match &self.reads {
            PredictorInput::Text(tokenizer) => tokenizer
                .encode_batch(texts.iter().map(|t| t.text).collect(), true)
                .map_err(|e| anyhow!("tokenizing for the length predictor: {e}"))?
                .iter()
                .map(|e| e.get_ids().iter().map(|&id| i64::from(id)).collect())
                .collect(),
            PredictorInput::EncoderIds { .. } => {
                texts.iter().map(|t| t.source_ids.to_vec()).collect()
            }
        };
        let fits: Vec<usize> = (0..texts.len())
            .filter(|&i| rows[i].len() <= self.max_input_tokens)
            .collect();
        let mut predictions = vec![None; texts.len()];
        let lengths: Vec<usize> = fits.iter().map(|&i| rows[i].len()).collect();
        // Runs of at most one maximal text's attention (a BERT's input limit is far below the
        // encoder's, and it has three times the heads); the encoder's head runs in the
        // encoder's own pieces.
        let pairs_per_run = match self.reads {
            PredictorInput::Text(_) => memory::pairs(1, self.max_input_tokens),
            PredictorInput::EncoderIds { .. } => memory::PAIRS_PER_RUN,
        };
        for piece in memory::pieces(&lengths, pairs_per_run) {
            let piece_rows: Vec<&[i64]> = fits[piece.clone()]
                .iter()
                .map(|&i| rows[i].as_slice())
                .collect();
            let len = piece_rows.iter().map(|r| r.len()).max().unwrap_or(1);
            let pairs = memory::pairs(piece_rows.len(), len);
            let predicted = self.run(&piece_rows, pairs);
            memory::after_run(pairs);
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

    /// One run of the predictor over `rows` of token ids, padded to the longest (the encoder's
    /// inputs as the encoder pads them), `pairs` (query, key) pairs of attention: a length per
    /// row. Every tensor of the run is dropped when this returns.
    fn run(&self, rows: &[&[i64]], pairs: usize) -> anyhow::Result<Vec<f32>> {
        let mut session = self
            .session
            .lock()
            .map_err(|_| anyhow!("the length predictor session is poisoned"))?;
        let options = whole_input_run_options(pairs)?;
        let only_lengths;
        let outputs = match self.reads {
            PredictorInput::Text(_) => {
                let len = rows.iter().map(|r| r.len()).max().unwrap_or(1).max(1);
                let mut ids = vec![0i64; rows.len() * len];
                let mut mask = vec![0i64; rows.len() * len];
                for (row, row_ids) in rows.iter().enumerate() {
                    ids[row * len..row * len + row_ids.len()].copy_from_slice(row_ids);
                    mask[row * len..row * len + row_ids.len()].fill(1);
                }
                let shape = [rows.len(), len];
                session.run_with_options(
                    ort::inputs! {
                        names::PREDICTOR_INPUT_IDS => Tensor::from_array((shape, ids))?,
                        names::PREDICTOR_ATTENTION_MASK => Tensor::from_array((shape, mask))?,
                    },
                    &options,
                )
            }
            PredictorInput::EncoderIds { pad_id } => {
                let (len, ids, mask) = padded_sources(rows, pad_id);
                let shape = [rows.len(), len];
                // Only the head's output: for a head on the encoder, the memory projections
                // are left out of the run.
                only_lengths = options
                    .with_outputs(OutputSelector::no_default().with(names::PREDICTED_LENGTHS));
                session.run_with_options(
                    ort::inputs! {
                        names::SOURCE_IDS => Tensor::from_array((shape, ids))?,
                        names::SOURCE_MASK => Tensor::from_array((shape, mask))?,
                    },
                    &only_lengths,
                )
            }
        }
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

/// A text tokenizer for a predictor graph of its own, with its special tokens added as the
/// graph expects and nothing else done to the text.
fn text_tokenizer(path: &Path) -> Result<Tokenizer, PredictorError> {
    let mut tokenizer =
        Tokenizer::from_file(path).map_err(|e| anyhow!("loading {}: {e}", path.display()))?;
    // `[SEP]` in user text is text; the tokenizer's post-processor adds the real ones.
    tokenizer.set_encode_special_tokens(true);
    // Pretrained tokenizer files often pad every text to a fixed length and truncate long
    // ones (all-MiniLM-L6-v2's: 128): padding here would count as tokens, and a truncated
    // text would be predicted from its first part. Batches are padded below, with a mask;
    // texts too long for the predictor get the linear fit.
    tokenizer
        .with_truncation(None)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
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
