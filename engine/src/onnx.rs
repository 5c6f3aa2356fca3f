//! The ONNX Runtime backend: loading the runtime library, opening the two graphs, checking
//! them against the decoder-step contract and the manifest ([`crate::contract`]), and
//! running them.
//!
//! Inputs and outputs are always found by name (see `model_package::names`), never by
//! position.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use model_package::{files, names, Manifest};
use ndarray::{Array2, Ix2};
use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{Outlet, Tensor, TensorRef};

use crate::backend::{AttentionReads, Backend, BackendError};
use crate::contract::{check_contract, Layout, Port};
use crate::slots::{time_room, SlotBuffer};

/// The environment variable naming the ONNX Runtime shared library.
pub const ORT_DYLIB_ENV: &str = "ORT_DYLIB_PATH";

/// An int8 package with full 8-bit weights on an x86 CPU without VNNI: ONNX Runtime's
/// kernel there adds products in 16 bits, which such weights can saturate
/// (`model_package::int8`). Served anyway, with a warning that says what to do.
fn warn_of_saturating_int8(manifest: &Manifest, execution_provider: &str) {
    let bits = model_package::int8::weight_bits_of(&manifest.quantization);
    if manifest.precision == model_package::Precision::Int8
        && execution_provider == "CPU"
        && bits == 8
        && !model_package::int8::cpu_sums_int8_products_exactly()
    {
        tracing::warn!(
            package = %manifest.name,
            "this package's int8 weights use 8 bits, which this CPU (no VNNI) can saturate: \
             translations may lose accuracy; quantize the float32 package again here \
             (`nmt-export quantize`, which picks 7 bits on such a CPU)"
        );
    }
}

/// Sources are padded to a multiple of this many tokens. ONNX Runtime's CPU kernels sum the
/// decoder's attention over a source of exactly n tokens in another order than over the same
/// n tokens followed by padding, so a sentence alone (unpadded) and beside a longer one
/// (padded) got scores that differ in the last bits: never a different float32 translation
/// on the Bible test set, but enough to move an int8 graph's rounding. Padded to a multiple
/// of 16, a source gets the same scores bit for bit whatever else shares its batch
/// (docs/model-package.md, "Int8"); the decoder's caches already grow in steps of 16
/// (`slots::time_room`).
const SOURCE_GRANULE: usize = 16;

/// The encoder's inputs for `sources` (EOS appended), one row each: ids padded with `pad_id`
/// to the longest rounded up to [`SOURCE_GRANULE`], the float mask, and that padded length.
/// The encoder and a length head on it (`crate::predictor`) pad alike.
pub(crate) fn padded_sources(sources: &[&[i64]], pad_id: i64) -> (usize, Vec<i64>, Vec<f32>) {
    let len = sources
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(0)
        .max(1)
        .next_multiple_of(SOURCE_GRANULE);
    let mut ids = vec![pad_id; sources.len() * len];
    let mut mask = vec![0f32; sources.len() * len];
    for (row, source) in sources.iter().enumerate() {
        ids[row * len..row * len + source.len()].copy_from_slice(source);
        mask[row * len..row * len + source.len()].fill(1.0);
    }
    (len, ids, mask)
}

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
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
    /// Threads one operator may use. 1 leaves the other cores to HTTP and to other workers;
    /// on 2 cores, 2 made one float32 stream 1.4x faster (not int8's: its one-row products
    /// do not split well) once only the decoder's pool spins ([`RunPattern`]).
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

/// How a graph is run, which decides where its CPU tensors come from and whether its
/// intra-op threads spin between runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunPattern {
    /// Run back to back (decoder steps): ONNX Runtime's arena, fastest for many small runs
    /// but keeping its peak for the life of the session; and, with more than one intra-op
    /// thread, a pool that spins between runs, ready for the next step.
    Steps,
    /// Run once per text over the whole source (encoder, length predictor): ONNX Runtime's
    /// arena too, handed back after a run over a long input ([`whole_input_run_options`]),
    /// so that the peak one long input needed goes back to the system when it is done
    /// (docs/serving.md, "Memory"); and a pool that sleeps as soon as a run ends. A
    /// spinning encoder pool held the second core against the decoder's: with two intra-op
    /// threads a decoder step at one row took 1,150-1,190 µs, as with one thread, and
    /// 730-760 µs once the encoder's pool stopped spinning (1,149-1,166 target subwords/s
    /// against 800-819 with one thread; `docs/benchmarks/ctranslate2-gap.md`). The C heap
    /// instead of the arena (as until session 31) made a server's encoder run of one
    /// ~40-subword text take 1.3 ms where the arena's takes 1.2, its tensors allocated under
    /// the heap's lock, which every thread then shared ([`crate::memory::HEAP_ARENAS`]): int8,
    /// two workers, 64 clients, 18,789 against 16,034 target subwords/s (medians of 8
    /// interleaved passes, ahead in all 8).
    OncePerText,
}

/// A session opened on a graph, the execution provider it got, and what its attention reads.
pub(crate) struct OpenedSession {
    pub session: Session,
    pub execution_provider: &'static str,
    pub attention_reads: AttentionReads,
    /// Int8 products run by the engine's VNNI kernel (`row_int8`).
    pub int8_kernels: usize,
}

/// The environment variable that turns ONNX Runtime's profiling on for every session opened
/// (its value: the files' path prefix). For measuring, not serving: each node run is
/// recorded, and the file grows by about 650 bytes a node run.
pub const PROFILE_VARIABLE: &str = "NMT_ORT_PROFILE";

/// Opens the graph at `path` with the options applied (every session of the engine).
pub(crate) fn open_session(
    env: &Environment,
    options: &SessionOptions,
    pattern: RunPattern,
    path: &Path,
) -> anyhow::Result<OpenedSession> {
    let taken = Arc::default();
    let (mut builder, execution_provider) = session_builder(env, options, pattern, &taken)?;
    if let Some(prefix) = std::env::var_os(PROFILE_VARIABLE) {
        // ONNX Runtime's own profile of every node run (its JSON, written when the session
        // closes, the file named PREFIX-<graph>_<time>.json): where a step's time goes on a
        // device no sampling profiler reaches, such as a GPU.
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let file = format!("{}-{stem}", prefix.to_string_lossy());
        builder = builder
            .with_profiling(&file)
            .map_err(|e| anyhow!("profiling ONNX Runtime to {file}: {e}"))?;
    }
    let session = crate::fused::commit_session(|| builder.commit_from_file(path))
        .map_err(|e| anyhow!("{}: ONNX Runtime cannot load it: {e}", path.display()))?;
    Ok(OpenedSession {
        session,
        execution_provider,
        attention_reads: taken.reads(),
        int8_kernels: taken.int8_kernels(),
    })
}

/// ONNX Runtime's run option that frees an arena's unused regions when the run ends, for
/// the devices listed.
const ARENA_SHRINKAGE: &str = "memory.enable_memory_arena_shrinkage";

/// Options of a [`RunPattern::OncePerText`] run over `pairs` (query, key) pairs: a large one
/// ([`crate::memory::is_large_run`]) frees its arena's unused regions as it ends, and
/// [`crate::memory::after_run`] then hands them back to the system.
pub(crate) fn whole_input_run_options(pairs: usize) -> ort::Result<RunOptions> {
    let mut options = RunOptions::new()?;
    if crate::memory::is_large_run(pairs) {
        options.set(ARENA_SHRINKAGE, "cpu:0")?;
    }
    Ok(options)
}

/// A session builder with the options applied, and the execution provider it got; `taken`
/// counts the fused kernels the session creates.
fn session_builder(
    env: &Environment,
    options: &SessionOptions,
    pattern: RunPattern,
    taken: &Arc<crate::fused::KernelsTaken>,
) -> anyhow::Result<(ort::session::builder::SessionBuilder, &'static str)> {
    use ort::ep::ExecutionProvider;
    let threads = options.intra_op_threads.max(1);
    let configure = |e: ort::Error<_>| anyhow!("configuring ONNX Runtime sessions: {e}");
    let base = || -> anyhow::Result<_> {
        let builder = Session::builder(env)
            .map_err(|e| anyhow!("creating an ONNX Runtime session builder: {e}"))?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(configure)?
            .with_intra_threads(threads)
            .map_err(configure)?
            .with_inter_threads(1)
            .map_err(configure)?;
        match pattern {
            RunPattern::Steps => Ok(builder),
            RunPattern::OncePerText => builder
                .with_config_entry("session.intra_op.allow_spinning", "0")
                .map_err(configure),
        }
    };
    // The fused operators' kernels run on the CPU: registered beside CUDA they would take
    // those nodes from it and copy every step's attention inputs to the host, where without
    // them ONNX Runtime inlines the operators' bodies and runs them on the GPU.
    let cpu = || -> anyhow::Result<_> {
        let domain = crate::fused::domain(taken).map_err(|e| anyhow!("fused operators: {e}"))?;
        base()?.with_operators(domain).map_err(configure)
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
    match base()?.with_execution_providers([cuda]) {
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
    /// Shared by the package's model workers ([`OrtBackend::load_workers`]): a session holds
    /// its own copy of the weights, and a worker encodes only as requests join (about a
    /// quarter of its time under 64 clients), so two workers sharing one encoder seldom wait
    /// for it. ONNX Runtime may run one session from several threads, but `ort`'s `run`
    /// takes it mutably, so the workers take turns.
    encoder: Arc<Mutex<Session>>,
    decoder: Session,
    layout: Layout,
    pad_id: i64,
    execution_provider: &'static str,
    /// What the decoder session's attention reads (by the fused kernels it took).
    attention_reads: AttentionReads,
}

/// The slots of a batch: encoder memory and decoder state, each kept in place in a
/// [`SlotBuffer`], and what the first `width` slots hold.
#[derive(Default)]
pub struct OrtRows {
    /// Aligned with `Layout::memory`; empty until the first row is placed.
    memory: Vec<SlotBuffer>,
    /// Aligned with `Layout::states`.
    state: Vec<SlotBuffer>,
    width: usize,
    /// `memory_shapes[m][slot]`: the shape of memory `m`'s row in `slot` (its source's
    /// length), so the memory's room shrinks when the longest source leaves.
    memory_shapes: Vec<Vec<Vec<usize>>>,
}

/// Sentences fresh from the encoder: every memory output of one run, batch-first, and each
/// sentence's row of it. Sentences split from one run ([`Backend::split`]) share its outputs
/// rather than copy them; the outputs go once the last of them is placed or dropped.
pub struct OrtEncoded {
    memory: Arc<[ndarray::ArrayD<f32>]>,
    rows: Vec<usize>,
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
        let mut backends = Self::load_workers(env, dir, manifest, options, 1)?;
        Ok(backends.remove(0))
    }

    /// The backends of `workers` model workers of one package: one encoder session shared
    /// by all, a decoder session each (the running batch's steps, most of a worker's time).
    /// Two workers under 64 clients peaked at 282-301 MiB against 314-319 with an encoder
    /// each, at 2-4% less throughput (`docs/benchmarks/ctranslate2-gap.md`).
    pub fn load_workers(
        env: &Environment,
        dir: &Path,
        manifest: &Manifest,
        options: &SessionOptions,
        workers: usize,
    ) -> anyhow::Result<Vec<Self>> {
        let open = |file: &str, pattern| open_session(env, options, pattern, &dir.join(file));
        let OpenedSession {
            session: encoder,
            int8_kernels: encoder_int8_kernels,
            ..
        } = open(files::ENCODER, RunPattern::OncePerText)?;
        let ports = |outlets: &[Outlet]| outlets.iter().map(port).collect::<Vec<_>>();
        let (encoder_inputs, encoder_outputs) = (ports(encoder.inputs()), ports(encoder.outputs()));
        let encoder = Arc::new(Mutex::new(encoder));
        let mut backends = Vec::with_capacity(workers);
        let mut decoder_int8_kernels = 0;
        for _ in 0..workers.max(1) {
            let OpenedSession {
                session: decoder,
                execution_provider,
                attention_reads,
                int8_kernels,
            } = open(files::DECODER, RunPattern::Steps)?;
            decoder_int8_kernels = int8_kernels;
            let layout = check_contract(
                manifest,
                &encoder_inputs,
                &encoder_outputs,
                &ports(decoder.inputs()),
                &ports(decoder.outputs()),
            )
            .with_context(|| format!("model package {}", dir.display()))?;
            backends.push(OrtBackend {
                encoder: Arc::clone(&encoder),
                decoder,
                layout,
                pad_id: manifest.pad_id.into(),
                execution_provider,
                attention_reads,
            });
        }
        let first = &backends[0];
        warn_of_saturating_int8(manifest, first.execution_provider);
        tracing::info!(
            intra_op_threads = options.intra_op_threads.max(1),
            execution_provider = first.execution_provider,
            attention_reads = ?first.attention_reads,
            // Int8 products on the engine's VNNI kernel (0: float32, or ONNX Runtime's body).
            int8_vnni_products = encoder_int8_kernels + decoder_int8_kernels,
            workers = backends.len(),
            memory = ?first.layout.memory,
            states = ?first.layout.states.iter().map(|s| s.spec.name.as_str()).collect::<Vec<_>>(),
            "opened the encoder and a decoder per worker"
        );
        Ok(backends)
    }

    /// "CUDA" or "CPU": what the sessions actually run on.
    pub fn execution_provider(&self) -> &'static str {
        self.execution_provider
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

impl OrtBackend {
    /// Memory and state buffers for a batch that has none yet.
    fn allocate(&self, rows: &mut OrtRows, encoded: &OrtEncoded) {
        if !rows.memory.is_empty() {
            return;
        }
        rows.memory = encoded
            .memory
            .iter()
            .map(|m| SlotBuffer::new(m.ndim() - 1))
            .collect();
        rows.memory_shapes = vec![Vec::new(); encoded.memory.len()];
        rows.state = self
            .layout
            .states
            .iter()
            .map(|slot| SlotBuffer::new(slot.spec.dims.len() - 1))
            .collect();
    }

    /// Runs the encoder and copies out its memory outputs, so that every tensor of the run
    /// is dropped when this returns.
    fn encoder_memory(
        &mut self,
        batch: usize,
        pairs: usize,
        ids: Tensor<i64>,
        mask: Tensor<f32>,
    ) -> Result<Vec<ndarray::ArrayD<f32>>, BackendError> {
        let options = whole_input_run_options(pairs).map_err(ort_error("run options"))?;
        let mut encoder = self.encoder.lock().map_err(|_| {
            BackendError::Inference("another worker panicked in the encoder".into())
        })?;
        let outputs = encoder
            .run_with_options(
                ort::inputs! {
                    names::SOURCE_IDS => ids,
                    names::SOURCE_MASK => mask,
                },
                &options,
            )
            .map_err(ort_error("running the encoder"))?;
        let mut memory = Vec::with_capacity(self.layout.memory.len());
        for name in &self.layout.memory {
            let value = outputs.get(name.as_str()).ok_or_else(|| {
                BackendError::Contract(format!("the encoder did not return `{name}`"))
            })?;
            let array = value
                .try_extract_array::<f32>()
                .map_err(ort_error("reading the encoder's output"))?;
            if array.ndim() == 0 || array.shape()[0] != batch {
                return Err(BackendError::Contract(format!(
                    "encoder output `{name}` has shape {:?}, expected batch {batch} first",
                    array.shape()
                )));
            }
            memory.push(array.to_owned());
        }
        Ok(memory)
    }

    /// Runs the encoder on `sources`, one row each.
    fn encode_distinct(&mut self, sources: &[&[i64]]) -> Result<OrtEncoded, BackendError> {
        let batch = sources.len();
        let (len, ids, mask) = padded_sources(sources, self.pad_id);
        let ids = Tensor::from_array(([batch, len], ids)).map_err(ort_error("source_ids"))?;
        let mask = Tensor::from_array(([batch, len], mask)).map_err(ort_error("source_mask"))?;
        let pairs = crate::memory::pairs(batch, len);
        let memory = self.encoder_memory(batch, pairs, ids, mask);
        crate::memory::after_run(pairs);
        Ok(OrtEncoded {
            memory: memory?.into(),
            rows: (0..batch).collect(),
        })
    }

    /// Gives the memory back the room the longest source in the batch no longer needs.
    fn fit_memory(rows: &mut OrtRows) {
        for (buffer, shapes) in rows.memory.iter_mut().zip(&rows.memory_shapes) {
            let live = &shapes[..rows.width];
            for axis in 0..buffer.capacity().len() - 1 {
                let needed = live.iter().map(|s| s[axis]).max().unwrap_or(0);
                let room = buffer.capacity()[axis + 1];
                // A quarter of slack spares a copy each time a source a little shorter
                // than the longest leaves.
                if room > needed + needed / 4 {
                    buffer.set_room(axis, needed);
                }
            }
        }
    }
}

impl Backend for OrtBackend {
    type Rows = OrtRows;
    type Encoded = OrtEncoded;

    fn encode(&mut self, sources: &[&[i64]]) -> Result<OrtEncoded, BackendError> {
        // A text decoded at several lengths (a character goal's candidates) joins as several
        // rows of one source: the encoder runs once for it, and its memory is copied.
        let mut distinct: Vec<&[i64]> = Vec::with_capacity(sources.len());
        let mut first_of: std::collections::HashMap<&[i64], usize> = Default::default();
        let of_row: Vec<usize> = sources
            .iter()
            .map(|&s| {
                *first_of.entry(s).or_insert_with(|| {
                    distinct.push(s);
                    distinct.len() - 1
                })
            })
            .collect();
        let encoded = self.encode_distinct(&distinct)?;
        Ok(OrtEncoded {
            memory: encoded.memory,
            rows: of_row,
        })
    }

    fn split(&self, encoded: OrtEncoded) -> Vec<OrtEncoded> {
        encoded
            .rows
            .iter()
            .map(|&row| OrtEncoded {
                memory: Arc::clone(&encoded.memory),
                rows: vec![row],
            })
            .collect()
    }

    fn place(
        &mut self,
        rows: &mut OrtRows,
        new: OrtEncoded,
        slots: &[usize],
    ) -> Result<(), BackendError> {
        if slots.len() != new.rows.len() {
            return Err(BackendError::Inference(format!(
                "{} encoded rows for {} slots",
                new.rows.len(),
                slots.len()
            )));
        }
        let width = slots
            .iter()
            .map(|&s| s + 1)
            .max()
            .unwrap_or(0)
            .max(rows.width);
        let widened: std::collections::BTreeSet<usize> =
            slots.iter().copied().filter(|&s| s >= rows.width).collect();
        if widened.len() != width - rows.width {
            return Err(BackendError::Inference(format!(
                "slots {slots:?} leave a hole past the batch's width {}",
                rows.width
            )));
        }
        self.allocate(rows, &new);
        for ((buffer, shapes), memory) in rows
            .memory
            .iter_mut()
            .zip(rows.memory_shapes.iter_mut())
            .zip(new.memory.iter())
        {
            buffer.reserve(width, &memory.shape()[1..]);
            shapes.resize(width, Vec::new());
            for (&row, &slot) in new.rows.iter().zip(slots) {
                let row = memory.index_axis(ndarray::Axis(0), row);
                buffer.write_row(slot, &row);
                shapes[slot] = row.shape().to_vec();
            }
        }
        for (buffer, slot_spec) in rows.state.iter_mut().zip(&self.layout.states) {
            let mut row_shape = slot_spec.spec.initial_shape(0)[1..].to_vec();
            if let Some(axis) = slot_spec.spec.time_axis() {
                // A cache keeps its room; the new row owns none of its columns yet.
                row_shape[axis - 1] = buffer.capacity()[axis];
            }
            buffer.reserve(width, &row_shape);
            if slot_spec.spec.time_axis().is_none() {
                slots.iter().for_each(|&slot| buffer.clear_row(slot));
            }
        }
        rows.width = width;
        Self::fit_memory(rows);
        Ok(())
    }

    fn step(
        &mut self,
        rows: &mut OrtRows,
        target_ids: &[i64],
        positions: &[i64],
        target_lengths: &[i64],
    ) -> Result<Array2<f32>, BackendError> {
        let n = rows.width;
        if target_ids.len() != n || positions.len() != n || target_lengths.len() != n {
            return Err(BackendError::Inference(format!(
                "step got {} target ids, {} positions and {} target lengths for {n} rows",
                target_ids.len(),
                positions.len(),
                target_lengths.len()
            )));
        }
        if positions.iter().any(|&p| p < 0) {
            return Err(BackendError::Inference(format!(
                "negative position in {positions:?}"
            )));
        }
        // Room for every row's column of this step, and not much more.
        let needed = positions.iter().map(|&p| p as usize + 1).max().unwrap_or(1);
        for (buffer, slot) in rows.state.iter_mut().zip(&self.layout.states) {
            if let Some(axis) = slot.spec.time_axis() {
                let room = buffer.capacity()[axis];
                if room < needed || room > 2 * time_room(needed) {
                    buffer.set_room(axis - 1, time_room(needed));
                }
            }
        }
        let target =
            Tensor::from_array(([n], target_ids.to_vec())).map_err(ort_error("target_ids"))?;
        let position =
            Tensor::from_array(([n], positions.to_vec())).map_err(ort_error("positions"))?;
        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> =
            Vec::with_capacity(3 + rows.memory.len() + rows.state.len());
        inputs.push((names::TARGET_IDS.into(), target.into()));
        inputs.push((names::POSITIONS.into(), position.into()));
        if self.layout.length_aware {
            let lengths = Tensor::from_array(([n], target_lengths.to_vec()))
                .map_err(ort_error("target_lengths"))?;
            inputs.push((names::TARGET_LENGTHS.into(), lengths.into()));
        }
        fn borrow(buffer: &SlotBuffer, n: usize) -> Result<TensorRef<'_, f32>, BackendError> {
            TensorRef::from_array_view(buffer.view(n)).map_err(ort_error("borrowing a buffer"))
        }
        for (name, buffer) in self.layout.memory.iter().zip(&rows.memory) {
            inputs.push((name.as_str().into(), borrow(buffer, n)?.into()));
        }
        for (slot, buffer) in self.layout.states.iter().zip(&rows.state) {
            inputs.push((slot.past.as_str().into(), borrow(buffer, n)?.into()));
        }
        let outputs = self
            .decoder
            .run(inputs)
            .map_err(ort_error("running the decoder"))?;

        let logits = outputs
            .get(names::LOGITS)
            .ok_or_else(|| BackendError::Contract("the decoder did not return `logits`".into()))?
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
        // Checked non-negative above.
        let columns_at: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
        for (slot, buffer) in self.layout.states.iter().zip(rows.state.iter_mut()) {
            let present = outputs
                .get(slot.present.as_str())
                .ok_or_else(|| {
                    BackendError::Contract(format!("the decoder did not return `{}`", slot.present))
                })?
                .try_extract_array::<f32>()
                .map_err(ort_error("reading the decoder's state"))?;
            let mut expected = buffer.capacity().to_vec();
            expected[0] = n;
            if let Some(axis) = slot.spec.time_axis() {
                expected[axis] = 1;
            }
            if present.shape() != expected.as_slice() {
                return Err(BackendError::Contract(format!(
                    "decoder output `{}` has shape {:?}, expected {expected:?}",
                    slot.present,
                    present.shape()
                )));
            }
            match slot.spec.time_axis() {
                Some(axis) => buffer.write_columns(axis - 1, &present, &columns_at),
                None => buffer.assign_rows(&present),
            }
        }
        Ok(logits)
    }

    fn move_row(&mut self, rows: &mut OrtRows, from: usize, to: usize) -> Result<(), BackendError> {
        if from >= rows.width || to >= rows.width {
            return Err(BackendError::Inference(format!(
                "cannot move slot {from} to {to} in a batch of {}",
                rows.width
            )));
        }
        for buffer in rows.memory.iter_mut().chain(rows.state.iter_mut()) {
            buffer.copy_row(from, to);
        }
        for shapes in &mut rows.memory_shapes {
            shapes[to] = shapes[from].clone();
        }
        Ok(())
    }

    fn truncate(&mut self, rows: &mut OrtRows, width: usize) -> Result<(), BackendError> {
        rows.width = rows.width.min(width);
        Self::fit_memory(rows);
        Ok(())
    }

    fn attention_reads(&self) -> AttentionReads {
        self.attention_reads
    }

    /// Another worker holds the shared encoder (a probe: it may take it the moment after,
    /// and then `encode` waits as before).
    fn encoder_busy(&self) -> bool {
        matches!(
            self.encoder.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
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
