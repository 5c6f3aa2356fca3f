//! The fused operators the graphs use ([`model_package::names::FUSED_DOMAIN`]), each defined
//! by a body of standard ONNX operators: ONNX Runtime without the engine's kernels (Python,
//! another host) inlines the body and runs what the graph ran before the fusion; the engine
//! registers a kernel that runs the whole operator as one node (`engine/src/fused.rs`).

use model_package::names;

use crate::graph::{attr_int, attr_ints, attr_string, BodyNode, Fused};

/// [`names::ATTENTION_STEP`]: `softmax(q k^T * scale + bias) v` for one query per row.
/// ONNX Runtime fuses the body's transpose and scale into one `FusedMatMul`, as it did
/// before the body was a function.
pub fn attention_step() -> Fused {
    Fused {
        op_type: names::ATTENTION_STEP,
        doc: "One query per row over keys and values [batch, heads, len, head_dim] with an \
              additive bias [batch, 1, 1, len]: softmax(q k^T * scale + bias) v. A column whose \
              bias is at most -1e4 has probability 0, so a kernel may skip it.",
        inputs: &["q", "keys", "values", "bias", "scale"],
        outputs: &["context"],
        body: vec![
            (
                "Transpose",
                vec!["keys"],
                vec!["keys_t"],
                vec![attr_ints("perm", &[0, 1, 3, 2])],
            ),
            ("MatMul", vec!["q", "keys_t"], vec!["scores"], vec![]),
            ("Mul", vec!["scores", "scale"], vec!["scaled"], vec![]),
            ("Add", vec!["scaled", "bias"], vec!["biased"], vec![]),
            (
                "Softmax",
                vec!["biased"],
                vec!["probs"],
                vec![attr_int("axis", -1)],
            ),
            ("MatMul", vec!["probs", "values"], vec!["context"], vec![]),
        ],
    }
}

/// A decoder step's self-attention over the row's cache and its own new column:
/// [`names::RELATIVE_CACHED_ATTENTION_STEP`] with Shaw et al.'s relative keys and values
/// (`relative`), [`names::CACHED_ATTENTION_STEP`] without. The body is the graph written before
/// the fusion (by the Transformer's exporter and the Marian importer alike), node for node.
pub fn cached_attention_step(relative: bool) -> Fused {
    let perm = || vec![attr_ints("perm", &[0, 1, 3, 2])];
    let axis3 = || vec![attr_int("axis", 3)];
    let mut body: Vec<BodyNode> = vec![
        ("Transpose", vec!["past_keys"], vec!["past_kt"], perm()),
        ("Transpose", vec!["new_key"], vec!["new_kt"], perm()),
        ("MatMul", vec!["q", "past_kt"], vec!["past_scores"], vec![]),
        ("MatMul", vec!["q", "new_kt"], vec!["new_score"], vec![]),
        (
            "Concat",
            vec!["past_scores", "new_score"],
            vec!["scores"],
            axis3(),
        ),
    ];
    if relative {
        body.extend([
            (
                "Transpose",
                vec!["relative_keys"],
                vec!["a_t"],
                vec![attr_ints("perm", &[1, 0])],
            ),
            ("MatMul", vec!["q", "a_t"], vec!["by_row"], vec![]),
            (
                "GatherElements",
                vec!["by_row", "rows"],
                vec!["picked"],
                axis3(),
            ),
            (
                "Add",
                vec!["scores", "picked"],
                vec!["relative_scores"],
                vec![],
            ),
        ] as [BodyNode; 4]);
    }
    let scores = if relative {
        "relative_scores"
    } else {
        "scores"
    };
    let own = if relative { "own_context" } else { "context" };
    body.extend([
        ("Mul", vec![scores, "scale"], vec!["scaled"], vec![]),
        ("Add", vec!["scaled", "bias"], vec!["biased"], vec![]),
        (
            "Softmax",
            vec!["biased"],
            vec!["probs"],
            vec![attr_int("axis", -1)],
        ),
        (
            "Split",
            vec!["probs", "split"],
            vec!["past_probs", "new_prob"],
            axis3(),
        ),
        (
            "MatMul",
            vec!["past_probs", "past_values"],
            vec!["past_context"],
            vec![],
        ),
        (
            "MatMul",
            vec!["new_prob", "new_value"],
            vec!["new_context"],
            vec![],
        ),
        (
            "Add",
            vec!["past_context", "new_context"],
            vec![own],
            vec![],
        ),
    ] as [BodyNode; 7]);
    if relative {
        body.extend([
            (
                "ScatterElements",
                vec!["zeros", "rows", "probs"],
                vec!["mass"],
                vec![attr_int("axis", 3), attr_string("reduction", "add")],
            ),
            (
                "MatMul",
                vec!["mass", "relative_values"],
                vec!["relative_context"],
                vec![],
            ),
            (
                "Add",
                vec!["own_context", "relative_context"],
                vec!["context"],
                vec![],
            ),
        ] as [BodyNode; 3]);
    }
    let cache: &[&str] = &[
        "q",
        "past_keys",
        "past_values",
        "new_key",
        "new_value",
        "bias",
        "split",
    ];
    let (op_type, inputs, doc): (_, &'static [&'static str], _) = match relative {
        true => (
            names::RELATIVE_CACHED_ATTENTION_STEP,
            &[
                "q",
                "past_keys",
                "past_values",
                "new_key",
                "new_value",
                "bias",
                "split",
                "relative_keys",
                "relative_values",
                "rows",
                "zeros",
                "scale",
            ],
            "One query per row over its cache [batch, heads, past_len, head_dim] and its new \
             key and value [batch, heads, 1, head_dim], with Shaw et al.'s relative keys and \
             values [2k + 1, head_dim] at table rows [batch, heads, 1, past_len + 1] and an \
             additive bias [batch, 1, 1, past_len + 1]; a cache column whose bias is at most \
             -1e4 has probability 0, so a kernel may skip it.",
        ),
        false => (
            names::CACHED_ATTENTION_STEP,
            &[
                "q",
                "past_keys",
                "past_values",
                "new_key",
                "new_value",
                "bias",
                "split",
                "scale",
            ],
            "One query per row over its cache [batch, heads, past_len, head_dim] and its new \
             key and value [batch, heads, 1, head_dim] with an additive bias \
             [batch, 1, 1, past_len + 1]; a cache column whose bias is at most -1e4 has \
             probability 0, so a kernel may skip it.",
        ),
    };
    debug_assert!(inputs.starts_with(cache));
    Fused {
        op_type,
        doc,
        inputs,
        outputs: &["context"],
        body,
    }
}
