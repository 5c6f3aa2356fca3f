//! The pipeline driven directly, for `nmt-translate`, `nmt-eval` and the benchmarks: one
//! package, its ONNX Runtime sessions, the greedy decode loop called in batches of similar
//! length. The server drives the same [`Pipeline`] through its scheduler, so both answer
//! the same text with the same translation and counts.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::decode::{greedy_decode, SpecialIds};
use crate::error::{EngineError, ValidationError};
use crate::length::{LengthModel, LengthPlan, LengthRequest};
use crate::limits::{model_input_limit, RequestLimits};
use crate::onnx::{self, Device, OrtBackend, SessionOptions};
use crate::package::{ModelPackage, TextCodec};
use crate::pipeline::{Attempts, Pipeline, Translation, ValidText};

/// What a report says about a package.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PackageInfo {
    pub dir: PathBuf,
    pub name: String,
    pub preset: String,
    /// The language it translates from (an ISO 639-1 code), as the manifest says.
    #[serde(default)]
    pub source_language: String,
    pub execution_provider: String,
    /// The weights' precision, which `auto` batch sizes go by ([`crate::limits::BatchRows`]).
    #[serde(default)]
    pub precision: model_package::Precision,
    /// Longest input decoded, in subwords (EOS not counted).
    pub input_limit: usize,
    pub max_output_tokens: usize,
}

/// How to open packages.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub device: Device,
    pub intra_op_threads: usize,
    pub ort_dylib_path: Option<PathBuf>,
    /// Decode inputs over the input limit rather than refuse them.
    pub beyond_input_limit: bool,
    /// The limits a request would meet: the server's defaults unless told otherwise.
    pub limits: RequestLimits,
    /// Mask placeholders, numbers, URLs and markup before the model (as the server does
    /// unless `--no-placeholder-masking`).
    pub placeholder_masking: bool,
    /// Batches decoded at once, each by a worker of its own (its own decoder session; the
    /// workers take turns at one encoder, as the server's model workers do): CTranslate2's
    /// `inter_threads`. A text's translation does not depend on which worker decodes it.
    pub workers: usize,
}

/// A loaded package, ready to translate.
pub struct Engine {
    pub info: PackageInfo,
    pipeline: Pipeline,
    /// One per worker ([`EngineOptions::workers`]), at least one.
    backends: Vec<OrtBackend>,
    special: SpecialIds,
}

/// A batch of validated texts, each with its index in the caller's input.
type Batch<'a> = &'a [(usize, ValidText)];

impl Engine {
    pub fn load(dir: &Path, options: &EngineOptions) -> anyhow::Result<Engine> {
        let env = onnx::environment(options.ort_dylib_path.as_deref())?;
        let package = ModelPackage::load(dir)?;
        let manifest = &package.manifest;
        let session = SessionOptions {
            intra_op_threads: options.intra_op_threads,
            device: options.device,
        };
        let backends =
            OrtBackend::load_workers(&env, &package.dir, manifest, &session, options.workers)
                .with_context(|| format!("opening the graphs of {}", dir.display()))?;
        let length = LengthModel::load(&env, &package.dir, manifest, &session)?;
        let mut limits = options.limits.clone();
        let mut max_source_tokens = model_input_limit(manifest);
        if options.beyond_input_limit {
            // Past the training lengths, but never past a learned position table (EOS
            // takes a position).
            limits.max_input_tokens = manifest
                .config
                .position_table()
                .map_or(usize::MAX, |t| t - 1);
            max_source_tokens = None;
        }
        let pipeline = Pipeline {
            name: manifest.name.clone(),
            codec: TextCodec::new(package.tokenizer)
                .with_target(package.target_tokenizer)
                .with_masking(options.placeholder_masking),
            eos_id: manifest.eos_id,
            length,
            max_source_tokens,
            max_target_tokens: manifest.limits.max_target_tokens,
            limits,
        };
        let info = PackageInfo {
            dir: dir.to_path_buf(),
            name: manifest.name.clone(),
            preset: manifest.config.preset.clone(),
            source_language: manifest.source_language.clone(),
            execution_provider: backends[0].execution_provider().to_string(),
            precision: manifest.precision,
            input_limit: pipeline.input_limit().0,
            max_output_tokens: pipeline.max_output(),
        };
        Ok(Engine {
            info,
            special: SpecialIds {
                bos: manifest.bos_id,
                eos: manifest.eos_id,
            },
            pipeline,
            backends,
        })
    }

    /// The pipeline: the package's codec, length model and limits.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Refuses a length ask this package cannot honour, with the server's message (its 422).
    pub fn check_length(&self, request: &LengthRequest) -> Result<(), ValidationError> {
        let p = &self.pipeline;
        p.length.check(request, &p.name, p.max_output())
    }

    /// Subword count of `text` with the package's tokenizer.
    pub fn count_subwords(&self, text: &str) -> anyhow::Result<usize> {
        Ok(self
            .pipeline
            .codec
            .encode(text)
            .map_err(anyhow::Error::msg)?
            .len())
    }

    /// Translates `texts` (`lengths[i]` is text `i`'s length ask, as a request would carry
    /// it; each text is validated as a request of its own) in batches of `batch_size`
    /// sentences of similar length, and returns the translations in input order: a text the
    /// server would refuse comes back [`Translation::refused`]. `progress` is told how many
    /// more texts are done as they finish.
    pub fn translate(
        &mut self,
        texts: &[String],
        lengths: &[LengthRequest],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Translation>, EngineError> {
        let mut out: Vec<Option<Translation>> = vec![None; texts.len()];
        let mut valid: Vec<(usize, ValidText)> = Vec::new();
        for (i, (text, length)) in texts.iter().zip(lengths).enumerate() {
            match self.validate(text, *length) {
                Ok(v) => valid.push((i, v)),
                Err(EngineError::Invalid(_)) => {
                    out[i] = Some(Translation::refused(self.refused_tokens(text)?));
                    progress(1);
                }
                Err(e) => return Err(e),
            }
        }
        let (indices, mut planned): (Vec<usize>, Vec<ValidText>) = valid.into_iter().unzip();
        self.pipeline.plan_blocking(&mut planned)?;
        let mut pending: Vec<(usize, ValidText)> = indices.into_iter().zip(planned).collect();
        // Longest first: the progress bar's estimate errs on the slow side.
        pending.sort_by_key(|(i, v)| (std::cmp::Reverse(v.source_tokens), *i));
        let batches: Vec<Batch> = pending.chunks(batch_size.max(1)).collect();
        let mut place = |batch: Batch, decoded: Vec<Translation>| {
            for ((i, _), translation) in batch.iter().zip(decoded) {
                out[*i] = Some(translation);
            }
            progress(batch.len());
        };
        if let [backend] = self.backends.as_mut_slice() {
            for &batch in &batches {
                place(
                    batch,
                    decode_batch(&self.pipeline, backend, self.special, batch)?,
                );
            }
        } else {
            let (pipeline, special) = (&self.pipeline, self.special);
            shared_out(
                &mut self.backends,
                &batches,
                |backend, batch| decode_batch(pipeline, backend, special, batch),
                &mut |k, decoded| place(batches[k], decoded),
            )?;
        }
        Ok(out.into_iter().map(|t| t.expect("every text")).collect())
    }

    /// `text` validated as a one-text request.
    fn validate(&self, text: &str, length: LengthRequest) -> Result<ValidText, EngineError> {
        let ban = self.pipeline.check_request(1, &length, None)?;
        self.pipeline
            .validate_text(0, text.to_string(), length, ban)
    }

    /// The subwords of a refused text, as it would have been decoded.
    fn refused_tokens(&self, text: &str) -> Result<usize, EngineError> {
        let prepared = self
            .pipeline
            .codec
            .prepare(text)
            .map_err(|message| EngineError::Tokenize { index: 0, message })?;
        Ok(prepared.ids.len())
    }
}

/// Decodes `batches` on the workers' backends at once, each taking the next batch as it
/// finishes one (CTranslate2's `inter_threads`), and hands each batch's result to `done` (with
/// the batch's index) on the calling thread, in the order they finish. Stops at the first
/// error: the batches not yet started are left, the error returned.
fn shared_out<B: Send, Q: Sync, R: Send, E: Send>(
    backends: &mut [B],
    batches: &[Q],
    decode: impl Fn(&mut B, &Q) -> Result<R, E> + Sync,
    done: &mut dyn FnMut(usize, R),
) -> Result<(), E> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (sender, finished) = mpsc::channel();
    std::thread::scope(|scope| {
        for (w, backend) in backends.iter_mut().enumerate() {
            let (sender, next, failed, decode) = (sender.clone(), &next, &failed, &decode);
            std::thread::Builder::new()
                .name(format!("engine-worker-{w}"))
                .spawn_scoped(scope, move || {
                    while !failed.load(Ordering::Relaxed) {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(batch) = batches.get(k) else { break };
                        let result = decode(backend, batch);
                        failed.fetch_or(result.is_err(), Ordering::Relaxed);
                        if sender.send((k, result)).is_err() {
                            break;
                        }
                    }
                })
                .expect("starting an engine worker thread");
        }
        drop(sender);
        let mut error = None;
        for (k, result) in finished {
            match result {
                Ok(decoded) => done(k, decoded),
                Err(e) => error = error.or(Some(e)),
            }
        }
        error.map_or(Ok(()), Err)
    })
}

/// One batch: every text's rows decoded together (a row per candidate length for a text
/// with a character goal), a second round for the texts none of whose candidates met their
/// goal, then each text's translation from its rows.
fn decode_batch(
    pipeline: &Pipeline,
    backend: &mut OrtBackend,
    special: SpecialIds,
    batch: Batch,
) -> Result<Vec<Translation>, EngineError> {
    let first: Vec<Vec<LengthPlan>> = batch
        .iter()
        .map(|(_, text)| pipeline.first_plans(text))
        .collect();
    let mut attempts = decode_plans(pipeline, backend, special, batch, first)?;
    let second = batch
        .iter()
        .zip(&attempts)
        .map(|((index, text), a)| pipeline.second_round(*index, text, a))
        .collect::<Result<Vec<_>, _>>()?;
    if second.iter().any(|plans| !plans.is_empty()) {
        let more = decode_plans(pipeline, backend, special, batch, second)?;
        for (a, more) in attempts.iter_mut().zip(more) {
            a.plans.extend(more.plans);
            a.outputs.extend(more.outputs);
        }
    }
    batch
        .iter()
        .zip(&attempts)
        .map(|((index, text), a)| pipeline.finish(*index, text, a))
        .collect()
}

/// Decodes `plans[k]` of text `k` of the batch, all together.
fn decode_plans(
    pipeline: &Pipeline,
    backend: &mut OrtBackend,
    special: SpecialIds,
    batch: Batch,
    plans: Vec<Vec<LengthPlan>>,
) -> Result<Vec<Attempts>, EngineError> {
    let inputs: Vec<_> = batch
        .iter()
        .zip(&plans)
        .flat_map(|((_, text), plans)| pipeline.rows_of(text, plans))
        .collect();
    let mut outputs = greedy_decode(backend, special, &inputs)?.into_iter();
    Ok(plans
        .into_iter()
        .map(|plans| Attempts {
            outputs: outputs.by_ref().take(plans.len()).collect(),
            plans,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each worker notes the batches it decoded; a batch's result is its index times ten.
    fn decode(seen: &mut Vec<usize>, &k: &usize) -> Result<usize, String> {
        seen.push(k);
        std::thread::sleep(std::time::Duration::from_millis(1 + (k % 3) as u64));
        Ok(k * 10)
    }

    #[test]
    fn every_batch_is_decoded_once_and_handed_back_with_its_index() {
        let batches: Vec<usize> = (0..40).collect();
        let mut workers = vec![Vec::new(); 3];
        let mut results = vec![None; batches.len()];
        shared_out(&mut workers, &batches, decode, &mut |k, r| {
            assert!(
                results[k].replace(r).is_none(),
                "batch {k} handed back twice"
            );
        })
        .unwrap();
        let results: Vec<usize> = results.into_iter().map(Option::unwrap).collect();
        assert_eq!(results, batches.iter().map(|k| k * 10).collect::<Vec<_>>());
        let mut decoded: Vec<usize> = workers.concat();
        decoded.sort_unstable();
        assert_eq!(decoded, batches);
        assert!(
            workers.iter().all(|w| !w.is_empty()),
            "every worker took batches"
        );
    }

    #[test]
    fn the_first_error_stops_the_batches_not_yet_started() {
        let batches: Vec<usize> = (0..200).collect();
        let mut workers = vec![Vec::new(); 2];
        let failing = |seen: &mut Vec<usize>, k: &usize| {
            if *k == 5 {
                return Err(format!("batch {k} failed"));
            }
            decode(seen, k)
        };
        let mut handed_back = 0;
        let result = shared_out(&mut workers, &batches, failing, &mut |_, _| {
            handed_back += 1
        });
        assert_eq!(result, Err("batch 5 failed".to_string()));
        // Each worker finishes the batch it holds, then stops.
        assert!(
            handed_back < 10,
            "{handed_back} batches decoded after the error"
        );
    }
}
