//! Translating with a model package exactly as nmt-server does: the server's tokenizer codec,
//! input limit, output budget rule, ONNX Runtime backend and greedy decode loop, called
//! directly instead of over HTTP.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use indicatif::ProgressBar;
use nmt_server::decode::{greedy_decode, DecodeInput, SpecialIds, StopReason};
use nmt_server::infer::{source_ids, RequestLimits};
use nmt_server::length::{self, LengthModel, LengthPlan, LengthRequest};
use nmt_server::onnx::{self, Device, OrtBackend, SessionOptions};
use nmt_server::package::{ModelPackage, Prepared, Restore, TextCodec};
use serde::{Deserialize, Serialize};

/// How one sentence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The model produced EOS.
    Eos,
    /// Decoding stopped at the length budget without EOS.
    Budget,
    /// The server would refuse the text (413 over the input limit, 422 when empty); scored
    /// as an empty translation.
    Refused,
}

/// One translated sentence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Translation {
    pub text: String,
    pub source_tokens: usize,
    pub output_tokens: usize,
    pub outcome: Outcome,
    /// The length it was decoded for, when one was planned.
    pub target_length: Option<usize>,
    /// Cut at a word boundary to meet `max_chars`.
    pub truncated: bool,
}

/// What the report says about a package.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PackageInfo {
    pub dir: PathBuf,
    pub name: String,
    pub preset: String,
    pub execution_provider: String,
    /// Longest input decoded, in subwords (EOS not counted).
    pub input_limit: usize,
    pub max_output_tokens: usize,
}

/// A loaded package, ready to translate.
pub struct Engine {
    pub info: PackageInfo,
    codec: TextCodec,
    backend: OrtBackend,
    special: SpecialIds,
    eos_id: u32,
    limits: RequestLimits,
    length: LengthModel,
}

/// How to open packages.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub device: Device,
    pub intra_op_threads: usize,
    pub ort_dylib_path: Option<PathBuf>,
    /// Decode inputs over the input limit rather than refuse them.
    pub beyond_input_limit: bool,
}

/// The request limits nmt-server would apply: its defaults, or its `NMT_*` variables.
pub fn server_limits() -> Result<RequestLimits> {
    let args = <nmt_server::Args as clap::Parser>::try_parse_from(["nmt-server"])
        .map_err(|e| anyhow!("nmt-server's limits from the environment: {e}"))?;
    args.request_limits()
}

impl Engine {
    pub fn load(dir: &Path, options: &EngineOptions) -> Result<Engine> {
        let env = onnx::environment(options.ort_dylib_path.as_deref())?;
        let package = ModelPackage::load(dir)?;
        let manifest = &package.manifest;
        let session = SessionOptions {
            intra_op_threads: options.intra_op_threads,
            device: options.device,
        };
        let backend = OrtBackend::load(&env, &package.dir, manifest, &session)
            .with_context(|| format!("opening the graphs of {}", dir.display()))?;
        let length = LengthModel::load(&env, &package.dir, manifest, &session)?;
        let limits = server_limits()?;
        let model_limit = nmt_server::server::model_input_limit(manifest);
        let input_limit = if options.beyond_input_limit {
            // Past the training lengths, but never past a learned position table (EOS
            // takes a position).
            manifest
                .config
                .position_table()
                .map_or(usize::MAX, |t| t - 1)
        } else {
            limits.input_limit(model_limit).0
        };
        let info = PackageInfo {
            dir: dir.to_path_buf(),
            name: manifest.name.clone(),
            preset: manifest.config.preset.clone(),
            execution_provider: backend.execution_provider().to_string(),
            input_limit,
            max_output_tokens: limits.max_output(manifest.limits.max_target_tokens),
        };
        Ok(Engine {
            info,
            special: SpecialIds {
                bos: manifest.bos_id,
                eos: manifest.eos_id,
            },
            eos_id: manifest.eos_id,
            codec: TextCodec::new(package.tokenizer),
            backend,
            limits,
            length,
        })
    }

    /// Refuses a length ask this package cannot honour, with the server's message (its 422).
    pub fn check_length(&self, request: &LengthRequest) -> Result<()> {
        self.length
            .check(request, &self.info.name, self.info.max_output_tokens)
            .map_err(|e| anyhow!("{e}"))
    }

    /// Subword count of `text` with the package's tokenizer.
    pub fn count_subwords(&self, text: &str) -> Result<usize> {
        Ok(self.codec.encode(text).map_err(|e| anyhow!(e))?.len())
    }

    /// The subwords of `text` as the server prepares it, or `None` when the server would
    /// refuse it.
    fn admit(&self, text: &str) -> Result<(usize, Option<Prepared>)> {
        let prepared = self.codec.prepare(text).map_err(|e| anyhow!(e))?;
        let n = prepared.ids.len();
        let admitted = !text.trim().is_empty() && n <= self.info.input_limit;
        Ok((n, admitted.then_some(prepared)))
    }

    /// Each text's length plan as the server makes it for `lengths[i]` (predictions batched).
    fn plan_lengths(
        &self,
        texts: &[String],
        source_tokens: &[usize],
        lengths: &[LengthRequest],
    ) -> Result<Vec<LengthPlan>> {
        let needs: Vec<usize> = (0..texts.len())
            .filter(|&i| length::needs_prediction(&lengths[i], &self.length))
            .collect();
        let asked: Vec<&str> = needs.iter().map(|&i| texts[i].as_str()).collect();
        let tokens: Vec<usize> = needs.iter().map(|&i| source_tokens[i]).collect();
        let mut predicted = vec![None; texts.len()];
        for (&i, p) in needs.iter().zip(self.length.predict(&asked, &tokens)?) {
            predicted[i] = p;
        }
        Ok((0..texts.len())
            .map(|i| {
                length::plan(
                    &lengths[i],
                    &self.length,
                    source_tokens[i],
                    predicted[i],
                    self.info.max_output_tokens,
                )
            })
            .collect())
    }

    /// Translates `texts` (`lengths[i]` is text `i`'s length ask, as a request would carry
    /// it) in batches of `batch_size` sentences of similar length; returns the translations
    /// in input order, `max_chars` met as the server meets it. Advances `bar` by one per
    /// sentence.
    pub fn translate(
        &mut self,
        texts: &[String],
        lengths: &[LengthRequest],
        batch_size: usize,
        bar: &ProgressBar,
    ) -> Result<Vec<Translation>> {
        let mut out: Vec<Option<Translation>> = vec![None; texts.len()];
        let mut admitted = Vec::new();
        let mut restores = vec![Restore::default(); texts.len()];
        for (i, text) in texts.iter().enumerate() {
            match self.admit(text)? {
                (n, Some(Prepared { ids, restore })) => {
                    restores[i] = restore;
                    admitted.push((i, n, ids));
                }
                (n, None) => {
                    out[i] = Some(refused(n));
                    bar.inc(1);
                }
            }
        }
        let kept_texts: Vec<String> = admitted.iter().map(|(i, ..)| texts[*i].clone()).collect();
        let kept_tokens: Vec<usize> = admitted.iter().map(|(_, n, _)| *n).collect();
        let kept_lengths: Vec<LengthRequest> = admitted.iter().map(|(i, ..)| lengths[*i]).collect();
        let plans = self.plan_lengths(&kept_texts, &kept_tokens, &kept_lengths)?;
        let mut pending: Vec<(usize, usize, Vec<i64>, LengthPlan, LengthRequest)> = admitted
            .into_iter()
            .zip(plans)
            .map(|((i, n, ids), plan)| (i, n, source_ids(&ids, self.eos_id), plan, lengths[i]))
            .collect();
        // Longest first: the progress bar's estimate errs on the slow side.
        pending.sort_by_key(|(i, n, ..)| (std::cmp::Reverse(*n), *i));
        for batch in pending.chunks(batch_size.max(1)) {
            let decoded = self.decode_batch(batch, &restores)?;
            for ((i, ..), translation) in batch.iter().zip(decoded) {
                out[*i] = Some(translation);
            }
            bar.inc(batch.len() as u64);
        }
        Ok(out.into_iter().map(|t| t.expect("every text")).collect())
    }

    /// One batch, then, for texts over their `max_chars`, one more decode for fewer subwords
    /// and a cut at a word boundary: the server's rule (`Infer::fit_chars`).
    fn decode_batch(
        &mut self,
        batch: &[(usize, usize, Vec<i64>, LengthPlan, LengthRequest)],
        restores: &[Restore],
    ) -> Result<Vec<Translation>> {
        let mut out = Vec::with_capacity(batch.len());
        let inputs: Vec<DecodeInput> = batch
            .iter()
            .map(|(_, n, ids, plan, request)| self.decode_input(ids, *n, plan, request))
            .collect();
        let outputs = greedy_decode(&mut self.backend, self.special, &inputs)?;
        for ((i, n, ids, plan, request), output) in batch.iter().zip(outputs) {
            let restore = &restores[*i];
            let mut translation = self.translation(*n, plan, output, restore)?;
            if let Some(max_chars) = request.max_chars {
                let chars = translation.text.chars().count();
                if chars > max_chars {
                    let shorter =
                        length::shorter_plan(plan, translation.output_tokens, chars, max_chars);
                    let input = self.decode_input(ids, *n, &shorter, request);
                    let again = greedy_decode(&mut self.backend, self.special, &[input])?;
                    let retried =
                        self.translation(*n, &shorter, again.into_iter().next().unwrap(), restore)?;
                    if retried.text.chars().count() < chars {
                        translation = retried;
                    }
                }
                if let Some(cut) = length::cut_to_chars(&translation.text, max_chars) {
                    translation.text = cut;
                    translation.truncated = true;
                }
            }
            out.push(translation);
        }
        Ok(out)
    }

    fn decode_input(
        &self,
        ids: &[i64],
        source_tokens: usize,
        plan: &LengthPlan,
        request: &LengthRequest,
    ) -> DecodeInput {
        length::decode_input(
            ids.to_vec(),
            source_tokens,
            plan,
            request.mode,
            self.length.length_aware,
            &self.limits,
            self.info.max_output_tokens,
        )
    }

    fn translation(
        &self,
        source_tokens: usize,
        plan: &LengthPlan,
        output: nmt_server::decode::DecodeOutput,
        restore: &Restore,
    ) -> Result<Translation> {
        let text = self
            .codec
            .finish(&output.ids, restore)
            .map_err(|e| anyhow!(e))?;
        Ok(Translation {
            // One sentence a line in the hypothesis files.
            text: text.replace(['\n', '\r'], " "),
            source_tokens,
            output_tokens: output.ids.len(),
            outcome: match output.stop {
                StopReason::Eos => Outcome::Eos,
                StopReason::MaxLength => Outcome::Budget,
            },
            target_length: plan.target,
            truncated: false,
        })
    }
}

fn refused(source_tokens: usize) -> Translation {
    Translation {
        text: String::new(),
        source_tokens,
        output_tokens: 0,
        outcome: Outcome::Refused,
        target_length: None,
        truncated: false,
    }
}
