//! ONNX graphs of [`nmt_train::model::Transformer`]: the encoder (run once per sentence) and
//! one decoder step with a KV cache, following the contract in `model_package::names`.
//!
//! Every op mirrors the candle forward pass in the same order (scale after `QK^T`, mask bias
//! added after scaling, sinusoid angles from the same f32 constants), so the two agree to
//! float rounding; the parity tests hold them to 1e-4.

use candle_core::Tensor;
use candle_nn::Linear;
use model_package::{
    names, AbsolutePosition, Dim, LengthEncoding, ModelConfig, NormPlacement, StateSpec,
};
use nmt_train::model::recurrent::{Cell, Rnn};
use nmt_train::model::{
    length_ratio_exponents, sinusoid_inverse_frequencies, Attention, FeedForward, LayerNorm,
    PositionEncoder, RelativeTables, Transformer, MASKED_SCORE,
};

use crate::graph::{attr_int, attr_string, Axis, ElemType, Graph};
use crate::proto::ModelProto;

type Result<T> = candle_core::Result<T>;

pub(crate) fn values(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

const EMBED_TABLE: &str = "embed.weight";
const POSITION_TABLE: &str = "pos_embed.weight";
const RELATIVE_KEYS: &str = "relative_keys";
const RELATIVE_VALUES: &str = "relative_values";
/// Names of the 2-D weights the graphs hold as the checkpoint does (lookup tables, read by
/// row); every other 2-D `.weight` is a linear layer's, held transposed ([`linear`]).
/// `nmt-export checkpoint` reads the graphs back by this rule.
pub(crate) const LOOKUP_TABLES: [&str; 4] =
    [EMBED_TABLE, POSITION_TABLE, RELATIVE_KEYS, RELATIVE_VALUES];

/// `x @ W^T + b` (candle stores `W` as `[out, in]`; the graph gets `W^T`).
pub(crate) fn linear(g: &mut Graph, layer: &Linear, x: &str, hint: &str) -> Result<String> {
    let w = layer.weight().t()?.contiguous()?;
    let (fan_in, fan_out) = w.dims2()?;
    let w = g.weight(&format!("{hint}.weight"), &[fan_in, fan_out], &values(&w)?);
    let y = g.matmul(x, &w);
    match layer.bias() {
        Some(b) => {
            let b = g.weight(&format!("{hint}.bias"), &[fan_out], &values(b)?);
            Ok(g.add(&y, &b))
        }
        None => Ok(y),
    }
}

fn layer_norm(g: &mut Graph, norm: &LayerNorm, x: &str, hint: &str) -> Result<String> {
    let d = norm.weight.dim(0)?;
    let w = g.weight(&format!("{hint}.weight"), &[d], &values(&norm.weight)?);
    let b = g.weight(&format!("{hint}.bias"), &[d], &values(&norm.bias)?);
    Ok(g.layer_norm(x, &w, &b, norm.eps))
}

/// The residual block of `nmt_train::model::residual`, without dropout. `sublayer_name` is
/// the sublayer's field (`self_attn`, `cross_attn`, `ffn`): its weights are named under it
/// and the norm's `<sublayer_name>_norm` beside it, as the checkpoint keys them
/// (`nmt-export checkpoint` reads them back by these names).
fn residual(
    g: &mut Graph,
    x: &str,
    norm: &LayerNorm,
    placement: NormPlacement,
    sublayer_name: &str,
    sublayer: impl FnOnce(&mut Graph, &str) -> Result<String>,
) -> Result<String> {
    let norm_name = format!("{sublayer_name}_norm");
    match placement {
        NormPlacement::Pre => {
            let h = layer_norm(g, norm, x, &norm_name)?;
            let y = g.scoped(sublayer_name, |g| sublayer(g, &h))?;
            Ok(g.add(x, &y))
        }
        NormPlacement::Post => {
            let y = g.scoped(sublayer_name, |g| sublayer(g, x))?;
            let sum = g.add(x, &y);
            layer_norm(g, norm, &sum, &norm_name)
        }
    }
}

/// One layer's Shaw relative vectors, keys and (unless the layer has keys only) values: its
/// tables `[2k + 1, head_dim]`. Encoder and decoder step alike meet them once per query
/// and pick per column, so the relative terms cost O(len * k), never a table row per
/// (query, key) pair (`[len, len, head_dim]`, 268 MB per table at 1,024 subwords).
struct Relative {
    keys: String,
    values: Option<String>,
}

/// Where every (query, key) pair of the encoder falls in the relative tables, the same for
/// every layer. The per-query products are laid out query-major (`[len, 2k + 1, batch,
/// heads]`) so that the indices need not be repeated per sentence and head.
struct EncoderRelative {
    /// `[len, len, 1]` int64: the table row of key `j` for query `i` (`GatherND` with
    /// `batch_dims` 1 over the queries).
    rows: String,
    /// `[len, len, 2]` int64: `(i, row)` of every pair, to sum probabilities per table row
    /// (`ScatterND` with `add`).
    pairs: String,
    /// `[len, 2k + 1, batch, heads]` zeros to sum them into.
    zeros: String,
}

/// The attention columns of a decoder step (the cache's, then the new one), the same for
/// every layer.
struct StepColumns {
    /// `[batch, 1, 1, past_len + 1]`: 0 for the columns a row owns, a large negative
    /// number for the others.
    bias: String,
    /// `[past_len, 1]`, to split the probabilities into the cache's and the new column's.
    split: String,
    /// With relative tables: where each column falls in them.
    relative: Option<StepRelative>,
}

/// A layer's keys and values of a decoder step: its cache (`past`), the step's own
/// (`new`), and its relative tables if it has them.
struct LayerCache<'a> {
    past: (&'a str, &'a str),
    new: (&'a str, &'a str),
    tables: Option<Relative>,
}

/// What a query attends to: `keys` and `values` `[batch, heads, k_len, head_dim]` and an
/// additive `bias` broadcastable to the scores.
struct Attended<'a> {
    keys: &'a str,
    values: &'a str,
    bias: &'a str,
}

/// Where each attention column of a decoder step falls in the relative tables, the same for
/// every layer.
struct StepRelative {
    /// `[batch, heads, 1, past_len + 1]` int64 rows of the tables.
    rows: String,
    /// `[batch, heads, 1, 2k + 1]` zeros, to sum probabilities per table row into.
    zeros: String,
}

/// The shared embedding table `[vocab, d]` as an initializer.
pub(crate) fn embedding_table(g: &mut Graph, embed: &Tensor) -> Result<String> {
    let (v, d) = embed.dims2()?;
    Ok(g.weight(EMBED_TABLE, &[v, d], &values(embed)?))
}

/// Scaled embeddings of `ids` (any shape `[..]`) -> `[.., d]`.
pub(crate) fn embed(g: &mut Graph, table: &str, ids: &str, d_model: usize) -> String {
    let x = g.gather(table, ids, 0);
    let scale = g.float_scalar((d_model as f32).sqrt());
    g.mul(&x, &scale)
}

/// `[batch, len]` 1/0 mask -> the same shape of additive bias: 0, or [`MASKED_SCORE`] at
/// padding.
pub(crate) fn padding_bias(g: &mut Graph, mask: &str) -> String {
    let one = g.float_scalar(1.0);
    let shifted = g.sub(mask, &one);
    let big = g.float_scalar(-MASKED_SCORE as f32);
    g.mul(&shifted, &big)
}

/// A decoder step's view of its self-attention cache `past_key`
/// `[batch, heads, past_len, head_dim]`: row `r` sees its first `positions[r]` cache columns
/// and its new column. Shared by this project's decoders and imported ones (`marian`).
pub(crate) struct CacheView {
    /// Column indices `[1, past_len]`.
    pub columns: String,
    /// Each row's position `[batch, 1]`.
    pub rows_at: String,
    /// The batch size `[1]`, the new column's shape `[batch, 1]`, `past_len` `[1]`, and `[1]`.
    pub batch: String,
    pub column_shape: String,
    pub past_len: String,
    pub one_column: String,
    /// The additive bias `[batch, 1, 1, past_len + 1]`.
    pub bias: String,
    /// `[past_len, 1]`: the probabilities' split into the cache's and the new column's.
    pub split: String,
}

pub(crate) fn cache_view(g: &mut Graph, past_key: &str, positions: &str) -> CacheView {
    let shape = g.op("Shape", &[past_key], vec![]);
    let past_len = g.slice(&shape, 0, 2, 3);
    let zero = g.int_scalar(0);
    let one = g.int_scalar(1);
    let len = g.squeeze(&past_len, &[0]);
    let columns = g.op("Range", &[&zero, &len, &one], vec![]);
    let columns = g.unsqueeze(&columns, &[0]);
    let rows_at = g.unsqueeze(positions, &[1]);
    let owned = g.op("Less", &[&columns, &rows_at], vec![]);
    let owned = g.cast(&owned, ElemType::F32);
    let batch = g.op("Shape", &[positions], vec![]);
    let one_column = g.ints(&[1]);
    let column_shape = g.concat(&[&batch, &one_column], 0);
    let ones = g.float_scalar(1.0);
    let ones = g.op("Expand", &[&ones, &column_shape], vec![]);
    let visible = g.concat(&[&owned, &ones], 1);
    let bias = padding_bias(g, &visible);
    let bias = g.unsqueeze(&bias, &[1, 2]);
    let split = g.concat(&[&past_len, &one_column], 0);
    CacheView {
        columns,
        rows_at,
        batch,
        column_shape,
        past_len,
        one_column,
        bias,
        split,
    }
}

/// `[batch]` int32 count of the real positions of each row of a 1/0 `mask` (the
/// `sequence_lens` of ONNX's recurrent ops).
pub(crate) fn sequence_lens(g: &mut Graph, mask: &str) -> String {
    g.scoped("sequence_lens", |g| {
        let axes = g.ints(&[1]);
        let lens = g.op("ReduceSum", &[mask, &axes], vec![attr_int("keepdims", 0)]);
        g.cast(&lens, ElemType::I32)
    })
}

/// The step graph's final projection: logits `[batch, vocab]` from `x` `[batch, d]`
/// through the tied embeddings (`transB` rather than a stored transpose).
pub(crate) fn tied_logits(g: &mut Graph, x: &str, table: &str, vocab: usize) {
    let logits = g.op("Gemm", &[x, table], vec![attr_int("transB", 1)]);
    g.output(
        &logits,
        names::LOGITS,
        ElemType::F32,
        &["batch".into(), vocab.into()],
    );
}

struct Exporter<'a> {
    model: &'a Transformer,
    config: &'a ModelConfig,
}

impl Exporter<'_> {
    /// `[batch, len, d]` -> `[batch, heads, len, head_dim]`
    fn split_heads(&self, g: &mut Graph, x: &str) -> String {
        let (h, dh) = (self.config.num_heads as i64, self.config.head_dim() as i64);
        let x = g.reshape(x, &[0, 0, h, dh]);
        g.transpose(&x, &[0, 2, 1, 3])
    }

    /// [`Self::split_heads`] of a decoder step's `[batch, d]`, written to `out`: with one
    /// position, the heads go in front of it by a reshape, not a transpose.
    fn split_step_heads(&self, g: &mut Graph, x: &str, out: &str) {
        let (h, dh) = (self.config.num_heads as i64, self.config.head_dim() as i64);
        let shape = g.ints(&[0, h, 1, dh]);
        g.op_into("Reshape", &[x, &shape], vec![], out);
    }

    /// Queries of `attn` for `query`: `[batch, heads, q_len, head_dim]`.
    fn queries(&self, g: &mut Graph, attn: &Attention, query: &str, step: bool) -> Result<String> {
        let q = linear(g, &attn.q_proj, query, "q_proj")?;
        Ok(if step {
            let out = g.fresh("q_heads");
            self.split_step_heads(g, &q, &out);
            out
        } else {
            self.split_heads(g, &q)
        })
    }

    /// Attention of `query` `[batch, q_len, d]` over precomputed heads
    /// (`keys`/`values` `[batch, heads, k_len, head_dim]`) with an additive `bias`, and, in
    /// the encoder, Shaw et al.'s relative vectors when the layer has them: every query
    /// meets all `2k + 1` relative keys once and each column picks its own (`GatherND`);
    /// the probabilities are summed per table row (`ScatterND` with `add`) before meeting
    /// the relative values. `step`: a decoder step's single query.
    fn attend(
        &self,
        g: &mut Graph,
        attn: &Attention,
        query: &str,
        Attended { keys, values, bias }: Attended<'_>,
        relative: Option<(&Relative, &EncoderRelative)>,
        step: bool,
    ) -> Result<String> {
        if step && relative.is_none() {
            // A decoder step's cross-attention: one fused node, whose kernel in the engine
            // reads each row's own source rather than the batch's longest.
            let q = self.queries(g, attn, query, true)?;
            let scale = self.scale(g);
            let context = g.fused(
                crate::fused::attention_step(),
                &[&q, keys, values, bias, &scale],
            );
            return self.merge_heads(g, attn, &context, true);
        }
        let q = self.queries(g, attn, query, step)?;
        let kt = g.transpose(keys, &[0, 1, 3, 2]);
        let mut scores = g.matmul(&q, &kt);
        // Shaw et al.: q . (k_j + a_ij), summed before the scale as in candle.
        if let Some((tables, at)) = relative {
            // [batch, heads, len, dh] x [dh, 2k + 1], then query-major for the pick.
            let a_t = g.transpose(&tables.keys, &[1, 0]);
            let by_row = g.matmul(&q, &a_t);
            let by_query = g.transpose(&by_row, &[2, 3, 0, 1]);
            let picked = g.op(
                "GatherND",
                &[&by_query, &at.rows],
                vec![attr_int("batch_dims", 1)],
            );
            let picked = g.transpose(&picked, &[2, 3, 0, 1]);
            scores = g.add(&scores, &picked);
        }
        let probs = self.softmax_scores(g, &scores, bias);
        let mut context = g.matmul(&probs, values);
        if let Some((
            Relative {
                values: Some(values),
                ..
            },
            at,
        )) = relative
        {
            // Probability mass per table row, [len, 2k + 1, batch, heads] -> [batch, heads,
            // len, 2k + 1], then [.., 2k + 1] x [2k + 1, dh].
            let p_by_query = g.transpose(&probs, &[2, 3, 0, 1]);
            let mass = g.op(
                "ScatterND",
                &[&at.zeros, &at.pairs, &p_by_query],
                vec![attr_string("reduction", "add")],
            );
            let mass = g.transpose(&mass, &[2, 3, 0, 1]);
            let rel = g.matmul(&mass, values);
            context = g.add(&context, &rel);
        }
        self.merge_heads(g, attn, &context, step)
    }

    /// `head_dim^-0.5`, the scores' scale.
    fn scale(&self, g: &mut Graph) -> String {
        g.float_scalar(1.0 / (self.config.head_dim() as f32).sqrt())
    }

    /// Scaled `scores` plus the additive `bias`, normalised over the keys.
    fn softmax_scores(&self, g: &mut Graph, scores: &str, bias: &str) -> String {
        let scale = self.scale(g);
        let scores = g.mul(scores, &scale);
        let scores = g.add(&scores, bias);
        g.softmax_last(&scores)
    }

    /// `[batch, heads, len, head_dim]` -> the output projection of `[batch, len, d]` (for a
    /// `step`'s single position, `[batch, d]` by a reshape alone).
    fn merge_heads(
        &self,
        g: &mut Graph,
        attn: &Attention,
        context: &str,
        step: bool,
    ) -> Result<String> {
        let d = self.config.d_model as i64;
        let context = if step {
            g.reshape(context, &[0, d])
        } else {
            let context = g.transpose(context, &[0, 2, 1, 3]);
            g.reshape(&context, &[0, 0, d])
        };
        linear(g, &attn.out_proj, &context, "out_proj")
    }

    /// Self-attention of one decoder step: each row's query over its cache (`past`
    /// `[batch, heads, past_len, head_dim]`, of which `bias` leaves the row's own columns)
    /// and over its own new key and value (`new`, `[batch, heads, 1, head_dim]`). The two
    /// are attended side by side rather than joined, so the cache is only read: only the
    /// scores `[batch, heads, 1, past_len + 1]` are concatenated. With relative tables, every
    /// row's query meets all `2k + 1` relative keys once and each column picks its own
    /// (`GatherElements`); the probabilities are summed per relative row (`ScatterElements`
    /// with `add`) before meeting the relative values.
    fn attend_step(
        &self,
        g: &mut Graph,
        attn: &Attention,
        query: &str,
        cache: &LayerCache,
        columns: &StepColumns,
    ) -> Result<String> {
        let (past, new) = (cache.past, cache.new);
        let relative = cache.tables.as_ref().zip(columns.relative.as_ref());
        // One fused node, whose kernel in the engine reads each row's own cache columns rather
        // than the batch's longest: without relative tables, or with tables for keys and
        // values (keys alone stay standard ops below).
        let tables = match relative {
            None => Some(None),
            Some((
                Relative {
                    keys,
                    values: Some(values),
                },
                rel,
            )) => Some(Some([keys.as_str(), values, &rel.rows, &rel.zeros])),
            Some(_) => None,
        };
        if let Some(tables) = tables {
            let q = self.queries(g, attn, query, true)?;
            let scale = self.scale(g);
            let cache = [past.0, past.1, new.0, new.1, &columns.bias, &columns.split];
            let inputs: Vec<&str> = std::iter::once(q.as_str())
                .chain(cache)
                .chain(tables.into_iter().flatten())
                .chain([scale.as_str()])
                .collect();
            let op = crate::fused::cached_attention_step(tables.is_some());
            let context = g.fused(op, &inputs);
            return self.merge_heads(g, attn, &context, true);
        }
        let q = self.queries(g, attn, query, true)?;
        let past_kt = g.transpose(past.0, &[0, 1, 3, 2]);
        let new_kt = g.transpose(new.0, &[0, 1, 3, 2]);
        let past_scores = g.matmul(&q, &past_kt);
        let new_score = g.matmul(&q, &new_kt);
        let mut scores = g.concat(&[&past_scores, &new_score], 3);
        if let Some((tables, rel)) = relative {
            // [batch, heads, 1, dh] x [dh, 2k + 1].
            let a_t = g.transpose(&tables.keys, &[1, 0]);
            let by_row = g.matmul(&q, &a_t);
            let picked = g.op(
                "GatherElements",
                &[&by_row, &rel.rows],
                vec![attr_int("axis", 3)],
            );
            scores = g.add(&scores, &picked);
        }
        let probs = self.softmax_scores(g, &scores, &columns.bias);
        let split = g.op_outputs(
            "Split",
            &[&probs, &columns.split],
            vec![attr_int("axis", 3)],
            2,
        );
        let (past_probs, new_prob) = (&split[0], &split[1]);
        let past_context = g.matmul(past_probs, past.1);
        let new_context = g.matmul(new_prob, new.1);
        let mut context = g.add(&past_context, &new_context);
        if let Some((
            Relative {
                values: Some(values),
                ..
            },
            rel,
        )) = relative
        {
            // Probability mass per relative row: [batch, heads, 1, 2k + 1].
            let mass = g.op(
                "ScatterElements",
                &[&rel.zeros, &rel.rows, &probs],
                vec![attr_int("axis", 3), attr_string("reduction", "add")],
            );
            let rel_context = g.matmul(&mass, values);
            context = g.add(&context, &rel_context);
        }
        self.merge_heads(g, attn, &context, true)
    }

    fn project_heads(&self, g: &mut Graph, layer: &Linear, x: &str, hint: &str) -> Result<String> {
        let y = linear(g, layer, x, hint)?;
        Ok(self.split_heads(g, &y))
    }

    fn feed_forward(&self, g: &mut Graph, ffn: &FeedForward, x: &str) -> Result<String> {
        let h = linear(g, &ffn.fc1, x, "fc1")?;
        let h = g.op("Relu", &[&h], vec![]);
        linear(g, &ffn.fc2, &h, "fc2")
    }

    /// `[n]` int64 positions -> `[n, d]` (sin on even dims, cos on odd dims).
    fn sinusoid(&self, g: &mut Graph, positions: &str, d: usize) -> String {
        let inv = g.weight(
            "inverse_frequencies",
            &[d / 2],
            &sinusoid_inverse_frequencies(d),
        );
        let p = g.cast(positions, ElemType::F32);
        let p = g.unsqueeze(&p, &[1]);
        let angles = g.mul(&p, &inv);
        self.sin_cos(g, &angles, d)
    }

    /// `[n, d/2]` angles -> `[n, d]`: sin on even dims, cos on odd dims.
    fn sin_cos(&self, g: &mut Graph, angles: &str, d: usize) -> String {
        let sin = g.op("Sin", &[angles], vec![]);
        let cos = g.op("Cos", &[angles], vec![]);
        let sin = g.unsqueeze(&sin, &[-1]);
        let cos = g.unsqueeze(&cos, &[-1]);
        let pairs = g.concat(&[&sin, &cos], -1);
        g.reshape(&pairs, &[-1, d as i64])
    }

    /// `[batch, width]` length encodings of the decoder rows at int64 `positions` `[batch]`
    /// asked for `lengths` `[batch]`, as `nmt_train::model::length_encoding`.
    fn length_encoding(
        &self,
        g: &mut Graph,
        positions: &str,
        lengths: &str,
        width: usize,
    ) -> String {
        match self.config.length_encoding {
            LengthEncoding::None => unreachable!("only length-aware decoders read lengths"),
            LengthEncoding::Ldpe => {
                let remaining = g.sub(lengths, positions);
                self.sinusoid(g, &remaining, width)
            }
            LengthEncoding::Lrpe => {
                let exponents = g.weight(
                    "length_ratio_exponents",
                    &[width / 2],
                    &length_ratio_exponents(width),
                );
                let len = g.cast(lengths, ElemType::F32);
                let one = g.float_scalar(1.0);
                let len = g.op("Max", &[&len, &one], vec![]);
                let log_len = g.op("Log", &[&len], vec![]);
                let log_len = g.unsqueeze(&log_len, &[1]);
                let scaled = g.mul(&log_len, &exponents);
                let inv = g.op("Exp", &[&scaled], vec![]);
                let p = g.cast(positions, ElemType::F32);
                let p = g.unsqueeze(&p, &[1]);
                let angles = g.mul(&p, &inv);
                self.sin_cos(g, &angles, width)
            }
        }
    }

    /// `[n, width]` absolute position vectors of int64 `positions` `[n]`, if the model has
    /// them (`table`: the learned table from [`Self::position_table`]).
    fn absolute_positions(
        &self,
        g: &mut Graph,
        positions: &str,
        width: usize,
        table: &Option<String>,
    ) -> Option<String> {
        match (self.config.absolute_position, table) {
            (AbsolutePosition::Sinusoidal, _) => Some(self.sinusoid(g, positions, width)),
            (AbsolutePosition::Learned, Some(t)) => Some(g.gather(t, positions, 0)),
            _ => None,
        }
    }

    /// Scaled `words` `[batch, len, d]` with the order information of the stack's
    /// `position` encoder (run by `run_rnn`) and the absolute positions `absolute(width)`
    /// (broadcastable to `[batch, len, width]`), as `Transformer::embed_with_positions`.
    fn embed_with_positions(
        &self,
        g: &mut Graph,
        words: String,
        position: &Option<PositionEncoder>,
        run_rnn: impl FnOnce(&mut Graph, &Rnn, &str) -> Result<String>,
        absolute: impl FnOnce(&mut Graph, usize) -> Result<Option<String>>,
    ) -> Result<String> {
        let d = self.config.d_model;
        let (words, recurrent) = match position {
            Some(PositionEncoder::Rnn(rnn)) => (run_rnn(g, rnn, &words)?, None),
            Some(PositionEncoder::RecurrentEmbedding {
                embedding,
                head_split,
            }) => {
                let d_p = (d - self.config.recurrent_dim) as i64;
                let x_r = g.slice(&words, 2, d_p, d as i64);
                let r = run_rnn(g, &embedding.rnn, &x_r)?;
                let r = linear(g, &embedding.proj, &r, "proj")?;
                let r = g.op("Tanh", &[&r], vec![]);
                (g.slice(&words, 2, 0, d_p), Some((r, *head_split)))
            }
            None => (words, None),
        };
        let width = d - recurrent.as_ref().map_or(0, |_| self.config.recurrent_dim);
        let x = match absolute(g, width)? {
            Some(pe) => g.add(&words, &pe),
            None => words,
        };
        Ok(match recurrent {
            Some((r, false)) => g.concat(&[&x, &r], 2),
            Some((r, true)) => {
                let heads = self.config.num_heads as i64;
                let x = g.reshape(&x, &[0, 0, heads, -1]);
                let r = g.reshape(&r, &[0, 0, heads, -1]);
                let mixed = g.concat(&[&x, &r], 3);
                g.reshape(&mixed, &[0, 0, d as i64])
            }
            None => x,
        })
    }

    /// `clip(distance, -k, k) + k` of int64 `distances` (any shape): rows of the tables.
    fn relative_rows(&self, g: &mut Graph, distances: &str) -> String {
        let k = self.config.relative_clip as i64;
        let low = g.int_scalar(-k);
        let high = g.int_scalar(k);
        let clipped = g.op("Max", &[distances, &low], vec![]);
        let clipped = g.op("Min", &[&clipped, &high], vec![]);
        g.add(&clipped, &high)
    }

    /// A layer's relative tables `[2k + 1, head_dim]` as initializers.
    fn relative_tables(&self, g: &mut Graph, tables: &RelativeTables) -> Result<Relative> {
        let (n, dh) = tables.keys.dims2()?;
        let keys = g.weight(RELATIVE_KEYS, &[n, dh], &values(&tables.keys)?);
        let values = match &tables.values {
            Some(v) => Some(g.weight(RELATIVE_VALUES, &[n, dh], &values(v)?)),
            None => None,
        };
        Ok(Relative { keys, values })
    }

    /// The table row of every (query, key) pair of the encoder (key position minus query
    /// position, clipped), in the shapes [`EncoderRelative`] describes.
    fn encoder_relative(&self, g: &mut Graph, ids: &str, positions: &str) -> EncoderRelative {
        let keys = g.unsqueeze(positions, &[0]);
        let queries = g.unsqueeze(positions, &[1]);
        let distances = g.sub(&keys, &queries);
        let table_rows = self.relative_rows(g, &distances);
        let rows = g.unsqueeze(&table_rows, &[2]);
        let shape = g.op("Shape", &[&table_rows], vec![]);
        let query_of_pair = g.op("Expand", &[&queries, &shape], vec![]);
        let query_of_pair = g.unsqueeze(&query_of_pair, &[2]);
        let pairs = g.concat(&[&query_of_pair, &rows], 2);
        let len = g.slice(&shape, 0, 0, 1);
        let ids_shape = g.op("Shape", &[ids], vec![]);
        let batch = g.slice(&ids_shape, 0, 0, 1);
        let width = g.ints(&[2 * self.config.relative_clip as i64 + 1]);
        let heads = g.ints(&[self.config.num_heads as i64]);
        let zeros_shape = g.concat(&[&len, &width, &batch, &heads], 0);
        let zeros = g.op("ConstantOfShape", &[&zeros_shape], vec![]);
        EncoderRelative { rows, pairs, zeros }
    }

    /// The learned absolute position table `[max_positions, d]`, when the model has one.
    fn position_table(&self, g: &mut Graph) -> Result<Option<String>> {
        match &self.model.pos_embed {
            Some(table) => {
                let (n, d) = table.dims2()?;
                Ok(Some(g.weight(POSITION_TABLE, &[n, d], &values(table)?)))
            }
            None => Ok(None),
        }
    }

    fn embedding_table(&self, g: &mut Graph) -> Result<String> {
        embedding_table(g, &self.model.embed)
    }

    fn embed(&self, g: &mut Graph, table: &str, ids: &str) -> String {
        embed(g, table, ids, self.config.d_model)
    }

    /// `[batch, len]` 1/0 mask -> `[batch, 1, 1, len]` additive bias: masked keys get
    /// probability 0, as `nmt_train::ops::attention` never reads them.
    fn padding_bias(&self, g: &mut Graph, mask: &str) -> String {
        let bias = padding_bias(g, mask);
        g.unsqueeze(&bias, &[1, 2])
    }

    fn final_norm(&self, g: &mut Graph, norm: &Option<LayerNorm>, x: String) -> Result<String> {
        match norm {
            Some(n) => layer_norm(g, n, &x, "final_norm"),
            None => Ok(x),
        }
    }

    fn encoder(&self) -> Result<ModelProto> {
        let cfg = self.config;
        let mut g = Graph::new();
        let ids = g.input(
            names::SOURCE_IDS,
            ElemType::I64,
            &["batch".into(), "source_len".into()],
        );
        let mask = g.input(
            names::SOURCE_MASK,
            ElemType::F32,
            &["batch".into(), "source_len".into()],
        );
        let table = self.embedding_table(&mut g)?;
        let positions = g.scoped("positions", |g| {
            let shape = g.op("Shape", &[&ids], vec![]);
            let one = g.int_scalar(1);
            let len = g.gather(&shape, &one, 0);
            let zero = g.int_scalar(0);
            g.op("Range", &[&zero, &len, &one], vec![])
        });
        let position_table = self.position_table(&mut g)?;
        // Only a recurrent position encoder needs the lengths.
        let sequence_lens = self
            .model
            .encoder
            .position
            .as_ref()
            .map(|_| sequence_lens(&mut g, &mask));
        let mut x = g.scoped("embed", |g| {
            let words = self.embed(g, &table, &ids);
            self.embed_with_positions(
                g,
                words,
                &self.model.encoder.position,
                |g, rnn, x| {
                    let lens = sequence_lens
                        .as_ref()
                        .expect("computed for the encoder's RNN");
                    crate::recurrent::sequence(g, rnn, x, lens)
                },
                |g, width| Ok(self.absolute_positions(g, &positions, width, &position_table)),
            )
        })?;
        let encoder_relative = self.model.encoder.layers[0]
            .self_attn
            .relative
            .as_ref()
            .map(|_| g.scoped("relative", |g| self.encoder_relative(g, &ids, &positions)));
        let bias = self.padding_bias(&mut g, &mask);
        for (i, layer) in self.model.encoder.layers.iter().enumerate() {
            x = g.scoped(&format!("encoder.layers.{i}"), |g| -> Result<String> {
                let x = residual(
                    g,
                    &x,
                    &layer.self_attn_norm,
                    cfg.norm,
                    "self_attn",
                    |g, h| {
                        let k = self.project_heads(g, &layer.self_attn.k_proj, h, "k_proj")?;
                        let v = self.project_heads(g, &layer.self_attn.v_proj, h, "v_proj")?;
                        let relative = match &layer.self_attn.relative {
                            Some(tables) => Some(self.relative_tables(g, tables)?),
                            None => None,
                        };
                        let attended = Attended {
                            keys: &k,
                            values: &v,
                            bias: &bias,
                        };
                        let relative = relative.as_ref().zip(encoder_relative.as_ref());
                        self.attend(g, &layer.self_attn, h, attended, relative, false)
                    },
                )?;
                residual(g, &x, &layer.ffn_norm, cfg.norm, "ffn", |g, h| {
                    self.feed_forward(g, &layer.ffn, h)
                })
            })?;
        }
        let memory = g.scoped("encoder", |g| {
            self.final_norm(g, &self.model.encoder.final_norm, x)
        })?;

        let (h, dh) = (cfg.num_heads, cfg.head_dim());
        let head_axes: Vec<Axis> = vec!["batch".into(), h.into(), "source_len".into(), dh.into()];
        for (i, layer) in self.model.decoder.layers.iter().enumerate() {
            let (k, v) = g.scoped(
                &format!("decoder.layers.{i}.cross_attn"),
                |g| -> Result<_> {
                    Ok((
                        self.project_heads(g, &layer.cross_attn.k_proj, &memory, "k_proj")?,
                        self.project_heads(g, &layer.cross_attn.v_proj, &memory, "v_proj")?,
                    ))
                },
            )?;
            g.output(&k, &names::memory_cross_key(i), ElemType::F32, &head_axes);
            g.output(&v, &names::memory_cross_value(i), ElemType::F32, &head_axes);
        }
        g.output(
            &mask,
            names::MEMORY_SOURCE_MASK,
            ElemType::F32,
            &["batch".into(), "source_len".into()],
        );
        Ok(g.finish(
            "encoder",
            "Source sentence -> cross-attention keys/values of every decoder layer.",
        ))
    }

    /// What a decoder step's self-attention needs to know of the cache `past_key`
    /// `[batch, heads, past_len, head_dim]`: the additive bias `[batch, 1, 1, past_len + 1]`
    /// that leaves row `r` its first `positions[r]` cache columns and its new column, and,
    /// when the decoder has relative tables, the table row of each of those columns.
    fn cache_columns(&self, g: &mut Graph, past_key: &str, positions: &str) -> StepColumns {
        let CacheView {
            columns,
            rows_at,
            batch,
            column_shape,
            past_len,
            one_column,
            bias,
            split,
        } = cache_view(g, past_key, positions);
        let relative = self.model.decoder.layers[0]
            .self_attn
            .relative
            .as_ref()
            .map(|_| {
                // Key position minus query position; the new column is at distance 0.
                let distances = g.sub(&columns, &rows_at);
                let past_rows = self.relative_rows(g, &distances);
                let clip = self.config.relative_clip;
                let own = g.int_scalar(clip as i64);
                let own = g.op("Expand", &[&own, &column_shape], vec![]);
                let rows = g.concat(&[&past_rows, &own], 1);
                let rows = g.unsqueeze(&rows, &[1, 2]);
                let heads = g.ints(&[self.config.num_heads as i64, 1]);
                let width = g.add(&past_len, &one_column);
                let shape = g.concat(&[&batch, &heads, &width], 0);
                let rows = g.op("Expand", &[&rows, &shape], vec![]);
                let table_rows = g.ints(&[2 * clip as i64 + 1]);
                let zeros_shape = g.concat(&[&batch, &heads, &table_rows], 0);
                let zeros = g.op("ConstantOfShape", &[&zeros_shape], vec![]);
                StepRelative { rows, zeros }
            });
        StepColumns {
            bias,
            split,
            relative,
        }
    }

    fn decoder_step(&self) -> Result<ModelProto> {
        let cfg = self.config;
        let (h, dh) = (cfg.num_heads, cfg.head_dim());
        let mut g = Graph::new();
        let ids = g.input(names::TARGET_IDS, ElemType::I64, &["batch".into()]);
        let positions = g.input(names::POSITIONS, ElemType::I64, &["batch".into()]);
        let target_lengths = cfg
            .is_length_aware()
            .then(|| g.input(names::TARGET_LENGTHS, ElemType::I64, &["batch".into()]));
        let source_mask = g.input(
            names::MEMORY_SOURCE_MASK,
            ElemType::F32,
            &["batch".into(), "source_len".into()],
        );
        let cross_axes: Vec<Axis> = vec!["batch".into(), h.into(), "source_len".into(), dh.into()];
        let past_axes: Vec<Axis> = vec!["batch".into(), h.into(), "past_len".into(), dh.into()];
        let column_axes: Vec<Axis> = vec!["batch".into(), h.into(), 1usize.into(), dh.into()];

        let table = self.embedding_table(&mut g)?;
        let position_table = self.position_table(&mut g)?;
        // The position encoder's recurrent state, carried from step to step.
        let rnn_state = match &self.model.decoder.position {
            Some(encoder) => {
                let rnn = position_rnn(encoder);
                let axes: Vec<Axis> = vec!["batch".into(), rnn.hidden.into()];
                let mut carried = |state: &str| {
                    let past = g.input(&names::past(state), ElemType::F32, &axes);
                    let present = names::present(state);
                    g.output(&present, &present, ElemType::F32, &axes);
                    (past, present)
                };
                let h = carried(names::POSITION_RNN_HIDDEN_STATE);
                let c = (rnn.cell == Cell::Lstm).then(|| carried(names::POSITION_RNN_CELL_STATE));
                Some((h, c))
            }
            None => None,
        };
        let mut x = g.scoped("embed", |g| {
            let ids2 = g.unsqueeze(&ids, &[1]);
            let words = self.embed(g, &table, &ids2);
            self.embed_with_positions(
                g,
                words,
                &self.model.decoder.position,
                |g, rnn, x| {
                    let (h, c) = rnn_state.as_ref().expect("declared with the encoder");
                    crate::recurrent::step(
                        g,
                        rnn,
                        x,
                        (&h.0, &h.1),
                        c.as_ref().map(|(p, q)| (p.as_str(), q.as_str())),
                    )
                },
                |g, width| {
                    let pe = match &target_lengths {
                        Some(lengths) => Some(self.length_encoding(g, &positions, lengths, width)),
                        None => self.absolute_positions(g, &positions, width, &position_table),
                    };
                    Ok(pe.map(|pe| g.unsqueeze(&pe, &[1])))
                },
            )
        })?;
        // From here on a step's rows are `[batch, d]`: with one position there is nothing
        // to keep a sequence axis for, and a 2-D MatMul + Add is one Gemm to ONNX Runtime
        // (its bias fused), where a 3-D one stays two kernels.
        x = g.squeeze(&x, &[1]);

        // Every cache has the same columns, so the first layer's tells their number.
        let first_past_key = g.input(
            &names::past(&names::self_key_state(0)),
            ElemType::F32,
            &past_axes,
        );
        let columns = g.scoped("cache", |g| {
            self.cache_columns(g, &first_past_key, &positions)
        });
        let cross_bias = self.padding_bias(&mut g, &source_mask);

        for (i, layer) in self.model.decoder.layers.iter().enumerate() {
            let cross_k = g.input(&names::memory_cross_key(i), ElemType::F32, &cross_axes);
            let cross_v = g.input(&names::memory_cross_value(i), ElemType::F32, &cross_axes);
            let key_state = names::self_key_state(i);
            let value_state = names::self_value_state(i);
            let past_k = if i == 0 {
                first_past_key.clone()
            } else {
                g.input(&names::past(&key_state), ElemType::F32, &past_axes)
            };
            let past_v = g.input(&names::past(&value_state), ElemType::F32, &past_axes);
            x = g.scoped(&format!("decoder.layers.{i}"), |g| -> Result<String> {
                let x = residual(
                    g,
                    &x,
                    &layer.self_attn_norm,
                    cfg.norm,
                    "self_attn",
                    |g, h| {
                        let (new_k, new_v) =
                            (names::present(&key_state), names::present(&value_state));
                        let k = linear(g, &layer.self_attn.k_proj, h, "k_proj")?;
                        self.split_step_heads(g, &k, &new_k);
                        let v = linear(g, &layer.self_attn.v_proj, h, "v_proj")?;
                        self.split_step_heads(g, &v, &new_v);
                        let tables = match &layer.self_attn.relative {
                            Some(tables) => Some(self.relative_tables(g, tables)?),
                            None => None,
                        };
                        let cache = LayerCache {
                            past: (&past_k, &past_v),
                            new: (&new_k, &new_v),
                            tables,
                        };
                        self.attend_step(g, &layer.self_attn, h, &cache, &columns)
                    },
                )?;
                let x = residual(
                    g,
                    &x,
                    &layer.cross_attn_norm,
                    cfg.norm,
                    "cross_attn",
                    |g, h| {
                        let attended = Attended {
                            keys: &cross_k,
                            values: &cross_v,
                            bias: &cross_bias,
                        };
                        self.attend(g, &layer.cross_attn, h, attended, None, true)
                    },
                )?;
                residual(g, &x, &layer.ffn_norm, cfg.norm, "ffn", |g, h| {
                    self.feed_forward(g, &layer.ffn, h)
                })
            })?;
            for state in [&key_state, &value_state] {
                let column = names::present(state);
                g.output(&column, &column, ElemType::F32, &column_axes);
            }
        }
        let x = g.scoped("decoder", |g| {
            self.final_norm(g, &self.model.decoder.final_norm, x)
        })?;
        tied_logits(&mut g, &x, &table, cfg.vocab_size);
        Ok(g.finish(
            "decoder_step",
            "One greedy decoding step for a batch of rows at their own positions.",
        ))
    }
}

/// The recurrent network of a position encoder.
fn position_rnn(encoder: &PositionEncoder) -> &Rnn {
    match encoder {
        PositionEncoder::Rnn(rnn) => rnn,
        PositionEncoder::RecurrentEmbedding { embedding, .. } => &embedding.rnn,
    }
}

/// The decoder state this model's step graph carries (listed in the manifest).
pub fn decoder_state(model: &Transformer) -> Vec<StateSpec> {
    let config = &model.config;
    let heads = vec![
        Dim::Batch,
        Dim::Fixed(config.num_heads),
        Dim::Time,
        Dim::Fixed(config.head_dim()),
    ];
    let mut states = Vec::new();
    for i in 0..config.decoder_layers {
        for name in [names::self_key_state(i), names::self_value_state(i)] {
            states.push(StateSpec {
                name,
                dims: heads.clone(),
            });
        }
    }
    if let Some(encoder) = &model.decoder.position {
        let rnn = position_rnn(encoder);
        let mut names = vec![names::POSITION_RNN_HIDDEN_STATE];
        if rnn.cell == Cell::Lstm {
            names.push(names::POSITION_RNN_CELL_STATE);
        }
        for name in names {
            states.push(StateSpec {
                name: name.to_string(),
                dims: vec![Dim::Batch, Dim::Fixed(rnn.hidden)],
            });
        }
    }
    states
}

/// `(encoder.onnx, decoder.onnx)` for `model`.
pub fn export(model: &Transformer) -> Result<(ModelProto, ModelProto)> {
    let exporter = Exporter {
        model,
        config: &model.config,
    };
    Ok((exporter.encoder()?, exporter.decoder_step()?))
}
