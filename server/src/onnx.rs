//! The ONNX Runtime backend: loading the runtime library, opening the two graphs, checking
//! them against the decoder-step contract and the manifest, and running them.
//!
//! Inputs and outputs are always found by name (see `model_package::names`), never by
//! position.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context};
use model_package::{files, names, Dim, Manifest, StateSpec};
use ndarray::{Array2, Ix2};
use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Outlet, Tensor, TensorElementType};

use crate::backend::{Backend, BackendError};
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
    /// Threads one operator may use. 1 is fastest on small machines (see DESIGN.md).
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

/// A graph input or output as the contract check sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Port {
    pub name: String,
    /// `None` when the value is not a tensor.
    pub ty: Option<TensorElementType>,
    /// Dimensions; -1 where the graph leaves one dynamic.
    pub shape: Vec<i64>,
}

impl Port {
    pub fn new(name: &str, ty: TensorElementType, shape: &[i64]) -> Self {
        Port {
            name: name.to_string(),
            ty: Some(ty),
            shape: shape.to_vec(),
        }
    }

    fn from_outlet(outlet: &Outlet) -> Self {
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
}

/// One `past.<name>` / `present.<name>` pair.
#[derive(Clone, Debug, PartialEq)]
pub struct StateSlot {
    pub spec: StateSpec,
    pub past: String,
    pub present: String,
    pub ty: TensorElementType,
}

/// What the check found: the names to feed, in a fixed order.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// `memory.*` names, in the decoder's input order (= encoder outputs).
    pub memory: Vec<String>,
    pub states: Vec<StateSlot>,
    /// The decoder reads `target_lengths` (a length-aware model).
    pub length_aware: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("the ONNX graphs do not match the decoder-step contract and the manifest:\n  - {}", .0.join("\n  - "))]
pub struct ContractError(pub Vec<String>);

fn expect_tensor(
    problems: &mut Vec<String>,
    graph: &str,
    kind: &str,
    ports: &BTreeMap<&str, &Port>,
    name: &str,
    ty: TensorElementType,
    rank: usize,
) {
    match ports.get(name) {
        None => problems.push(format!("{graph} has no {kind} `{name}`")),
        Some(port) => {
            if port.ty != Some(ty) {
                problems.push(format!(
                    "{graph} {kind} `{name}` is {:?}, expected {ty:?}",
                    port.ty
                ));
            }
            if port.shape.len() != rank {
                problems.push(format!(
                    "{graph} {kind} `{name}` has rank {}, expected {rank}",
                    port.shape.len()
                ));
            }
        }
    }
}

fn by_name(ports: &[Port]) -> BTreeMap<&str, &Port> {
    ports.iter().map(|p| (p.name.as_str(), p)).collect()
}

/// Checks the graphs' inputs and outputs against `names` and the manifest's state list, and
/// reports every problem at once.
pub fn check_contract(
    manifest: &Manifest,
    encoder_inputs: &[Port],
    encoder_outputs: &[Port],
    decoder_inputs: &[Port],
    decoder_outputs: &[Port],
) -> Result<Layout, ContractError> {
    use TensorElementType::{Float32, Int64};
    let mut problems = Vec::new();
    let (enc_in, enc_out) = (by_name(encoder_inputs), by_name(encoder_outputs));
    let (dec_in, dec_out) = (by_name(decoder_inputs), by_name(decoder_outputs));

    // Encoder.
    expect_tensor(
        &mut problems,
        files::ENCODER,
        "input",
        &enc_in,
        names::SOURCE_IDS,
        Int64,
        2,
    );
    expect_tensor(
        &mut problems,
        files::ENCODER,
        "input",
        &enc_in,
        names::SOURCE_MASK,
        Float32,
        2,
    );
    for name in enc_in.keys() {
        if *name != names::SOURCE_IDS && *name != names::SOURCE_MASK {
            problems.push(format!(
                "{} has an unexpected input `{name}`",
                files::ENCODER
            ));
        }
    }
    if encoder_outputs.is_empty() {
        problems.push(format!("{} has no outputs", files::ENCODER));
    }
    for port in encoder_outputs {
        if !port.name.starts_with(names::MEMORY_PREFIX) {
            problems.push(format!(
                "{} output `{}` is not named `{}*`",
                files::ENCODER,
                port.name,
                names::MEMORY_PREFIX
            ));
        } else if !port
            .ty
            .is_some_and(|ty| tensor::SUPPORTED_TYPES.contains(&ty))
        {
            problems.push(format!(
                "{} output `{}` has unsupported type {:?}",
                files::ENCODER,
                port.name,
                port.ty
            ));
        } else if port.shape.is_empty() {
            problems.push(format!(
                "{} output `{}` is a scalar; memory must be batch-first",
                files::ENCODER,
                port.name
            ));
        }
    }

    // Decoder: the fixed inputs, the memory, the state.
    expect_tensor(
        &mut problems,
        files::DECODER,
        "input",
        &dec_in,
        names::TARGET_IDS,
        Int64,
        1,
    );
    expect_tensor(
        &mut problems,
        files::DECODER,
        "input",
        &dec_in,
        names::POSITIONS,
        Int64,
        1,
    );
    expect_tensor(
        &mut problems,
        files::DECODER,
        "output",
        &dec_out,
        names::LOGITS,
        Float32,
        2,
    );
    if let Some(vocab) = dec_out.get(names::LOGITS).and_then(|p| p.shape.get(1)) {
        if *vocab >= 0 && *vocab as usize != manifest.config.vocab_size {
            problems.push(format!(
                "{} output `{}` has {vocab} columns, the manifest's vocab_size is {}",
                files::DECODER,
                names::LOGITS,
                manifest.config.vocab_size
            ));
        }
    }

    let memory: Vec<String> = decoder_inputs
        .iter()
        .filter(|p| p.name.starts_with(names::MEMORY_PREFIX))
        .map(|p| p.name.clone())
        .collect();
    let produced: BTreeSet<&str> = enc_out.keys().copied().collect();
    let consumed: BTreeSet<&str> = memory.iter().map(String::as_str).collect();
    for name in produced.difference(&consumed) {
        problems.push(format!(
            "{} output `{name}` is not an input of {}",
            files::ENCODER,
            files::DECODER
        ));
    }
    for name in consumed.difference(&produced) {
        problems.push(format!(
            "{} input `{name}` is not an output of {}",
            files::DECODER,
            files::ENCODER
        ));
    }

    let mut states = Vec::new();
    let mut expected_inputs: BTreeSet<String> = [names::TARGET_IDS, names::POSITIONS]
        .map(String::from)
        .into();
    let length_aware = manifest.config.is_length_aware();
    if length_aware {
        expect_tensor(
            &mut problems,
            files::DECODER,
            "input",
            &dec_in,
            names::TARGET_LENGTHS,
            Int64,
            1,
        );
        expected_inputs.insert(names::TARGET_LENGTHS.to_string());
    }
    expected_inputs.extend(memory.iter().cloned());
    let mut expected_outputs: BTreeSet<String> = [names::LOGITS.to_string()].into();
    for spec in &manifest.decoder_state {
        let past = names::past(&spec.name);
        let present = names::present(&spec.name);
        expected_inputs.insert(past.clone());
        expected_outputs.insert(present.clone());
        if spec.dims.first() != Some(&Dim::Batch) {
            problems.push(format!(
                "manifest state `{}` has dims {:?}; the batch must be axis 0",
                spec.name, spec.dims
            ));
        }
        if spec.dims.iter().filter(|d| **d == Dim::Batch).count() > 1
            || spec.dims.iter().filter(|d| **d == Dim::Time).count() > 1
        {
            problems.push(format!(
                "manifest state `{}` has dims {:?}; at most one batch and one time axis",
                spec.name, spec.dims
            ));
        }
        let (Some(past_port), Some(present_port)) =
            (dec_in.get(past.as_str()), dec_out.get(present.as_str()))
        else {
            if !dec_in.contains_key(past.as_str()) {
                problems.push(format!(
                    "{} has no input `{past}` for manifest state `{}`",
                    files::DECODER,
                    spec.name
                ));
            }
            if !dec_out.contains_key(present.as_str()) {
                problems.push(format!(
                    "{} has no output `{present}` for manifest state `{}`",
                    files::DECODER,
                    spec.name
                ));
            }
            continue;
        };
        let Some(ty) = past_port
            .ty
            .filter(|ty| tensor::SUPPORTED_TYPES.contains(ty))
        else {
            problems.push(format!(
                "{} input `{past}` has unsupported type {:?}",
                files::DECODER,
                past_port.ty
            ));
            continue;
        };
        if present_port.ty != Some(ty) {
            problems.push(format!(
                "{} output `{present}` is {:?} but `{past}` is {ty:?}",
                files::DECODER,
                present_port.ty
            ));
        }
        for port in [past_port, present_port] {
            if port.shape.len() != spec.dims.len() {
                problems.push(format!(
                    "{} `{}` has rank {}, the manifest's state `{}` has {} dims",
                    files::DECODER,
                    port.name,
                    port.shape.len(),
                    spec.name,
                    spec.dims.len()
                ));
                continue;
            }
            for (axis, (dim, &size)) in spec.dims.iter().zip(&port.shape).enumerate() {
                if let Dim::Fixed(n) = dim {
                    if size >= 0 && size as usize != *n {
                        problems.push(format!(
                            "{} `{}` has size {size} on axis {axis}, the manifest says {n}",
                            files::DECODER,
                            port.name
                        ));
                    }
                }
            }
        }
        states.push(StateSlot {
            spec: spec.clone(),
            past,
            present,
            ty,
        });
    }
    for name in dec_in.keys() {
        if !expected_inputs.contains(*name) {
            problems.push(format!(
                "{} has an input `{name}` that is neither in the contract nor a manifest state",
                files::DECODER
            ));
        }
    }
    for name in dec_out.keys() {
        if !expected_outputs.contains(*name) {
            problems.push(format!(
                "{} has an output `{name}` that is neither in the contract nor a manifest state",
                files::DECODER
            ));
        }
    }

    if problems.is_empty() {
        Ok(Layout {
            memory,
            states,
            length_aware,
        })
    } else {
        Err(ContractError(problems))
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
                .map_err(|e| anyhow!("loading {}: {e}", path.display()))
        };
        let encoder = open(files::ENCODER)?;
        let decoder = open(files::DECODER)?;
        let ports = |outlets: &[Outlet]| outlets.iter().map(Port::from_outlet).collect::<Vec<_>>();
        let layout = check_contract(
            manifest,
            &ports(encoder.inputs()),
            &ports(encoder.outputs()),
            &ports(decoder.inputs()),
            &ports(decoder.outputs()),
        )
        .with_context(|| format!("checking the model package in {}", dir.display()))?;
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
    use crate::decode::testing::manifest;
    use TensorElementType::{Float32, Int64};

    struct Graphs {
        enc_in: Vec<Port>,
        enc_out: Vec<Port>,
        dec_in: Vec<Port>,
        dec_out: Vec<Port>,
    }

    fn graphs() -> Graphs {
        Graphs {
            enc_in: vec![
                Port::new("source_ids", Int64, &[-1, -1]),
                Port::new("source_mask", Float32, &[-1, -1]),
            ],
            enc_out: vec![
                Port::new("memory.cross_key.0", Float32, &[-1, 2, -1, 4]),
                Port::new("memory.source_mask", Float32, &[-1, -1]),
            ],
            dec_in: vec![
                Port::new("target_ids", Int64, &[-1]),
                Port::new("positions", Int64, &[-1]),
                Port::new("memory.source_mask", Float32, &[-1, -1]),
                Port::new("memory.cross_key.0", Float32, &[-1, 2, -1, 4]),
                Port::new("past.self_key.0", Float32, &[-1, 2, -1, 4]),
                Port::new("past.self_mask", Float32, &[-1, -1]),
            ],
            dec_out: vec![
                Port::new("logits", Float32, &[-1, 34]),
                Port::new("present.self_key.0", Float32, &[-1, 2, -1, 4]),
                Port::new("present.self_mask", Float32, &[-1, -1]),
            ],
        }
    }

    fn check(g: &Graphs, m: &Manifest) -> Result<Layout, ContractError> {
        check_contract(m, &g.enc_in, &g.enc_out, &g.dec_in, &g.dec_out)
    }

    #[test]
    fn conforming_graphs_give_the_feed_order() {
        let layout = check(&graphs(), &manifest()).unwrap();
        assert_eq!(
            layout.memory,
            vec!["memory.source_mask", "memory.cross_key.0"]
        );
        let states: Vec<_> = layout
            .states
            .iter()
            .map(|s| (s.past.as_str(), s.present.as_str()))
            .collect();
        assert_eq!(
            states,
            vec![
                ("past.self_key.0", "present.self_key.0"),
                ("past.self_mask", "present.self_mask")
            ]
        );
    }

    #[test]
    fn a_length_aware_manifest_needs_the_target_lengths_input() {
        let mut manifest = manifest();
        manifest.config.length_encoding = model_package::LengthEncoding::Ldpe;
        let err = check(&graphs(), &manifest).unwrap_err().to_string();
        assert!(err.contains("no input `target_lengths`"), "{err}");
        let mut g = graphs();
        g.dec_in.push(Port::new("target_lengths", Int64, &[-1]));
        assert!(check(&g, &manifest).unwrap().length_aware);
        // A plain model's decoder must not expect one.
        let err = check(&g, &super::tests::manifest())
            .unwrap_err()
            .to_string();
        assert!(err.contains("target_lengths"), "{err}");
        assert!(
            !check(&graphs(), &super::tests::manifest())
                .unwrap()
                .length_aware
        );
    }

    #[test]
    fn missing_and_extra_names_are_all_reported() {
        let mut g = graphs();
        g.dec_in.retain(|p| p.name != "past.self_mask");
        g.dec_out.push(Port::new("present.extra", Float32, &[-1]));
        g.enc_out.push(Port::new("hidden", Float32, &[-1, -1, 32]));
        let err = check(&g, &manifest()).unwrap_err().to_string();
        assert!(err.contains("no input `past.self_mask`"), "{err}");
        assert!(err.contains("output `present.extra`"), "{err}");
        assert!(err.contains("`hidden` is not named `memory.*`"), "{err}");
        assert!(
            err.contains("`hidden` is not an input of decoder.onnx"),
            "{err}"
        );
    }

    #[test]
    fn shapes_types_and_vocab_are_checked() {
        let mut g = graphs();
        g.dec_in[4] = Port::new("past.self_key.0", Float32, &[-1, 3, -1, 4]);
        g.dec_out[0] = Port::new("logits", Float32, &[-1, 99]);
        g.dec_in[0] = Port::new("target_ids", Int64, &[-1, 1]);
        g.enc_in[1] = Port::new("source_mask", Int64, &[-1, -1]);
        let err = check(&g, &manifest()).unwrap_err().to_string();
        assert!(
            err.contains("`past.self_key.0` has size 3 on axis 1"),
            "{err}"
        );
        assert!(err.contains("99 columns"), "{err}");
        assert!(err.contains("`target_ids` has rank 2"), "{err}");
        assert!(err.contains("`source_mask` is Some(Int64)"), "{err}");
    }

    #[test]
    fn state_batch_axis_must_come_first() {
        let mut m = manifest();
        m.decoder_state[1].dims = vec![Dim::Time, Dim::Batch];
        let err = check(&graphs(), &m).unwrap_err().to_string();
        assert!(err.contains("the batch must be axis 0"), "{err}");
    }

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
