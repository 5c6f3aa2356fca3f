//! ONNX `GRU` and `LSTM` nodes for [`nmt_train::model::recurrent::Rnn`]: the whole sequence (the
//! encoder, with `sequence_lens` so that the backward direction starts at each row's last
//! real token) or one step from a carried state (the decoder).

use candle_core::Tensor;
use nmt_train::model::recurrent::{Cell, Direction, Rnn};

use crate::graph::{attr_int, attr_string, Graph};

type Result<T> = candle_core::Result<T>;

/// Gate blocks in ONNX's order, as indices into PyTorch's: GRU `r z n` -> `z r h`, LSTM
/// `i f g o` -> `i o f c`.
fn onnx_gate_order(cell: Cell) -> &'static [usize] {
    match cell {
        Cell::Gru => &[1, 0, 2],
        Cell::Lstm => &[0, 3, 1, 2],
    }
}

/// `t` `[gates * hidden, ..]` with its gate blocks in ONNX's order, flattened.
fn reorder_gates(t: &Tensor, cell: Cell, hidden: usize) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(t.elem_count());
    for &gate in onnx_gate_order(cell) {
        out.extend(
            t.narrow(0, gate * hidden, hidden)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
    }
    Ok(out)
}

/// `W` `[dirs, gates*h, in]`, `R` `[dirs, gates*h, h]`, `B` `[dirs, 2*gates*h]`.
fn weights(g: &mut Graph, rnn: &Rnn) -> Result<[String; 3]> {
    let directions: Vec<&Direction> = std::iter::once(&rnn.forward)
        .chain(rnn.backward.as_ref())
        .collect();
    let (rows, input) = rnn.forward.weight_ih.dims2()?;
    let h = rnn.hidden;
    let (mut w, mut r, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for d in &directions {
        w.extend(reorder_gates(&d.weight_ih, rnn.cell, h)?);
        r.extend(reorder_gates(&d.weight_hh, rnn.cell, h)?);
        b.extend(reorder_gates(&d.bias_ih, rnn.cell, h)?);
        b.extend(reorder_gates(&d.bias_hh, rnn.cell, h)?);
    }
    let n = directions.len();
    Ok([
        g.weight("W", &[n, rows, input], &w),
        g.weight("R", &[n, rows, h], &r),
        g.weight("B", &[n, 2 * rows], &b),
    ])
}

fn attributes(rnn: &Rnn) -> Vec<crate::proto::AttributeProto> {
    let mut attributes = vec![
        attr_int("hidden_size", rnn.hidden as i64),
        attr_string(
            "direction",
            if rnn.backward.is_some() {
                "bidirectional"
            } else {
                "forward"
            },
        ),
    ];
    if rnn.cell == Cell::Gru {
        // PyTorch applies the reset gate after the recurrent product.
        attributes.push(attr_int("linear_before_reset", 1));
    }
    attributes
}

fn op_type(cell: Cell) -> &'static str {
    match cell {
        Cell::Gru => "GRU",
        Cell::Lstm => "LSTM",
    }
}

/// The whole sequence `x` `[batch, len, in]` from zero state -> `[batch, len, output_dim]`
/// (directions concatenated). `sequence_lens` is int32 `[batch]`.
pub fn sequence(g: &mut Graph, rnn: &Rnn, x: &str, sequence_lens: &str) -> Result<String> {
    let [w, r, b] = weights(g, rnn)?;
    let time_major = g.transpose(x, &[1, 0, 2]);
    let outputs = g.op_outputs(
        op_type(rnn.cell),
        &[&time_major, &w, &r, &b, sequence_lens],
        attributes(rnn),
        1,
    );
    // Y is [len, dirs, batch, hidden].
    let y = g.transpose(&outputs[0], &[2, 0, 1, 3]);
    Ok(g.reshape(&y, &[0, 0, -1]))
}

/// One step of a forward layer: `x` `[batch, 1, in]` and the carried state `[batch, hidden]`
/// (`past_c` for the LSTM) -> the output `[batch, 1, hidden]`; the new state is written to
/// `present_h` (and `present_c`).
pub fn step(
    g: &mut Graph,
    rnn: &Rnn,
    x: &str,
    (past_h, present_h): (&str, &str),
    cell_state: Option<(&str, &str)>,
) -> Result<String> {
    let [w, r, b] = weights(g, rnn)?;
    let time_major = g.transpose(x, &[1, 0, 2]);
    let initial_h = g.unsqueeze(past_h, &[0]);
    let mut inputs = vec![time_major, w, r, b, String::new(), initial_h];
    if let Some((past_c, _)) = cell_state {
        inputs.push(g.unsqueeze(past_c, &[0]));
    }
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let outputs = g.op_outputs(
        op_type(rnn.cell),
        &inputs,
        attributes(rnn),
        if cell_state.is_some() { 3 } else { 2 },
    );
    let axes = g.ints(&[0]);
    g.op_into("Squeeze", &[&outputs[1], &axes], vec![], present_h);
    if let Some((_, present_c)) = cell_state {
        g.op_into("Squeeze", &[&outputs[2], &axes], vec![], present_c);
    }
    Ok(g.unsqueeze(present_h, &[1]))
}
