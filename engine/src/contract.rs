//! The decoder-step contract (`model_package::names`) checked against a package's graphs:
//! the names, element types and ranks of the encoder's and decoder's inputs and outputs, and
//! the decoder state the manifest lists. Pure: it sees the graphs' ports, not a session, so
//! it is tested without ONNX Runtime; [`crate::onnx`] reads the ports from the sessions.

use std::collections::{BTreeMap, BTreeSet};

use model_package::{files, names, Dim, Manifest, StateSpec};
use ort::value::TensorElementType;

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
}

/// One `past.<name>` / `present.<name>` pair (float32).
#[derive(Clone, Debug, PartialEq)]
pub struct StateSlot {
    pub spec: StateSpec,
    pub past: String,
    pub present: String,
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
#[error("the ONNX graphs do not match the decoder-step contract and the manifest: {}", .0.join("; "))]
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
    // Every encoder output is memory for the decoder, but the length head's prediction
    // (`nmt-export length-predictor --head states`), which the length predictor reads.
    let (predictions, encoder_outputs): (Vec<&Port>, Vec<&Port>) = encoder_outputs
        .iter()
        .partition(|p| p.name == names::PREDICTED_LENGTHS);
    for port in predictions {
        if port.ty != Some(Float32) || port.shape.len() != 1 {
            problems.push(format!(
                "{} output `{}` is {:?} of rank {}; predicted lengths are float32 [batch]",
                files::ENCODER,
                port.name,
                port.ty,
                port.shape.len()
            ));
        }
    }
    if encoder_outputs.is_empty() {
        problems.push(format!("{} has no memory outputs", files::ENCODER));
    }
    for port in &encoder_outputs {
        if !port.name.starts_with(names::MEMORY_PREFIX) {
            problems.push(format!(
                "{} output `{}` is not named `{}*`",
                files::ENCODER,
                port.name,
                names::MEMORY_PREFIX
            ));
        } else if port.ty != Some(Float32) {
            problems.push(format!(
                "{} output `{}` is {:?}; memory is float32",
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
    let produced: BTreeSet<&str> = enc_out
        .keys()
        .copied()
        .filter(|&name| name != names::PREDICTED_LENGTHS)
        .collect();
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
        for port in [past_port, present_port] {
            if port.ty != Some(Float32) {
                problems.push(format!(
                    "{} `{}` is {:?}; decoder state is float32",
                    files::DECODER,
                    port.name,
                    port.ty
                ));
            }
        }
        if let Some(axis) = spec.time_axis() {
            if present_port.shape.get(axis) != Some(&1) {
                problems.push(format!(
                    "{} output `{present}` must be this step's cache column alone (size 1 on \
                     axis {axis}), not {:?}",
                    files::DECODER,
                    present_port.shape
                ));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::manifest;
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
                Port::new("past.position_rnn.h", Float32, &[-1, 4]),
            ],
            dec_out: vec![
                Port::new("logits", Float32, &[-1, 34]),
                Port::new("present.self_key.0", Float32, &[-1, 2, 1, 4]),
                Port::new("present.position_rnn.h", Float32, &[-1, 4]),
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
                ("past.position_rnn.h", "present.position_rnn.h")
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
    fn the_encoders_length_head_is_not_memory() {
        let mut g = graphs();
        g.enc_out
            .push(Port::new("predicted_lengths", Float32, &[-1]));
        let layout = check(&g, &manifest()).unwrap();
        assert!(!layout.memory.iter().any(|m| m == "predicted_lengths"));
        g.enc_out.pop();
        g.enc_out
            .push(Port::new("predicted_lengths", Float32, &[-1, -1]));
        let err = check(&g, &manifest()).unwrap_err().to_string();
        assert!(
            err.contains("predicted lengths are float32 [batch]"),
            "{err}"
        );
    }

    #[test]
    fn missing_and_extra_names_are_all_reported() {
        let mut g = graphs();
        g.dec_in.retain(|p| p.name != "past.position_rnn.h");
        g.dec_out.push(Port::new("present.extra", Float32, &[-1]));
        g.enc_out.push(Port::new("hidden", Float32, &[-1, -1, 32]));
        let err = check(&g, &manifest()).unwrap_err().to_string();
        assert!(err.contains("no input `past.position_rnn.h`"), "{err}");
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
        g.dec_out[1] = Port::new("present.self_key.0", Float32, &[-1, 2, -1, 4]);
        g.dec_out[2] = Port::new("present.position_rnn.h", Int64, &[-1, 4]);
        let err = check(&g, &manifest()).unwrap_err().to_string();
        assert!(
            err.contains("`past.self_key.0` has size 3 on axis 1"),
            "{err}"
        );
        assert!(err.contains("99 columns"), "{err}");
        assert!(err.contains("`target_ids` has rank 2"), "{err}");
        assert!(err.contains("`source_mask` is Some(Int64)"), "{err}");
        assert!(
            err.contains("`present.self_key.0` must be this step's cache column alone"),
            "{err}"
        );
        assert!(
            err.contains("`present.position_rnn.h` is Some(Int64); decoder state is float32"),
            "{err}"
        );
    }

    #[test]
    fn state_batch_axis_must_come_first() {
        let mut m = manifest();
        m.decoder_state[1].dims = vec![Dim::Time, Dim::Batch];
        let err = check(&graphs(), &m).unwrap_err().to_string();
        assert!(err.contains("the batch must be axis 0"), "{err}");
    }
}
