//! `nmt-export quantize` and `nmt-export --quantize int8`: a package whose encoder and
//! decoder compute every matrix product with int8 weights, one scale per output channel,
//! and activations quantized one row at a time, so that a sentence's translation does not
//! depend on the other sentences of its batch.
//!
//! The rewrite is `python/quantize.py`, on onnx's graph tools and numpy (its docstring says
//! why ONNX Runtime's own quantizers do not fit: per-tensor activation scales, or a kernel
//! slower than float32 in batches). The script is compiled into the binary and run with
//! python3, so an installed `nmt-export` needs no checkout. It also unties the output
//! projection, giving it its own transposed copy of the shared embedding table. That rewrite
//! works on any float32 package, old ones included, which is why it lives in the script
//! rather than in the graph writers (the float32 graphs keep one table).
//!
//! Inputs, outputs and decoder state stay float32, so an int8 package meets the same
//! contract and the server runs it like any other; only `manifest.precision` tells them
//! apart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context};
use model_package::{files, names, Manifest, Precision};
use serde::{Deserialize, Serialize};

use crate::ExportArgs;

const SCRIPT: &str = include_str!("../python/quantize.py");

/// `--quantize`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantizeTo {
    /// int8 weights for every matrix product, the output projection included, one scale per
    /// output channel; activations quantized one row at a time as the graphs run.
    Int8,
}

/// Range of the int8 weights.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightBits {
    /// 8 bits where this CPU sums uint8 x int8 products exactly (x86 with VNNI, or not x86),
    /// else 7.
    #[default]
    Auto,
    /// Full int8 (±127): most accurate; can saturate on x86 CPUs without VNNI.
    #[value(name = "8")]
    Eight,
    /// ±63: exact on every CPU, a little less accurate.
    #[value(name = "7")]
    Seven,
}

impl WeightBits {
    pub fn bits(self) -> u8 {
        match self {
            WeightBits::Auto => model_package::int8::weight_bits_for_this_cpu(),
            WeightBits::Eight => 8,
            WeightBits::Seven => 7,
        }
    }
}

/// How to quantize: the weights' range and the Python that runs the rewrite.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Int8Options {
    /// Range of the int8 weights. A package quantized to 8 bits on a CPU with VNNI and served
    /// on one without it gets a warning at load (docs/model-package.md, "Int8").
    #[arg(long, value_enum, default_value_t = WeightBits::Auto)]
    pub weight_bits: WeightBits,
    /// Spell each integer product out as seven standard nodes (the per-row quantization and
    /// ONNX Runtime's MatMulIntegerToFloat) instead of one `nmt.RowQuantizedMatMul` node
    /// defined by those nodes. Both give the same numbers; the engine runs the fused node with
    /// its own VNNI kernel where the CPU has AVX-512 VNNI (docs/model-package.md, "Int8").
    /// For runtimes that cannot inline a model's local functions.
    #[arg(long)]
    pub unfused: bool,
    #[command(flatten)]
    pub python: Python,
}

/// The Python that runs the quantizer.
#[derive(clap::Args, Clone, Debug)]
pub struct Python {
    /// Python interpreter with numpy, onnx and onnxruntime, which do the quantization and fit
    /// the encoder's length head (`scripts/setup.sh` installs onnxruntime 1.31.1 and onnx
    /// 1.23.2). Only needed for int8 and the length head.
    #[arg(long = "python", env = "NMT_EXPORT_PYTHON", default_value = "python3")]
    pub interpreter: PathBuf,
}

impl Default for Python {
    fn default() -> Self {
        Python {
            interpreter: PathBuf::from("python3"),
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct QuantizeArgs {
    /// Float32 model package to quantize (only read).
    #[arg(long)]
    pub package: PathBuf,
    /// Output directory of the int8 package (created or overwritten; not --package itself).
    /// Gets int8 encoder.onnx and decoder.onnx, every other file of the package unchanged
    /// (tokenizer; length predictor graph, and its pretrained files where installed), and
    /// the manifest with new checksums, `precision` int8 and a `quantization` record.
    #[arg(long)]
    pub out: PathBuf,
    /// Model name of the int8 package. Default: the float32 package's, so the int8 one can
    /// replace it without clients noticing; give another to serve both side by side.
    #[arg(long)]
    pub name: Option<String>,
    /// JSON file with evaluation results of the int8 package to record in the manifest.
    /// Without it the manifest records none: the float32 package's scores do not describe
    /// the int8 graphs.
    #[arg(long)]
    pub evaluation: Option<PathBuf>,
    #[command(flatten)]
    pub int8: Int8Options,
}

/// What the quantizer did to one graph.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GraphReport {
    /// MatMuls against a stored matrix before quantization (the untied projection counted).
    pub weight_matmuls: usize,
    /// Integer products after it, one per weight MatMul: `nmt.RowQuantizedMatMul` nodes
    /// (MatMulIntegerToFloat in unfused packages, MatMulInteger in packages quantized per
    /// tensor).
    pub matmul_integer: usize,
    /// Activations quantized per row by nodes of the graph: one per distinct input of the
    /// weight MatMuls (a layer's Q, K and V projections share theirs) in unfused packages,
    /// 0 where each fused product quantizes its rows. Absent from older reports.
    #[serde(default)]
    pub row_quantizers: usize,
    /// Whether the tied output projection was rewritten against its own transposed copy.
    pub untied_logits: bool,
    /// Embedding tables stored as int8 rows (one scale a row) and looked up as such. Absent
    /// from older reports, whose tables stayed float32.
    #[serde(default)]
    pub int8_lookups: usize,
    /// Nodes of the quantized graph by op type.
    pub op_counts: BTreeMap<String, usize>,
}

#[derive(Deserialize)]
struct ScriptReport {
    op_types: Vec<String>,
    onnxruntime: String,
    onnx: String,
    graph: GraphReport,
}

/// A written int8 package.
pub struct Quantized {
    pub manifest: Manifest,
    pub encoder: GraphReport,
    pub decoder: GraphReport,
    /// Files the package reads from outside itself (the length predictor's pretrained
    /// files) that were not installed beside the float32 package, so were not copied.
    pub not_installed: Vec<String>,
}

/// Runs the quantizer on one graph, `input` -> `output`.
fn quantize_graph(
    options: &Int8Options,
    weight_bits: u8,
    input: &Path,
    output: &Path,
) -> anyhow::Result<ScriptReport> {
    let bits = weight_bits.to_string();
    let mut args = vec![
        input.as_os_str(),
        output.as_os_str(),
        "--weight-bits".as_ref(),
        bits.as_ref(),
        "--logits".as_ref(),
        names::LOGITS.as_ref(),
    ];
    if options.unfused {
        args.push("--unfused".as_ref());
    }
    options
        .python
        .run_json(SCRIPT, &args)
        .with_context(|| format!("quantizing {}", input.display()))
}

impl Python {
    /// Runs `script` (a file carried by the binary) with `args` and reads the JSON report it
    /// prints on stdout.
    pub fn run_json<T: serde::de::DeserializeOwned>(
        &self,
        script: &str,
        args: &[&std::ffi::OsStr],
    ) -> anyhow::Result<T> {
        let python = &self.interpreter;
        let run = Command::new(python)
            .arg("-c")
            .arg(script)
            .args(args)
            .output();
        let run = match run {
            Ok(run) => run,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "{} not found: this step runs a Python script on onnx's graph tools; install \
                 Python 3 with numpy, onnx and onnxruntime (scripts/setup.sh), or name an \
                 interpreter with --python",
                python.display()
            ),
            Err(e) => return Err(e).with_context(|| format!("running {}", python.display())),
        };
        if !run.status.success() {
            bail!("{}", String::from_utf8_lossy(&run.stderr).trim());
        }
        serde_json::from_slice(&run.stdout).with_context(|| {
            format!(
                "reading the script's report: {}",
                String::from_utf8_lossy(&run.stdout)
            )
        })
    }
}

fn copy_file(from: &Path, to: &Path) -> anyhow::Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Writes the int8 package of `args.package` to `args.out`.
pub fn quantize_package(args: &QuantizeArgs) -> anyhow::Result<Quantized> {
    let mut manifest = Manifest::load(&args.package)
        .with_context(|| format!("loading the package in {}", args.package.display()))?;
    ensure!(
        manifest.precision == Precision::Float32,
        "{} is already int8: quantize its float32 original",
        args.package.display()
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    ensure!(
        std::fs::canonicalize(&args.package)? != std::fs::canonicalize(&args.out)?,
        "--out is --package: write the int8 package to another directory"
    );
    let evaluation = match &args.evaluation {
        Some(path) => serde_json::from_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
        )?,
        None => serde_json::Value::Null,
    };

    let weight_bits = args.int8.weight_bits.bits();
    let encoder = quantize_graph(
        &args.int8,
        weight_bits,
        &args.package.join(files::ENCODER),
        &args.out.join(files::ENCODER),
    )?;
    let decoder = quantize_graph(
        &args.int8,
        weight_bits,
        &args.package.join(files::DECODER),
        &args.out.join(files::DECODER),
    )?;

    let float_files = std::mem::take(&mut manifest.files);
    let unchanged: Vec<&str> = float_files
        .keys()
        .map(String::as_str)
        .filter(|f| ![files::ENCODER, files::DECODER].contains(f))
        .collect();
    for file in &unchanged {
        copy_file(&args.package.join(file), &args.out.join(file))?;
    }
    // Installed beside a package rather than shipped in it, so they may be missing; the
    // int8 package then needs them installed just as its original did.
    let mut not_installed = Vec::new();
    let external = manifest
        .length_prediction
        .as_ref()
        .and_then(|p| p.predictor.as_ref())
        .map_or(&[][..], |p| &p.external_files[..]);
    for file in external {
        let from = args.package.join(&file.path);
        if from.exists() {
            copy_file(&from, &args.out.join(&file.path))?;
        } else {
            not_installed.push(file.path.clone());
        }
    }

    manifest.quantization = serde_json::json!({
        "tool": "nmt-export quantize (model-export/python/quantize.py)",
        "onnxruntime": decoder.onnxruntime,
        "onnx": decoder.onnx,
        "op_types": decoder.op_types,
        "weights": format!(
            "int8, symmetric, one scale per output channel, within ±{}",
            (1u32 << (weight_bits - 1)) - 1
        ),
        model_package::int8::WEIGHT_BITS: weight_bits,
        "weight_bits_chosen_by": match (args.int8.weight_bits, weight_bits) {
            (WeightBits::Auto, 8) =>
                "auto: the quantizing CPU sums uint8 x int8 products exactly (VNNI)",
            (WeightBits::Auto, _) => "auto: the quantizing CPU has no VNNI",
            _ => "--weight-bits",
        },
        "activations": "uint8 around zero point 128, one scale per row (max |x| / 127), computed as the graph runs, so a row does not depend on its batch-mates",
        "products": match args.int8.unfused {
            true => "unfused: the per-row quantization and MatMulIntegerToFloat as standard nodes",
            false => "nmt.RowQuantizedMatMul (the engine's VNNI kernel where the CPU has AVX-512 VNNI, else its body: the per-row quantization and MatMulIntegerToFloat)",
        },
        "from": {
            "name": manifest.name,
            files::ENCODER: float_files.get(files::ENCODER),
            files::DECODER: float_files.get(files::DECODER),
        },
        "graphs": {
            files::ENCODER: encoder.graph,
            files::DECODER: decoder.graph,
        },
    });
    manifest.precision = Precision::Int8;
    manifest.evaluation = evaluation;
    if let Some(name) = &args.name {
        manifest.name = name.clone();
    }
    let written: Vec<&str> = [files::ENCODER, files::DECODER]
        .into_iter()
        .chain(unchanged)
        .collect();
    manifest.write(&args.out, &written)?;
    Ok(Quantized {
        manifest,
        encoder: encoder.graph,
        decoder: decoder.graph,
        not_installed,
    })
}

/// `nmt-export --quantize int8`: the float32 package, exported to a scratch directory, then
/// quantized into `args.out`.
pub fn export_quantized(args: &ExportArgs, int8: &Int8Options) -> anyhow::Result<Quantized> {
    let scratch = tempfile::tempdir()?;
    let float = scratch.path().join("float32");
    crate::export_package(&ExportArgs {
        out: float.clone(),
        ..args.clone()
    })?;
    quantize_package(&QuantizeArgs {
        package: float,
        out: args.out.clone(),
        name: None,
        evaluation: args.evaluation.clone(),
        int8: int8.clone(),
    })
}
