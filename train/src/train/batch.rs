//! From sentence pairs to padded tensors, batched by token count.

use candle_core::{Device, Result, Tensor};
use model_package::special::{BOS, EOS, PAD};
use rand::seq::SliceRandom;
use rand::Rng;

/// One tokenized pair. `source` ends with EOS (as the server feeds it); `target` holds the
/// bare pieces, BOS/EOS are added when batching.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    pub source: Vec<u32>,
    pub target: Vec<u32>,
}

impl Example {
    pub fn new(mut source: Vec<u32>, target: Vec<u32>) -> Self {
        source.push(EOS);
        Self { source, target }
    }

    /// Decoder input and output lengths (BOS + pieces, pieces + EOS).
    pub fn target_len(&self) -> usize {
        self.target.len() + 1
    }
}

/// Groups examples of similar length so that `rows * longest side` stays under
/// `max_tokens`, then shuffles the order of the groups. Sorting within random ties keeps
/// batches different from one epoch to the next.
pub fn token_batches(
    examples: &[Example],
    max_tokens: usize,
    rng: &mut impl Rng,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..examples.len()).collect();
    order.shuffle(rng);
    order.sort_by_key(|&i| (examples[i].source.len(), examples[i].target_len()));
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut longest = 0;
    for i in order {
        let len = examples[i].source.len().max(examples[i].target_len());
        let grown = longest.max(len);
        if !current.is_empty() && grown * (current.len() + 1) > max_tokens {
            batches.push(std::mem::take(&mut current));
            longest = len;
        } else {
            longest = grown;
        }
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches.shuffle(rng);
    batches
}

/// Padded tensors for one batch.
pub struct Batch {
    pub source_ids: Tensor,
    /// 1.0 at real source tokens.
    pub source_mask: Tensor,
    /// BOS + target.
    pub decoder_input: Tensor,
    /// target + EOS, PAD beyond.
    pub decoder_output: Tensor,
    /// 1.0 where `decoder_output` is not padding.
    pub target_mask: Tensor,
    /// `[batch]` u32: the length a length-aware decoder is asked for, the reference's
    /// subword count (EOS not counted) unless [`Batch::add_length_noise`] moved it.
    pub target_lengths: Tensor,
    pub source_tokens: usize,
    pub target_tokens: usize,
}

fn pad_rows(rows: &[Vec<u32>], device: &Device) -> Result<(Tensor, Tensor)> {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(rows.len() * width);
    let mut mask = Vec::with_capacity(rows.len() * width);
    for row in rows {
        ids.extend(
            row.iter()
                .copied()
                .chain(std::iter::repeat(PAD))
                .take(width),
        );
        mask.extend((0..width).map(|j| if j < row.len() { 1f32 } else { 0.0 }));
    }
    Ok((
        Tensor::from_vec(ids, (rows.len(), width), device)?,
        Tensor::from_vec(mask, (rows.len(), width), device)?,
    ))
}

impl Batch {
    pub fn new(examples: &[&Example], device: &Device) -> Result<Self> {
        let sources: Vec<Vec<u32>> = examples.iter().map(|e| e.source.clone()).collect();
        let inputs: Vec<Vec<u32>> = examples
            .iter()
            .map(|e| {
                std::iter::once(BOS)
                    .chain(e.target.iter().copied())
                    .collect()
            })
            .collect();
        let outputs: Vec<Vec<u32>> = examples
            .iter()
            .map(|e| {
                e.target
                    .iter()
                    .copied()
                    .chain(std::iter::once(EOS))
                    .collect()
            })
            .collect();
        let (source_ids, source_mask) = pad_rows(&sources, device)?;
        let (decoder_input, _) = pad_rows(&inputs, device)?;
        let (decoder_output, target_mask) = pad_rows(&outputs, device)?;
        let lengths: Vec<u32> = examples.iter().map(|e| e.target.len() as u32).collect();
        Ok(Self {
            target_lengths: Tensor::new(lengths, device)?,
            source_ids,
            source_mask,
            decoder_input,
            decoder_output,
            target_mask,
            source_tokens: sources.iter().map(Vec::len).sum(),
            target_tokens: outputs.iter().map(Vec::len).sum(),
        })
    }
}

impl Batch {
    /// Oka et al.'s noise: every row's asked length moves by an integer drawn uniformly
    /// from `-noise..=noise`, staying at least 1, so the decoder learns that the length it
    /// is given is approximate (as a predicted one is).
    pub fn add_length_noise(&mut self, noise: usize, rng: &mut impl Rng) -> Result<()> {
        if noise == 0 {
            return Ok(());
        }
        let noise = noise as i64;
        let lengths: Vec<u32> = self
            .target_lengths
            .to_vec1::<u32>()?
            .into_iter()
            .map(|len| (len as i64 + rng.gen_range(-noise..=noise)).max(1) as u32)
            .collect();
        self.target_lengths = Tensor::new(lengths, self.target_lengths.device())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn batches_respect_the_token_budget_and_cover_everything() {
        let examples: Vec<Example> = (1..60)
            .map(|n| Example::new(vec![5; n % 17 + 1], vec![6; n % 11 + 1]))
            .collect();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let batches = token_batches(&examples, 64, &mut rng);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..examples.len()).collect::<Vec<_>>());
        for b in &batches {
            let longest = b
                .iter()
                .map(|&i| examples[i].source.len().max(examples[i].target_len()))
                .max()
                .unwrap();
            assert!(b.len() == 1 || longest * b.len() <= 64, "{b:?}");
        }
    }

    #[test]
    fn batch_pads_and_shifts_targets() {
        let a = Example::new(vec![10, 11], vec![20]);
        let b = Example::new(vec![12], vec![21, 22]);
        let batch = Batch::new(&[&a, &b], &Device::Cpu).unwrap();
        assert_eq!(
            batch.source_ids.to_vec2::<u32>().unwrap(),
            vec![vec![10, 11, EOS], vec![12, EOS, PAD]]
        );
        assert_eq!(
            batch.decoder_input.to_vec2::<u32>().unwrap(),
            vec![vec![BOS, 20, PAD], vec![BOS, 21, 22]]
        );
        assert_eq!(
            batch.decoder_output.to_vec2::<u32>().unwrap(),
            vec![vec![20, EOS, PAD], vec![21, 22, EOS]]
        );
        assert_eq!(
            batch.target_mask.to_vec2::<f32>().unwrap(),
            vec![vec![1.0, 1.0, 0.0], vec![1.0, 1.0, 1.0]]
        );
        assert_eq!(batch.target_lengths.to_vec1::<u32>().unwrap(), vec![1, 2]);
        assert_eq!((batch.source_tokens, batch.target_tokens), (5, 5));
    }

    #[test]
    fn length_noise_stays_in_range_reaches_both_ends_and_keeps_lengths_positive() {
        let examples: Vec<Example> = (0..400)
            .map(|n| Example::new(vec![5], vec![6; 1 + n % 10]))
            .collect();
        let rows: Vec<&Example> = examples.iter().collect();
        let mut batch = Batch::new(&rows, &Device::Cpu).unwrap();
        let exact = batch.target_lengths.to_vec1::<u32>().unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        batch.add_length_noise(2, &mut rng).unwrap();
        let noisy = batch.target_lengths.to_vec1::<u32>().unwrap();
        let moves: Vec<i64> = exact
            .iter()
            .zip(&noisy)
            .map(|(&e, &n)| n as i64 - e as i64)
            .collect();
        assert!(noisy.iter().all(|&n| n >= 1));
        for (&e, &m) in exact.iter().zip(&moves) {
            assert!(
                (-2..=2).contains(&m) || (e as i64 + m == 1),
                "{e} moved {m}"
            );
        }
        for m in -2..=2 {
            assert!(moves.contains(&m), "no move of {m}");
        }
    }
}
