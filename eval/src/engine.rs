//! Translating with a model package exactly as nmt-server does: the server's tokenizer codec,
//! input limit, output budget rule, ONNX Runtime backend and greedy decode loop, called
//! directly instead of over HTTP.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use indicatif::ProgressBar;
use nmt_server::decode::{greedy_decode, DecodeInput, SpecialIds, StopReason};
use nmt_server::infer::{source_ids, RequestLimits};
use nmt_server::onnx::{self, Device, OrtBackend, SessionOptions};
use nmt_server::package::{ModelPackage, TextCodec};
use serde::Serialize;

/// How one sentence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    pub text: String,
    pub source_tokens: usize,
    pub output_tokens: usize,
    pub outcome: Outcome,
}

/// What the report says about a package.
#[derive(Clone, Debug, Serialize)]
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
        let limits = server_limits()?;
        let model_limit = nmt_server::server::model_input_limit(manifest);
        let input_limit = if options.beyond_input_limit {
            usize::MAX
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
        })
    }

    /// Subword count of `text` with the package's tokenizer.
    pub fn count_subwords(&self, text: &str) -> Result<usize> {
        Ok(self.codec.encode(text).map_err(|e| anyhow!(e))?.len())
    }

    /// The decoder input of `text` as the server builds it for a request without a target
    /// length, or `None` when the server would refuse the text; and its subword count.
    fn prepare(&self, text: &str) -> Result<(usize, Option<DecodeInput>)> {
        let ids = self.codec.encode(text).map_err(|e| anyhow!(e))?;
        if text.trim().is_empty() || ids.len() > self.info.input_limit {
            return Ok((ids.len(), None));
        }
        let budget = self
            .limits
            .output_budget(ids.len(), self.info.max_output_tokens);
        let input = DecodeInput::new(source_ids(&ids, self.eos_id), budget);
        Ok((ids.len(), Some(input)))
    }

    /// Translates `texts` in batches of `batch_size` sentences of similar length; returns the
    /// translations in input order. Advances `bar` by one per sentence.
    pub fn translate(
        &mut self,
        texts: &[String],
        batch_size: usize,
        bar: &ProgressBar,
    ) -> Result<Vec<Translation>> {
        let mut out: Vec<Option<Translation>> = vec![None; texts.len()];
        let mut pending = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            match self.prepare(text)? {
                (source_tokens, Some(input)) => pending.push((i, source_tokens, input)),
                (source_tokens, None) => {
                    out[i] = Some(refused(source_tokens));
                    bar.inc(1);
                }
            }
        }
        // Longest first: the progress bar's estimate errs on the slow side.
        pending.sort_by_key(|(i, n, _)| (std::cmp::Reverse(*n), *i));
        for batch in pending.chunks(batch_size.max(1)) {
            let inputs: Vec<DecodeInput> = batch.iter().map(|(_, _, x)| x.clone()).collect();
            let outputs = greedy_decode(&mut self.backend, self.special, &inputs)?;
            for ((i, source_tokens, _), output) in batch.iter().zip(outputs) {
                let text = self.codec.decode(&output.ids).map_err(|e| anyhow!(e))?;
                out[*i] = Some(Translation {
                    // One sentence a line in the hypothesis files.
                    text: text.replace(['\n', '\r'], " "),
                    source_tokens: *source_tokens,
                    output_tokens: output.ids.len(),
                    outcome: match output.stop {
                        StopReason::Eos => Outcome::Eos,
                        StopReason::MaxLength => Outcome::Budget,
                    },
                });
            }
            bar.inc(batch.len() as u64);
        }
        Ok(out.into_iter().map(|t| t.expect("every text")).collect())
    }
}

fn refused(source_tokens: usize) -> Translation {
    Translation {
        text: String::new(),
        source_tokens,
        output_tokens: 0,
        outcome: Outcome::Refused,
    }
}
