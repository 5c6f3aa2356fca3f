//! What a length constraint and a repetition ban do to a row's scores before the greedy
//! choice, kept apart from the decode loop (CTranslate2's logits processors): the loop asks a
//! row's [`EosRule`] for the next token, with the tokens [`repeated_ngram_ends`] bans, and
//! never looks at lengths or n-grams itself.

use ndarray::ArrayView1;

/// How a row's end-of-sentence score is treated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EosRule {
    /// The model decides when to stop.
    Free,
    /// EOS is banned until this many tokens are out (exact mode; the decode loop's budget
    /// stops the row at the same length).
    BanUntil(usize),
    /// Soft mode: the length encoding plans `target` tokens, and EOS is pulled toward it:
    /// `per_token` is subtracted from the EOS logit for every token short of
    /// `target - tolerance`, and added for every token past `target + tolerance`. Within the
    /// tolerance, and wherever the model is sure, the model still picks its own ending (a
    /// sentence end rather than a cut), which is what separates soft from exact.
    Pull {
        target: usize,
        tolerance: usize,
        per_token: f32,
    },
    /// Soft mode toward a guessed length (the predictor's): the model ends where it likes
    /// until `after` tokens are out, then `per_token` is added to the EOS logit for every
    /// token past it. A length-aware decoder that has lost its plan loops on to the output
    /// budget; this ends it a little past where the plan ended instead.
    PullAfter { after: usize, per_token: f32 },
}

impl EosRule {
    /// The next token of a row that has produced `produced` tokens (EOS not counted), never
    /// one of `banned` (which never holds EOS: EOS is never among a row's tokens).
    pub fn choose(
        &self,
        logits: ArrayView1<'_, f32>,
        eos: u32,
        produced: usize,
        banned: &[u32],
    ) -> u32 {
        match (self, self.bias(produced)) {
            (_, None) => argmax_excluding(logits, Some(eos), banned),
            (EosRule::Free | EosRule::BanUntil(_), Some(_)) => {
                argmax_excluding(logits, None, banned)
            }
            (_, Some(bias)) => argmax_with_bias(logits, eos, bias, banned),
        }
    }

    /// What the rule adds to the EOS logit after `produced` tokens; `None` where EOS is
    /// banned.
    fn bias(&self, produced: usize) -> Option<f32> {
        match *self {
            EosRule::Free => Some(0.0),
            EosRule::BanUntil(min) => (produced >= min).then_some(0.0),
            EosRule::Pull {
                target,
                tolerance,
                per_token,
            } => {
                let short = target.saturating_sub(tolerance).saturating_sub(produced);
                let over = produced.saturating_sub(target + tolerance);
                Some(per_token * (over as f32 - short as f32))
            }
            EosRule::PullAfter { after, per_token } => {
                Some(per_token * produced.saturating_sub(after) as f32)
            }
        }
    }

    /// The next token of a row that may not end yet, only close its sentence
    /// ([`crate::ending::Ending::AfterCloser`]): never EOS, and the rule's bias on EOS goes
    /// to `closers` instead, so that where the rule would end the row it ends the sentence.
    pub fn steer(
        &self,
        logits: ArrayView1<'_, f32>,
        eos: u32,
        produced: usize,
        closers: &[u32],
        banned: &[u32],
    ) -> u32 {
        let bias = self.bias(produced).unwrap_or(0.0);
        argmax_scored(logits, |id, v| {
            if id == eos || banned.contains(&id) {
                None
            } else if closers.contains(&id) {
                Some(v + bias)
            } else {
                Some(v)
            }
        })
    }
}

/// `--no-repeat-ngram-size`'s default.
pub const DEFAULT_NO_REPEAT_NGRAM_SIZE: usize = 0;

/// The largest n-gram size a request or the server may ban repeats of: past it a repeat is a
/// copied passage rather than a stutter, and the search over a row's tokens grows with it.
pub const MAX_NO_REPEAT_NGRAM_SIZE: usize = 64;

/// The tokens that would repeat an `n`-gram of `ids` (CTranslate2's and Hugging Face's
/// `no_repeat_ngram_size`): the token after every earlier occurrence of the last `n - 1`
/// tokens. None for `n` = 0 (off); for `n` = 1, every token so far.
pub fn repeated_ngram_ends(ids: &[u32], n: usize) -> Vec<u32> {
    if n == 0 || ids.len() < n {
        return Vec::new();
    }
    let tail = &ids[ids.len() + 1 - n..];
    ids.windows(n)
        .filter(|gram| gram[..n - 1] == *tail)
        .map(|gram| gram[n - 1])
        .collect()
}

/// The log-probability the softmax of `logits` gives `token` (a log-sum-exp over the row,
/// shifted by its largest finite logit so that no exponent overflows).
pub fn log_prob(logits: ArrayView1<'_, f32>, token: u32) -> f32 {
    let max = logits
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return f32::NEG_INFINITY;
    }
    let sum: f32 = logits.iter().map(|&v| (v - max).exp()).sum();
    logits[token as usize] - max - sum.ln()
}

/// Index of the largest logit other than `banned`; NaNs never win (an all-NaN row gives 0).
pub fn argmax_except(logits: ArrayView1<'_, f32>, banned: Option<u32>) -> u32 {
    argmax_excluding(logits, banned, &[])
}

/// The token of `allowed` (not empty) with the largest logit; the first on ties.
pub fn argmax_among(logits: ArrayView1<'_, f32>, allowed: &[u32]) -> u32 {
    allowed
        .iter()
        .copied()
        .reduce(|best, id| {
            if logits[id as usize] > logits[best as usize] {
                id
            } else {
                best
            }
        })
        .unwrap_or(0)
}

/// [`argmax_except`] that also passes over every token of `banned` (a short list, usually
/// empty).
fn argmax_excluding(logits: ArrayView1<'_, f32>, one: Option<u32>, banned: &[u32]) -> u32 {
    let excluded = |id: u32| one == Some(id) || banned.contains(&id);
    // The row's first maximum, found sixteen lanes at a time, is the answer unless it is
    // excluded (a banned token or an EOS not yet allowed), which is rare.
    if let Some(values) = logits.as_slice() {
        match first_max(values) {
            None => return 0,
            Some(best) if !excluded(best as u32) => return best as u32,
            Some(_) => {}
        }
    }
    argmax_scored(logits, |id, v| (!excluded(id)).then_some(v))
}

crate::by_cpu::by_cpu! {
    /// Index of the first largest value above minus infinity (NaNs never win), or None: the
    /// answer of [`argmax_scored`] with nothing excluded. A decoder step takes one per row
    /// over the whole vocabulary.
    fn first_max(values: &[f32]) -> Option<usize> => first_max_lanes
}

/// [`first_max`] over sixteen lanes, each keeping its largest value and where it was first
/// seen (strictly larger replaces), in a form the compiler turns into vector compares and
/// blends.
#[inline(always)]
fn first_max_lanes(values: &[f32]) -> Option<usize> {
    const LANES: usize = 16;
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [0u32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        let base = (c * LANES) as u32;
        for i in 0..LANES {
            let larger = chunk[i] > best[i];
            best[i] = if larger { chunk[i] } else { best[i] };
            at[i] = if larger { base + i as u32 } else { at[i] };
        }
    }
    let mut winner: Option<(f32, usize)> = None;
    for i in 0..LANES {
        let (v, j) = (best[i], at[i] as usize);
        let wins = match winner {
            None => v > f32::NEG_INFINITY,
            Some((w, k)) => v > w || (v == w && j < k),
        };
        if wins {
            winner = Some((v, j));
        }
    }
    // The tail comes after every lane's index, so only a larger value wins.
    let tail_start = values.len() - tail.len();
    for (j, &v) in tail.iter().enumerate() {
        if v > winner.map_or(f32::NEG_INFINITY, |(w, _)| w) {
            winner = Some((v, tail_start + j));
        }
    }
    winner.map(|(_, j)| j)
}

/// The token with the largest `score(id, logit)`, tokens it scores `None` passed over; the
/// first on ties, and NaNs never win (0 when nothing scores above minus infinity).
fn argmax_scored(logits: ArrayView1<'_, f32>, score: impl Fn(u32, f32) -> Option<f32>) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if let Some(v) = score(i as u32, v) {
            if v > best_value {
                best = i;
                best_value = v;
            }
        }
    }
    best as u32
}

/// Index of the largest logit, `banned` passed over, once `bias` is added to token
/// `biased`'s.
fn argmax_with_bias(logits: ArrayView1<'_, f32>, biased: u32, bias: f32, banned: &[u32]) -> u32 {
    let best = argmax_excluding(logits, Some(biased), banned);
    let Some(&v) = logits.get(biased as usize) else {
        return best;
    };
    let boosted = v + bias;
    let rival = logits[best as usize];
    // A tie goes to the model's other choice; NaN never wins.
    if boosted > rival || (rival.is_nan() && !boosted.is_nan()) {
        biased
    } else {
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    const EOS: u32 = 2;

    #[test]
    fn steering_gives_the_pull_to_the_closers_and_never_ends() {
        let pull = EosRule::Pull {
            target: 3,
            tolerance: 0,
            per_token: 2.0,
        };
        // EOS (2) leads, then a word (0), then a closer (3).
        let logits = array![1.0f32, 0.0, 5.0, 0.5];
        // At the target: no bias; the word beats the closer, EOS is passed over.
        assert_eq!(pull.steer(logits.view(), EOS, 3, &[3], &[]), 0);
        // Two past it: +4 on the closer.
        assert_eq!(pull.steer(logits.view(), EOS, 5, &[3], &[]), 3);
        // Short of it, the closer is held down as EOS would be.
        let logits = array![0.0f32, 0.0, 5.0, 1.0];
        assert_eq!(pull.steer(logits.view(), EOS, 1, &[3], &[]), 0);
        assert_eq!(EosRule::Free.steer(logits.view(), EOS, 1, &[3], &[]), 3);
    }

    #[test]
    fn log_prob_is_the_log_softmax() {
        let logits = array![1.0f32, 2.0, 3.0];
        let total: f32 = logits.iter().map(|v| v.exp()).sum();
        for token in 0..3u32 {
            let expected = (logits[token as usize].exp() / total).ln();
            assert!((log_prob(logits.view(), token) - expected).abs() < 1e-6);
        }
        // Logits far past exp's range still give finite probabilities.
        let huge = array![1000.0f32, 999.0];
        assert!((log_prob(huge.view(), 1) - (1.0f32 / (1.0 + 1.0f32.exp())).ln()).abs() < 1e-5);
        assert_eq!(
            log_prob(array![f32::NAN, f32::NAN].view(), 0),
            f32::NEG_INFINITY
        );
    }

    #[test]
    fn the_lane_argmax_agrees_with_the_plain_one() {
        let plain = |v: &[f32]| argmax_scored(ArrayView1::from(v), |_, x| Some(x));
        let mut state = 7u64;
        for len in [0, 1, 15, 16, 17, 33, 1_000, 12_016] {
            let mut v: Vec<f32> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((state >> 40) % 64) as f32 // many ties
                })
                .collect();
            if len > 20 {
                (v[3], v[19], v[len - 1]) = (f32::NAN, f32::NEG_INFINITY, f32::NAN);
            }
            let want = plain(&v);
            assert_eq!(first_max(&v).unwrap_or(0) as u32, want, "{len} values");
            assert_eq!(
                first_max_lanes(&v).unwrap_or(0) as u32,
                want,
                "{len} values"
            );
        }
        assert_eq!(first_max(&[f32::NAN, f32::NEG_INFINITY]), None);
        let mut late = vec![0.0f32; 40];
        late[39] = 1.0;
        assert_eq!(first_max(&late), Some(39));
    }

    #[test]
    fn argmax_ignores_nan_and_prefers_the_first_maximum() {
        assert_eq!(
            argmax_except(array![1.0, f32::NAN, 3.0, 3.0].view(), None),
            2
        );
        assert_eq!(argmax_except(array![-5.0, -1.0].view(), None), 1);
        assert_eq!(argmax_except(array![-5.0, -1.0].view(), Some(1)), 0);
        assert_eq!(argmax_except(array![1.0, 5.0, 3.0].view(), Some(1)), 2);
        assert_eq!(argmax_except(array![f32::NAN, f32::NAN].view(), None), 0);
    }

    #[test]
    fn a_ban_holds_until_the_minimum() {
        let logits = array![0.0, 1.0, 9.0];
        assert_eq!(EosRule::BanUntil(3).choose(logits.view(), EOS, 2, &[]), 1);
        assert_eq!(EosRule::BanUntil(3).choose(logits.view(), EOS, 3, &[]), EOS);
        assert_eq!(EosRule::Free.choose(logits.view(), EOS, 0, &[]), EOS);
    }

    #[test]
    fn the_pull_grows_with_the_distance_beyond_the_tolerance() {
        let pull = EosRule::Pull {
            target: 10,
            tolerance: 1,
            per_token: 1.0,
        };
        // EOS one logit ahead: taken within the tolerance, refused two short of it.
        let eager = array![0.0, 1.0, 2.0];
        assert_eq!(pull.choose(eager.view(), EOS, 9, &[]), EOS);
        assert_eq!(
            pull.choose(eager.view(), EOS, 7, &[]),
            1,
            "2 short of 9: EOS at 0.0"
        );
        assert_eq!(
            pull.choose(eager.view(), EOS, 8, &[]),
            1,
            "1 short: EOS at 1.0 ties, and loses"
        );
        // EOS two logits behind: refused at the target, taken three past the tolerance.
        let reluctant = array![0.0, 3.0, 1.0];
        assert_eq!(pull.choose(reluctant.view(), EOS, 11, &[]), 1);
        assert_eq!(
            pull.choose(reluctant.view(), EOS, 13, &[]),
            1,
            "bias 2: ties, the first wins"
        );
        assert_eq!(pull.choose(reluctant.view(), EOS, 14, &[]), EOS);
    }

    #[test]
    fn a_pull_after_leaves_the_ending_free_until_its_start_then_grows() {
        let guard = EosRule::PullAfter {
            after: 20,
            per_token: 2.0,
        };
        // An early EOS is the model's to take, and so is any other token until the start.
        assert_eq!(guard.choose(array![0.0, 1.0, 2.0].view(), EOS, 3, &[]), EOS);
        let looping = array![0.0, 9.0, 1.0];
        assert_eq!(guard.choose(looping.view(), EOS, 20, &[]), 1);
        assert_eq!(
            guard.choose(looping.view(), EOS, 24, &[]),
            1,
            "bias 8: ties"
        );
        assert_eq!(guard.choose(looping.view(), EOS, 25, &[]), EOS);
    }

    #[test]
    fn an_ngram_ban_names_what_would_repeat_one() {
        // 7 8 9 7 8: "7 8" was followed by 9, so 9 would repeat "7 8 9".
        assert_eq!(repeated_ngram_ends(&[7, 8, 9, 7, 8], 3), vec![9]);
        assert_eq!(repeated_ngram_ends(&[7, 8, 9, 7, 8], 0), Vec::<u32>::new());
        assert_eq!(repeated_ngram_ends(&[7, 8, 9, 7, 8], 4), Vec::<u32>::new());
        assert_eq!(repeated_ngram_ends(&[7, 8], 3), Vec::<u32>::new());
        // Every earlier continuation of the tail is banned, and n = 1 bans every token seen.
        assert_eq!(repeated_ngram_ends(&[5, 1, 5, 2, 5], 2), vec![1, 2]);
        assert_eq!(repeated_ngram_ends(&[4, 6, 4], 1), vec![4, 6, 4]);
    }

    #[test]
    fn banned_tokens_give_way_to_the_next_best_under_every_rule() {
        let logits = array![0.0, 5.0, 1.0, 4.0];
        assert_eq!(EosRule::Free.choose(logits.view(), EOS, 0, &[1]), 3);
        assert_eq!(EosRule::Free.choose(logits.view(), EOS, 0, &[1, 3]), EOS);
        assert_eq!(
            EosRule::BanUntil(9).choose(logits.view(), EOS, 0, &[1, 3]),
            0
        );
        let pull = EosRule::PullAfter {
            after: 0,
            per_token: 1.0,
        };
        // EOS at 1 + 2 beats 0 once 1 and 3 are banned, and loses to 3 when it is not.
        assert_eq!(pull.choose(logits.view(), EOS, 2, &[1, 3]), EOS);
        assert_eq!(pull.choose(logits.view(), EOS, 2, &[1]), 3);
    }

    #[test]
    fn a_nan_eos_never_wins_a_pull() {
        let pull = EosRule::Pull {
            target: 0,
            tolerance: 0,
            per_token: 100.0,
        };
        assert_eq!(
            pull.choose(array![0.0, 1.0, f32::NAN].view(), EOS, 5, &[]),
            1
        );
    }
}
