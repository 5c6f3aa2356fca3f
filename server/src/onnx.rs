//! The ONNX Runtime backend: loading the runtime library, opening the two graphs, checking
//! them against the decoder-step contract and the manifest ([`crate::contract`]), and
//! running them.
//!
//! Inputs and outputs are always found by name (see `model_package::names`), never by
//! position.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context};
use model_package::{files, names, Manifest};
use ndarray::{Array2, Ix2};
use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Outlet, Tensor};

use crate::backend::{Backend, BackendError};
use crate::contract::{check_contract, Layout, Port};
use crate::tensor;

/// The environment variable naming the ONNX Runtime shared library.
pub const ORT_DYLIB_ENV: &str = "ORT_DYLIB_PATH";

static ENVIRONMENT: Mutex<Option<Environment>> = Mutex::new(None);

/// Loads ONNX Runtime from `library` (or, when `None`, from `ORT_DYLIB_PATH`, or from
/// `libonnxruntime.so` on the loader's search path) and creates the process-wide
/// environment. ONNX Runtime allows one environment per process, so later calls return the
/// same one and ignore `library`.
pub fn environment(library: Option<&Path>) -> anyhow::Result<Environment> {
    let mut slot = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(env) = slot.as_ref() {
        return Ok(env.clone());
    }
    let from_env = std::env::var_os(ORT_DYLIB_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let hint = format!(
        "set {ORT_DYLIB_ENV} (or --ort-dylib-path) to ONNX Runtime's libonnxruntime.so; \
         with the PyPI wheel installed, `source scripts/env.sh` does it"
    );
    let (path, origin) = match (library, from_env) {
        (Some(path), _) => (path.to_path_buf(), "--ort-dylib-path or ORT_DYLIB_PATH"),
        (None, Some(path)) => (path, ORT_DYLIB_ENV),
        (None, None) => (
            PathBuf::from("libonnxruntime.so"),
            "the default library name",
        ),
    };
    if path.components().count() > 1 && !path.exists() {
        bail!(
            "ONNX Runtime library not found: {} (from {origin}) does not exist; {hint}",
            path.display()
        );
    }
    let builder = ort::init_from(&path).map_err(|e| {
        anyhow!(
            "cannot load the ONNX Runtime library {} (from {origin}): {e}; {hint}",
            path.display()
        )
    })?;
    let env = builder
        .with_name("nmt-server")
        .build()
        .map_err(|e| anyhow!("creating the ONNX Runtime environment: {e}"))?;
    tracing::info!(library = %path.display(), "loaded ONNX Runtime");
    *slot = Some(env.clone());
    Ok(env)
}

/// Where the graphs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// CUDA when this ONNX Runtime has it and a GPU answers, otherwise CPU.
    Auto,
    Cpu,
    /// CUDA, falling back to CPU (with a warning) when it cannot be used.
    Cuda,
}

/// How the sessions run.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Threads one operator may use. 1 is fastest on small machines: waking a second thread
    /// across two virtual cores costs more than a small step saves (docs/serving.md).
    pub intra_op_threads: usize,
    pub device: Device,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            intra_op_threads: 1,
            device: Device::Cpu,
        }
    }
}

/// A session builder with the options applied, and the execution provider it got.
pub(crate) fn session_builder(
    env: &Environment,
    options: &SessionOptions,
) -> anyhow::Result<(ort::session::builder::SessionBuilder, &'static str)> {
    use ort::ep::ExecutionProvider;
    let threads = options.intra_op_threads.max(1);
    let configure = |e: ort::Error<_>| anyhow!("configuring ONNX Runtime sessions: {e}");
    let cpu = || -> anyhow::Result<_> {
        Session::builder(env)
            .map_err(|e| anyhow!("creating an ONNX Runtime session builder: {e}"))?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(configure)?
            .with_intra_threads(threads)
            .map_err(configure)?
            .with_inter_threads(1)
            .map_err(configure)
    };
    if options.device == Device::Cpu {
        return Ok((cpu()?, "CPU"));
    }
    let warn = |reason: String| {
        if options.device == Device::Cuda {
            tracing::warn!("CUDA was asked for but {reason}; running on CPU");
        } else {
            tracing::info!("{reason}; running on CPU");
        }
    };
    match ort::ep::CUDA::is_available() {
        Ok(true) => {}
        Ok(false) => {
            warn("this ONNX Runtime library has no CUDA execution provider".into());
            return Ok((cpu()?, "CPU"));
        }
        Err(e) => {
            warn(format!("asking ONNX Runtime for CUDA failed ({e})"));
            return Ok((cpu()?, "CPU"));
        }
    }
    let cuda = ort::ep::CUDA::default().build().error_on_failure();
    match cpu()?.with_execution_providers([cuda]) {
        Ok(builder) => Ok((builder, "CUDA")),
        Err(e) => {
            warn(format!("the CUDA execution provider failed to start ({e})"));
            Ok((cpu()?, "CPU"))
        }
    }
}

/// A graph input or output as [`check_contract`] sees it.
fn port(outlet: &Outlet) -> Port {
    Port {
        name: outlet.name().to_string(),
        ty: outlet.dtype().tensor_type(),
        shape: outlet
            .dtype()
            .tensor_shape()
            .map(|s| s.to_vec())
            .unwrap_or_default(),
    }
}

/// Encoder and decoder sessions of one package.
pub struct OrtBackend {
    encoder: Session,
    decoder: Session,
    layout: Layout,
    pad_id: i64,
    execution_provider: &'static str,
}

/// The live rows of a batch: encoder memory and decoder state, batch-first.
///
/// Rows that join a running batch get a cache padded with zeros (masked) up to the batch's
/// cache length. `joined_at[r]` is the cache length when row `r` joined: columns before the
/// smallest `joined_at` are padding for every row, and are dropped when rows leave, so a
/// batch that never empties under steady traffic does not grow its cache without bound.
pub struct OrtRows {
    /// Aligned with `Layout::memory`.
    memory: Vec<DynValue>,
    /// Aligned with `Layout::states`.
    state: Vec<DynValue>,
    /// Length of the time axis of every state that has one.
    cache_len: usize,
    joined_at: Vec<usize>,
}

impl OrtRows {
    fn rows(&self) -> usize {
        self.joined_at.len()
    }
}

fn ort_error<R>(context: &str) -> impl FnOnce(ort::Error<R>) -> BackendError + '_ {
    move |e| BackendError::Inference(format!("{context}: {e}"))
}

impl OrtBackend {
    /// Opens `encoder.onnx` and `decoder.onnx` of the package in `dir` and checks them
    /// against `manifest`.
    pub fn load(
        env: &Environment,
        dir: &Path,
        manifest: &Manifest,
        options: &SessionOptions,
    ) -> anyhow::Result<Self> {
        let (mut builder, execution_provider) = session_builder(env, options)?;
        let mut open = |file: &str| -> anyhow::Result<Session> {
            let path = dir.join(file);
            builder
                .commit_from_file(&path)
                .map_err(|e| anyhow!("{}: ONNX Runtime cannot load it: {e}", path.display()))
        };
        let encoder = open(files::ENCODER)?;
        let decoder = open(files::DECODER)?;
        let ports = |outlets: &[Outlet]| outlets.iter().map(port).collect::<Vec<_>>();
        let layout = check_contract(
            manifest,
            &ports(encoder.inputs()),
            &ports(encoder.outputs()),
            &ports(decoder.inputs()),
            &ports(decoder.outputs()),
        )
        .with_context(|| format!("model package {}", dir.display()))?;
        tracing::info!(
            intra_op_threads = options.intra_op_threads.max(1),
            execution_provider,
            memory = ?layout.memory,
            states = ?layout.states.iter().map(|s| s.spec.name.as_str()).collect::<Vec<_>>(),
            "opened encoder and decoder"
        );
        Ok(OrtBackend {
            encoder,
            decoder,
            layout,
            pad_id: manifest.pad_id.into(),
            execution_provider,
        })
    }

    /// "CUDA" or "CPU": what the sessions actually run on.
    pub fn execution_provider(&self) -> &'static str {
        self.execution_provider
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

fn batch_of(value: &DynValue) -> Option<usize> {
    value
        .dtype()
        .tensor_shape()
        .and_then(|s| s.first().copied())
        .map(|d| d.max(0) as usize)
}

impl Backend for OrtBackend {
    type Rows = OrtRows;

    fn encode(&mut self, sources: &[&[i64]]) -> Result<OrtRows, BackendError> {
        let batch = sources.len();
        let len = sources.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
        let mut ids = vec![self.pad_id; batch * len];
        let mut mask = vec![0f32; batch * len];
        for (row, source) in sources.iter().enumerate() {
            ids[row * len..row * len + source.len()].copy_from_slice(source);
            mask[row * len..row * len + source.len()].fill(1.0);
        }
        let ids = Tensor::from_array(([batch, len], ids)).map_err(ort_error("source_ids"))?;
        let mask = Tensor::from_array(([batch, len], mask)).map_err(ort_error("source_mask"))?;
        let mut outputs = self
            .encoder
            .run(ort::inputs! {
                names::SOURCE_IDS => ids,
                names::SOURCE_MASK => mask,
            })
            .map_err(ort_error("running the encoder"))?;
        let mut memory = Vec::with_capacity(self.layout.memory.len());
        for name in &self.layout.memory {
            let value = outputs.remove(name).ok_or_else(|| {
                BackendError::Contract(format!("the encoder did not return `{name}`"))
            })?;
            if batch_of(&value) != Some(batch) {
                return Err(BackendError::Contract(format!(
                    "encoder output `{name}` has shape {:?}, expected batch {batch} first",
                    value.dtype().tensor_shape()
                )));
            }
            memory.push(value);
        }
        let state = self
            .layout
            .states
            .iter()
            .map(|slot| tensor::zeros(slot.ty, &slot.spec.initial_shape(batch)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(BackendError::Inference)?;
        Ok(OrtRows {
            memory,
            state,
            cache_len: 0,
            joined_at: vec![0; batch],
        })
    }

    fn step(
        &mut self,
        rows: &mut OrtRows,
        target_ids: &[i64],
        positions: &[i64],
        target_lengths: &[i64],
    ) -> Result<Array2<f32>, BackendError> {
        let n = rows.rows();
        if target_ids.len() != n || positions.len() != n || target_lengths.len() != n {
            return Err(BackendError::Inference(format!(
                "step got {} target ids, {} positions and {} target lengths for {n} rows",
                target_ids.len(),
                positions.len(),
                target_lengths.len()
            )));
        }
        let target =
            Tensor::from_array(([n], target_ids.to_vec())).map_err(ort_error("target_ids"))?;
        let position =
            Tensor::from_array(([n], positions.to_vec())).map_err(ort_error("positions"))?;
        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> =
            Vec::with_capacity(2 + rows.memory.len() + rows.state.len());
        inputs.push((names::TARGET_IDS.into(), target.into()));
        inputs.push((names::POSITIONS.into(), position.into()));
        if self.layout.length_aware {
            let lengths = Tensor::from_array(([n], target_lengths.to_vec()))
                .map_err(ort_error("target_lengths"))?;
            inputs.push((names::TARGET_LENGTHS.into(), lengths.into()));
        }
        for (name, value) in self.layout.memory.iter().zip(&rows.memory) {
            inputs.push((name.as_str().into(), value.into()));
        }
        for (slot, value) in self.layout.states.iter().zip(&rows.state) {
            inputs.push((slot.past.as_str().into(), value.into()));
        }
        let mut outputs = self
            .decoder
            .run(inputs)
            .map_err(ort_error("running the decoder"))?;

        let logits = outputs
            .remove(names::LOGITS)
            .ok_or_else(|| BackendError::Contract("the decoder did not return `logits`".into()))?;
        let logits = logits
            .try_extract_array::<f32>()
            .map_err(ort_error("reading logits"))?
            .into_dimensionality::<Ix2>()
            .map_err(|e| BackendError::Contract(format!("logits are not 2-D: {e}")))?
            .to_owned();
        if logits.nrows() != n {
            return Err(BackendError::Contract(format!(
                "logits have shape {:?} for {n} rows",
                logits.shape()
            )));
        }
        let mut state = Vec::with_capacity(self.layout.states.len());
        for slot in &self.layout.states {
            let value = outputs.remove(&slot.present).ok_or_else(|| {
                BackendError::Contract(format!("the decoder did not return `{}`", slot.present))
            })?;
            if batch_of(&value) != Some(n) {
                return Err(BackendError::Contract(format!(
                    "decoder output `{}` has shape {:?}, expected batch {n} first",
                    slot.present,
                    value.dtype().tensor_shape()
                )));
            }
            state.push(value);
        }
        drop(outputs);
        rows.state = state;
        rows.cache_len += 1;
        Ok(logits)
    }

    fn append(&mut self, rows: &mut OrtRows, new: OrtRows) -> Result<(), BackendError> {
        if new.cache_len != 0 {
            return Err(BackendError::Inference(
                "only freshly encoded rows can join a batch".into(),
            ));
        }
        let stack = |old: &[DynValue], new: &[DynValue]| {
            old.iter()
                .zip(new)
                .map(|(a, b)| tensor::concat_rows(a, b))
                .collect::<Result<Vec<_>, _>>()
                .map_err(BackendError::Inference)
        };
        // Both stacks are built before either is stored: a failure leaves `rows` intact.
        let memory = stack(&rows.memory, &new.memory)?;
        let state = stack(&rows.state, &new.state)?;
        rows.memory = memory;
        rows.state = state;
        let joined = rows.cache_len;
        rows.joined_at.extend(new.joined_at.iter().map(|_| joined));
        Ok(())
    }

    fn retain_rows(&mut self, rows: &mut OrtRows, keep: &[usize]) -> Result<(), BackendError> {
        let select = |values: &[DynValue]| {
            values
                .iter()
                .map(|v| tensor::select_rows(v, keep))
                .collect::<Result<Vec<_>, _>>()
                .map_err(BackendError::Inference)
        };
        rows.memory = select(&rows.memory)?;
        rows.state = select(&rows.state)?;
        rows.joined_at = keep.iter().map(|&r| rows.joined_at[r]).collect();
        let unused = rows
            .joined_at
            .iter()
            .copied()
            .min()
            .unwrap_or(rows.cache_len);
        if unused > 0 {
            for (slot, value) in self.layout.states.iter().zip(rows.state.iter_mut()) {
                if let Some(axis) = slot.spec.time_axis() {
                    *value = tensor::drop_leading(value, axis, unused)
                        .map_err(BackendError::Inference)?;
                }
            }
            rows.cache_len -= unused;
            rows.joined_at.iter_mut().for_each(|j| *j -= unused);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        // Only meaningful before any environment exists in this process; the unit tests
        // never create one.
        let err = environment(Some(Path::new("/nonexistent/libonnxruntime.so.1.31.1")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("ONNX Runtime library not found"), "{err}");
        assert!(err.contains("ORT_DYLIB_PATH"), "{err}");
    }
}
