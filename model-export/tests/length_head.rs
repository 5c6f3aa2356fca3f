//! The length heads on what the model reads (`nmt-export length-predictor --head
//! states|subwords`), on a tiny model trained for the test: what the server predicts through
//! ONNX Runtime must be what the candle encoder's final states (or the subwords) and the
//! head's stored weights give, alone and in any batch, and both must survive int8
//! quantization.

use std::path::Path;

use candle_core::{Device, Tensor};
use model_export::length_head::{HeadFeatures, LengthHeadArgs};
use model_export::quantize::{quantize_package, Int8Options, QuantizeArgs};
use model_package::manifest::sha256_file;
use model_package::{files, Manifest, PredictorGraph};
use nmt_engine::length::{LengthModel, LengthSource};
use nmt_engine::onnx::SessionOptions;
use nmt_engine::predictor::SourceText;
use nmt_train::model::dropout::Dropout;
use nmt_train::model::Seq2Seq;

/// One prediction per text from the package's length model, with what made it.
fn predict(package: &Path, rows: &[Vec<i64>]) -> Vec<f64> {
    let env = nmt_engine::onnx::environment(None).unwrap_or_else(|e| panic!("{e:#}"));
    let manifest = Manifest::load(package).unwrap();
    let length = LengthModel::load(&env, package, &manifest, &SessionOptions::default())
        .unwrap_or_else(|e| panic!("{e:#}"));
    let texts: Vec<SourceText> = rows
        .iter()
        .map(|ids| SourceText {
            text: "the ids are what the encoder's head reads",
            source_ids: ids,
            source_tokens: ids.len() - 1,
        })
        .collect();
    length
        .predict(&texts)
        .unwrap()
        .into_iter()
        .map(|p| {
            let (p, source) = p.expect("a prediction");
            assert_eq!(source, LengthSource::Predictor);
            p
        })
        .collect()
}

/// `sum_t (w . h_t + b) + c` over the candle encoder's final states, with the head's weights
/// read back from the written graph.
fn states_reference(checkpoint: &Path, package: &Path, rows: &[Vec<i64>]) -> Vec<f64> {
    let model = nmt_train::train::checkpoint::load_model(checkpoint, &Device::Cpu).unwrap();
    let weights =
        model_export::checkpoint::float_initializers(&package.join(files::ENCODER)).unwrap();
    let w = &weights["length_head.weight"];
    let b = f64::from(weights["length_head.position_bias"][0]);
    let c = f64::from(weights["length_head.bias"][0]);
    rows.iter()
        .map(|ids| {
            let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
            let len = ids.len();
            let source = Tensor::from_vec(ids, (1, len), &Device::Cpu).unwrap();
            let mask = Tensor::ones((1, len), candle_core::DType::F32, &Device::Cpu).unwrap();
            let states = model
                .encode(&source, &mask, &Dropout::off())
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let dot = |h: &[f32]| -> f64 {
                h.iter()
                    .zip(w)
                    .map(|(&h, &w)| f64::from(h) * f64::from(w))
                    .sum()
            };
            states.iter().map(|h| dot(h) + b).sum::<f64>() + c
        })
        .collect()
}

/// `sum_t table[id_t] + c` with the table read back from the written graph.
fn table_reference(package: &Path, rows: &[Vec<i64>]) -> Vec<f64> {
    let weights = model_export::checkpoint::float_initializers(
        &package.join(model_export::length_predictor::GRAPH),
    )
    .unwrap();
    let table = &weights["length_head.table"];
    let c = f64::from(weights["length_head.bias"][0]);
    rows.iter()
        .map(|ids| {
            ids.iter()
                .map(|&i| f64::from(table[i as usize]))
                .sum::<f64>()
                + c
        })
        .collect()
}

fn check_head(features: HeadFeatures) {
    let work = tempfile::tempdir().unwrap();
    let run = nmt_train::fixture::tiny_run_with(work.path(), "rel-ldpe-tiny", 200).unwrap();
    let package = work.path().join("float32");
    model_export::export_package(&model_export::ExportArgs::tiny(&run.checkpoint, &package))
        .unwrap();
    let encoder_before = sha256_file(&package.join(files::ENCODER)).unwrap();
    let args = LengthHeadArgs {
        corpus: run.corpus.clone(),
        train_limit: 0,
        ..LengthHeadArgs::default()
    };
    let prediction = model_export::length_head::export_length_head(&package, features, &args)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let manifest = Manifest::load(&package).unwrap();
    let spec = prediction.predictor.as_ref().unwrap();
    let (computes, graph) = match features {
        HeadFeatures::States => (PredictorGraph::Encoder, files::ENCODER),
        HeadFeatures::Subwords => (
            PredictorGraph::SubwordTable,
            model_export::length_predictor::GRAPH,
        ),
    };
    assert_eq!((spec.computes, spec.graph.as_str()), (computes, graph));
    let recorded = manifest.length_prediction.as_ref().unwrap();
    assert_eq!(recorded.predictor.as_ref().unwrap().graph, graph);
    assert_eq!(
        manifest.files[graph],
        sha256_file(&package.join(graph)).unwrap()
    );
    // The table leaves the translation's graphs alone.
    assert_eq!(
        manifest.files[files::ENCODER] == encoder_before,
        features == HeadFeatures::Subwords
    );
    for split in ["dev", "test", "test_concat"] {
        let measured = &spec.evaluation[split]["predictor"];
        assert!(
            measured["count"].as_u64().unwrap() > 0,
            "{split}: {measured}"
        );
    }
    if features == HeadFeatures::States {
        // A second head on a graph that has one is refused.
        let again =
            model_export::length_head::export_length_head(&package, features, &args).unwrap_err();
        assert!(format!("{again:#}").contains("already has"), "{again:#}");
    }

    let tokenizer = nmt_train::tokenizer::load(&package.join(files::TOKENIZER)).unwrap();
    let rows: Vec<Vec<i64>> = nmt_train::corpus::read_parallel(&run.corpus, "test")
        .unwrap()
        .iter()
        .take(12)
        .map(|(en, _)| {
            let mut ids: Vec<i64> = nmt_train::tokenizer::encode_ids(&tokenizer, en)
                .unwrap()
                .into_iter()
                .map(i64::from)
                .collect();
            ids.push(i64::from(manifest.eos_id));
            ids
        })
        .collect();
    let expected = match features {
        HeadFeatures::States => states_reference(&run.checkpoint, &package, &rows),
        HeadFeatures::Subwords => table_reference(&package, &rows),
    };
    let batched = predict(&package, &rows);
    let alone: Vec<f64> = rows
        .iter()
        .flat_map(|row| predict(&package, std::slice::from_ref(row)))
        .collect();
    assert_eq!(batched, alone, "a prediction depends on its batch-mates");
    for ((&got, &want), row) in batched.iter().zip(&expected).zip(&rows) {
        // The engine rounds to hundredths (and to at least 1).
        assert!(
            (got - want.max(1.0)).abs() <= 0.006,
            "{got} against {want} for a {}-subword source",
            row.len()
        );
    }

    // Quantized, the head stays float32 and still answers: the table exactly, the states'
    // head near the float32 one (the int8 encoder's states feed it).
    let int8 = work.path().join("int8");
    quantize_package(&QuantizeArgs {
        package: package.clone(),
        out: int8.clone(),
        name: None,
        evaluation: None,
        int8: Int8Options::default(),
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let int8_weights = model_export::checkpoint::float_initializers(&int8.join(graph)).unwrap();
    assert!(int8_weights.keys().any(|k| k.starts_with("length_head.")));
    let quantized = predict(&int8, &rows);
    for (q, f) in quantized.iter().zip(&batched) {
        match features {
            HeadFeatures::States => {
                assert!(
                    (q - f).abs() < 0.05 * f.max(10.0),
                    "int8 {q} against float32 {f}"
                )
            }
            HeadFeatures::Subwords => assert_eq!(q, f),
        }
    }
}

#[test]
fn a_head_on_the_encoder_states_predicts_what_the_candle_encoder_and_its_weights_give() {
    check_head(HeadFeatures::States);
}

#[test]
fn a_subword_table_predicts_what_its_weights_give() {
    check_head(HeadFeatures::Subwords);
}
