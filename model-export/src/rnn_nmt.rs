//! ONNX graphs of [`nmt_train::model::rnn_nmt::RnnNmt`] under the same decoder-step contract as the
//! Transformer: the encoder writes `memory.context` (the top bi-LSTM states) once per
//! sentence; one decoder step carries every LSTM layer's `h`/`c` and the input feed as
//! fixed-size `past.*`/`present.*` state (no time axis: nothing grows with the output).

use model_package::{names, Dim, StateSpec};
use nmt_train::model::rnn_nmt::RnnNmt;

use crate::graph::{Axis, ElemType, Graph};
use crate::proto::ModelProto;
use crate::transformer::{
    embed, embedding_table, linear, padding_bias, sequence_lens, tied_logits,
};

type Result<T> = candle_core::Result<T>;

fn encoder(model: &RnnNmt) -> Result<ModelProto> {
    let d = model.config.d_model;
    let mut g = Graph::new();
    let source_axes: Vec<Axis> = vec!["batch".into(), "source_len".into()];
    let ids = g.input(names::SOURCE_IDS, ElemType::I64, &source_axes);
    let mask = g.input(names::SOURCE_MASK, ElemType::F32, &source_axes);
    let table = embedding_table(&mut g, &model.embed)?;
    let lens = sequence_lens(&mut g, &mask);
    let mut x = g.scoped("embed", |g| embed(g, &table, &ids, d));
    for (i, layer) in model.encoder.layers.iter().enumerate() {
        x = g.scoped(&format!("encoder.layers.{i}"), |g| {
            crate::recurrent::sequence(g, layer, &x, &lens)
        })?;
    }
    g.output(
        &x,
        names::MEMORY_CONTEXT,
        ElemType::F32,
        &["batch".into(), "source_len".into(), d.into()],
    );
    g.output(
        &mask,
        names::MEMORY_SOURCE_MASK,
        ElemType::F32,
        &source_axes,
    );
    Ok(g.finish(
        "encoder",
        "Source sentence -> the top bi-LSTM state of every source position.",
    ))
}

fn decoder_step(model: &RnnNmt) -> Result<ModelProto> {
    let d = model.config.d_model;
    let mut g = Graph::new();
    let ids = g.input(names::TARGET_IDS, ElemType::I64, &["batch".into()]);
    // Part of the contract; positions are implicit in the recurrent state.
    g.input(names::POSITIONS, ElemType::I64, &["batch".into()]);
    let memory = g.input(
        names::MEMORY_CONTEXT,
        ElemType::F32,
        &["batch".into(), "source_len".into(), d.into()],
    );
    let source_mask = g.input(
        names::MEMORY_SOURCE_MASK,
        ElemType::F32,
        &["batch".into(), "source_len".into()],
    );
    let state_axes: Vec<Axis> = vec!["batch".into(), d.into()];
    let carried = |g: &mut Graph, state: &str| {
        let past = g.input(&names::past(state), ElemType::F32, &state_axes);
        let present = names::present(state);
        g.output(&present, &present, ElemType::F32, &state_axes);
        (past, present)
    };
    let feed = carried(&mut g, names::INPUT_FEED_STATE);
    let layer_states: Vec<_> = (0..model.decoder.layers.len())
        .map(|i| {
            (
                carried(&mut g, &names::lstm_hidden_state(i)),
                carried(&mut g, &names::lstm_cell_state(i)),
            )
        })
        .collect();

    let table = embedding_table(&mut g, &model.embed)?;
    let word = g.scoped("embed", |g| embed(g, &table, &ids, d));
    // Input feeding: [y_{t-1} ; h~_{t-1}].
    let input = g.concat(&[&word, &feed.0], -1);
    let mut x = g.unsqueeze(&input, &[1]);
    for (i, (layer, (h, c))) in model.decoder.layers.iter().zip(&layer_states).enumerate() {
        x = g.scoped(&format!("decoder.layers.{i}"), |g| {
            crate::recurrent::step(g, layer, &x, (&h.0, &h.1), Some((&c.0, &c.1)))
        })?;
    }
    let attentional = g.scoped("decoder.attention", |g| -> Result<String> {
        // Luong's dot score h_t . h_s: [batch, 1, d] x [batch, d, source_len].
        let keys = g.transpose(&memory, &[0, 2, 1]);
        let scores = g.matmul(&x, &keys);
        let bias = padding_bias(g, &source_mask);
        let bias = g.unsqueeze(&bias, &[1]);
        let scores = g.add(&scores, &bias);
        let weights = g.softmax_last(&scores);
        let context = g.matmul(&weights, &memory);
        let both = g.concat(&[&context, &x], -1);
        let out = linear(g, &model.decoder.attn_out, &both, "attn_out")?;
        let out = g.op("Tanh", &[&out], vec![]);
        Ok(g.squeeze(&out, &[1]))
    })?;
    g.op_into("Identity", &[&attentional], vec![], &feed.1);
    tied_logits(&mut g, &attentional, &table, model.config.vocab_size);
    Ok(g.finish(
        "decoder_step",
        "One greedy decoding step: LSTM states and input feed in, logits and new states out.",
    ))
}

/// The decoder state of the step graph (listed in the manifest).
pub fn decoder_state(model: &RnnNmt) -> Vec<StateSpec> {
    let dims = vec![Dim::Batch, Dim::Fixed(model.config.d_model)];
    std::iter::once(names::INPUT_FEED_STATE.to_string())
        .chain(
            (0..model.decoder.layers.len())
                .flat_map(|i| [names::lstm_hidden_state(i), names::lstm_cell_state(i)]),
        )
        .map(|name| StateSpec {
            name,
            dims: dims.clone(),
        })
        .collect()
}

/// `(encoder.onnx, decoder.onnx)` for `model`.
pub fn export(model: &RnnNmt) -> Result<(ModelProto, ModelProto)> {
    Ok((encoder(model)?, decoder_step(model)?))
}
