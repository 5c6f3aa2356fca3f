//! A package's graphs written again by this exporter, everything else kept: when the graph
//! writer changes how it computes (not what), shipped packages get the new graphs without
//! their run's checkpoints, which exist only on the machine that trained. The weights go
//! package -> checkpoint ([`crate::checkpoint`]) -> graphs, a round trip the parity tests
//! hold to the same weights; the manifest keeps its name, domains, evaluation, training
//! provenance and length predictor, and gets the new graphs' checksums. A length predictor
//! whose head has no `[CLS]` correction gets the lexical graph, which does not run the BERT
//! ([`crate::length_predictor::regraph_lexical`]).

use std::path::PathBuf;

use anyhow::{ensure, Context};
use candle_core::Device;
use model_package::{files, Manifest};

use crate::checkpoint::{checkpoint_from_package, CheckpointArgs};

#[derive(clap::Args, Clone, Debug)]
pub struct RegraphArgs {
    /// Float32 Transformer-family package to rewrite in place (e.g. models/en-es-rel-ldpe).
    /// An int8 copy is made again from it with `nmt-export quantize`.
    #[arg(long)]
    pub package: PathBuf,
}

/// Rewrites the package's encoder and decoder graphs; returns its manifest.
pub fn regraph_package(args: &RegraphArgs) -> anyhow::Result<Manifest> {
    let work = tempfile::tempdir().context("a temporary directory for the checkpoint")?;
    let checkpoint = work.path().join("checkpoint");
    checkpoint_from_package(&CheckpointArgs {
        package: args.package.clone(),
        out: checkpoint.clone(),
    })?;
    let model = nmt_train::train::checkpoint::load_model(&checkpoint, &Device::Cpu)?;
    let mut manifest = Manifest::load(&args.package)?;
    let (graphs, decoder_state) = crate::graphs(&model)?;
    ensure!(
        decoder_state == manifest.decoder_state,
        "the exporter now writes another decoder state than {} declares: export the package \
         afresh from a checkpoint instead",
        args.package.display()
    );
    // Written beside the package's files, then renamed over them, so that a failure leaves
    // the old graphs whole.
    for (file, graph) in [(files::ENCODER, &graphs.0), (files::DECODER, &graphs.1)] {
        let target = args.package.join(file);
        let fresh = target.with_extension("onnx.new");
        crate::write_onnx(&fresh, graph)?;
        std::fs::rename(&fresh, &target)
            .with_context(|| format!("replacing {}", target.display()))?;
    }
    manifest.write(&args.package, &[files::ENCODER, files::DECODER])?;
    if crate::length_predictor::regraph_lexical(&args.package)? {
        manifest = Manifest::load(&args.package)?;
    }
    Ok(manifest)
}
