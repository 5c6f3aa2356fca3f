//! Names of the ONNX graph inputs and outputs: the decoder-step contract.
//!
//! Encoder: `source_ids` `[batch, source_len]` i64 and `source_mask` `[batch, source_len]` f32
//! (1 = token, 0 = padding) in; every output is named `memory.*`, batch-first, and is fed
//! unchanged to the decoder input of the same name at every step (cross-attention keys and
//! values are therefore computed once per sentence).
//!
//! Decoder, one step for a batch of rows that may sit at different positions:
//! `target_ids` `[batch]` i64 (the previous token), `positions` `[batch]` i64 (its position,
//! 0 for BOS), every `memory.*`, and every `past.<state>` in; `logits` `[batch, vocab]` and
//! `present.<state>` out. The states are listed in the manifest with their shapes. A state
//! without a time axis is carried whole: `present.<state>` is the next step's
//! `past.<state>`. A state with one is a cache the server keeps in place: `past.<state>` has
//! at least `positions[r]` columns, of which row `r` owns the first `positions[r]` (the graph
//! masks the rest by the position, whatever they hold), and `present.<state>` is this step's
//! column alone, which the server writes at column `positions[r]` of row `r`. So the graph
//! never copies a cache, and a row that joins or leaves a batch moves no other row's.
//!
//! Zero padding means "absent" in the memory: rows of different source lengths share a
//! batch padded with zeros, so graphs must read a 0 in `memory.source_mask` as padding, and
//! must give zero state the meaning of "nothing seen yet".

pub const SOURCE_IDS: &str = "source_ids";
pub const SOURCE_MASK: &str = "source_mask";
pub const TARGET_IDS: &str = "target_ids";
pub const POSITIONS: &str = "positions";
/// `[batch]` int64, length-aware decoders only: the length each row is asked for (target
/// subwords, EOS not counted), constant over a row's steps.
pub const TARGET_LENGTHS: &str = "target_lengths";
pub const LOGITS: &str = "logits";

pub const MEMORY_PREFIX: &str = "memory.";
pub const PAST_PREFIX: &str = "past.";
pub const PRESENT_PREFIX: &str = "present.";

/// Source mask as the decoder sees it (the encoder passes its input through).
pub const MEMORY_SOURCE_MASK: &str = "memory.source_mask";

pub fn memory_cross_key(layer: usize) -> String {
    format!("{MEMORY_PREFIX}cross_key.{layer}")
}
pub fn memory_cross_value(layer: usize) -> String {
    format!("{MEMORY_PREFIX}cross_value.{layer}")
}

/// Every source position's top encoder state `[batch, source_len, d]` (the RNN-NMT
/// baseline's attention reads it at every step).
pub const MEMORY_CONTEXT: &str = "memory.context";

/// State names (without the `past.`/`present.` prefix).
pub fn self_key_state(layer: usize) -> String {
    format!("self_key.{layer}")
}
pub fn self_value_state(layer: usize) -> String {
    format!("self_value.{layer}")
}
/// Hidden state `[batch, hidden]` of the decoder's recurrent position encoder (GRU, LSTM,
/// or Chen et al.'s recurrent embedding); zero before the first token.
pub const POSITION_RNN_HIDDEN_STATE: &str = "position_rnn.h";
/// Cell state `[batch, hidden]` of an LSTM position encoder.
pub const POSITION_RNN_CELL_STATE: &str = "position_rnn.c";

/// RNN-NMT decoder layer `layer`'s LSTM hidden and cell states `[batch, d]`.
pub fn lstm_hidden_state(layer: usize) -> String {
    format!("lstm_h.{layer}")
}
pub fn lstm_cell_state(layer: usize) -> String {
    format!("lstm_c.{layer}")
}
/// RNN-NMT's input feed: the previous step's attentional vector `[batch, d]`.
pub const INPUT_FEED_STATE: &str = "input_feed";

pub fn past(state: &str) -> String {
    format!("{PAST_PREFIX}{state}")
}
pub fn present(state: &str) -> String {
    format!("{PRESENT_PREFIX}{state}")
}

/// Length predictor graph (a separate file, see `LengthPredictorSpec`): WordPiece ids
/// `[batch, len]` i64 with `[CLS]` first and `[SEP]` last, and their mask `[batch, len]` i64
/// (1 = token, 0 = padding) in; the predicted target length `[batch]` f32 out (target
/// subwords of the translation model, EOS not counted, unrounded).
pub const PREDICTOR_INPUT_IDS: &str = "input_ids";
pub const PREDICTOR_ATTENTION_MASK: &str = "attention_mask";
pub const PREDICTED_LENGTHS: &str = "predicted_lengths";

/// The domain of this project's fused operators. Each is a model-local ONNX function: a
/// runtime that has no kernel for it runs its body of standard operators (ONNX Runtime
/// inlines it), the engine runs its own kernel in one node (`engine/src/fused.rs`).
pub const FUSED_DOMAIN: &str = "nmt";
/// Version of [`FUSED_DOMAIN`] the graphs import.
pub const FUSED_DOMAIN_VERSION: i64 = 1;
/// One query per row attending over keys and values with an additive bias:
/// `softmax(q k^T * scale + bias) v`. Inputs `q` `[batch, heads, 1, head_dim]`, `keys` and
/// `values` `[batch, heads, len, head_dim]`, `bias` `[batch, 1, 1, len]`, `scale` a float
/// scalar; output `[batch, heads, 1, head_dim]`. A column whose bias is at most
/// [`SKIPPED_BIAS`] adds nothing (its probability underflows to 0), so a kernel may skip
/// it: a row reads only its own source, not the batch's longest.
pub const ATTENTION_STEP: &str = "AttentionStep";
/// A decoder step's self-attention with Shaw et al.'s relative keys and values: one query
/// per row over its cache `past_keys`/`past_values` `[batch, heads, past_len, head_dim]` and
/// its own `new_key`/`new_value` `[batch, heads, 1, head_dim]`; `bias`
/// `[batch, 1, 1, past_len + 1]` leaves a row its own cache columns (a prefix) and its new
/// one; `rows` `[batch, heads, 1, past_len + 1]` int64 are the relative tables' rows
/// (`[2k + 1, head_dim]` keys and values) of those columns; `split` (`[past_len, 1]`) and
/// `zeros` (`[batch, heads, 1, 2k + 1]`) serve the function body only. Output
/// `[batch, heads, 1, head_dim]`. As [`ATTENTION_STEP`], a column whose bias is at most
/// [`SKIPPED_BIAS`] may be skipped: a row reads its own cache, not the batch's longest.
pub const RELATIVE_CACHED_ATTENTION_STEP: &str = "RelativeCachedAttentionStep";
/// [`RELATIVE_CACHED_ATTENTION_STEP`] without relative tables (decoders with absolute or no
/// positions, imported Marian models): inputs `q`, `past_keys`, `past_values`, `new_key`,
/// `new_value`, `bias`, `split`, `scale` as there.
pub const CACHED_ATTENTION_STEP: &str = "CachedAttentionStep";
/// `x W + bias` with int8 weights, each row of `x` quantized on its own scale so that its
/// result does not depend on the other rows: inputs `x` float `[.., K]`, `weights` int8
/// `[K, N]` (one scale per column), `scales` float `[N]`, `bias` float `[N]`; output float
/// `[.., N]`. A row's scale is `max(max |x_row|, 1e-30) * (1/127)`, its values
/// `x_row / scale` rounded half to even and shifted by 128 to uint8; the output is
/// `(sum_k q_k W_kn - 128 sum_k W_kn) * scales_n * scale + bias_n`, in that order (ONNX
/// Runtime's `MatMulIntegerToFloat` and an `Add` in the body).
pub const ROW_QUANTIZED_MATMUL: &str = "RowQuantizedMatMul";
/// The bias at or below which a column of a fused attention step has probability 0 (the graphs
/// mask with -1e9; `exp` of anything below about -104 is 0 in float32).
pub const SKIPPED_BIAS: f32 = -1e4;
