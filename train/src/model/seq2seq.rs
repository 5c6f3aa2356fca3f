//! What training, evaluation and export ask of a model, whatever its family.

use candle_core::{Result, Tensor, D};
use model_package::ModelConfig;

use super::dropout::Dropout;

/// An encoder-decoder as training, evaluation and export see it: the Transformer family and
/// the RNN-NMT baseline.
pub trait Seq2Seq {
    fn config(&self) -> &ModelConfig;

    /// `source_ids` `[batch, src_len]` u32, `source_mask` `[batch, src_len]` f32 ->
    /// memory `[batch, src_len, d]`.
    fn encode(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor>;

    /// Teacher-forced decoder: `target_ids` `[batch, tgt_len]` (BOS first) -> logits
    /// `[batch, tgt_len, vocab]`. `target_lengths` `[batch]` u32 are the lengths a
    /// length-aware decoder is asked for (required by those, ignored by the others).
    fn decode(
        &self,
        target_ids: &Tensor,
        target_lengths: Option<&Tensor>,
        memory: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor>;

    fn forward(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        target_ids: &Tensor,
        target_lengths: Option<&Tensor>,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let memory = self.encode(source_ids, source_mask, dropout)?;
        self.decode(target_ids, target_lengths, &memory, source_mask, dropout)
    }

    /// Greedy decoding of one batch, recomputing the whole prefix every step. Slow, but it
    /// is the reference the exported graphs (which carry a cache) are checked against.
    fn greedy(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        target_lengths: Option<&Tensor>,
        max_len: usize,
    ) -> Result<Vec<Vec<u32>>> {
        use model_package::special::{BOS, EOS};
        let off = Dropout::off();
        let b = source_ids.dim(0)?;
        let memory = self.encode(source_ids, source_mask, &off)?;
        let mut prefix: Vec<Vec<u32>> = vec![vec![BOS]; b];
        let mut done = vec![false; b];
        for _ in 0..max_len {
            let flat: Vec<u32> = prefix.iter().flatten().copied().collect();
            let t = prefix[0].len();
            let ids = Tensor::from_vec(flat, (b, t), source_ids.device())?;
            let logits = self.decode(&ids, target_lengths, &memory, source_mask, &off)?;
            let next = logits
                .narrow(1, t - 1, 1)?
                .squeeze(1)?
                .argmax(D::Minus1)?
                .to_vec1::<u32>()?;
            for (row, &tok) in next.iter().enumerate() {
                // Finished rows keep emitting EOS so the batch stays rectangular.
                prefix[row].push(if done[row] { EOS } else { tok });
                done[row] |= tok == EOS;
            }
            if done.iter().all(|&d| d) {
                break;
            }
        }
        Ok(prefix
            .into_iter()
            .map(|p| p[1..].iter().copied().take_while(|&t| t != EOS).collect())
            .collect())
    }
}
