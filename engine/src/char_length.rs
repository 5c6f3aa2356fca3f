//! Lengths in characters, met by n-best over lengths: a text with a character goal
//! (`target_chars`, isometric, `max_chars`) is decoded at a few target lengths in subwords as
//! rows of the same batch, and the candidate the model scores best among those that meet the
//! goal is returned (as the IWSLT 2022 isometric systems did). Characters are mapped to the
//! decoder's length input by what the model produced, not by a fixed ratio: the ratio only
//! places the candidates.

use serde::{Deserialize, Serialize};

use crate::ending::sentence_end;
use crate::length::{LengthPlan, LengthSource};

/// Relative tolerance of a character length asked for: IWSLT 2022's length compliance
/// (±10%).
pub const CHAR_TOLERANCE: f64 = 0.10;

/// Under this many characters on either side an isometric pair complies whatever its
/// lengths (IWSLT 2022's `isometric_slt_stat.py`).
pub const ISOMETRIC_SHORT: usize = 10;

/// Candidate lengths around the subword estimate of a character length (the estimate is a
/// mean ratio, and a sentence's own ratio strays ±20% from it), each left to the length
/// encoding and ended by the model (`pulled` false): pulled to its length, a candidate more
/// often ends mid-clause (isometric BLEU on the first 150 test verses 26.71 pulled, 27.09
/// not, against 27.91 for the default request).
const ABOUT_FACTORS: [(f64, bool); 5] = [
    (0.8, false),
    (0.9, false),
    (1.0, false),
    (1.1, false),
    (1.2, false),
];

/// Candidate lengths under a `max_chars` cap: the cap's own estimate and shorter sentences,
/// so that one that fits can end as a sentence instead of being cut; alternately left to
/// the length encoding (they end as sentences more often) and pulled to the length (they
/// come out shorter: left alone, the model does not compress a text by a third).
const AT_MOST_FACTORS: [(f64, bool); 5] = [
    (1.0, false),
    (0.9, true),
    (0.8, false),
    (0.7, true),
    (0.6, true),
];

/// A second round's lengths around the sentence's own estimate: it is closer than the
/// first round's, and the model lands a little short or long of a length asked. Pulled:
/// the model, left to end where it liked, missed the goal.
const SECOND_ROUND_ABOUT: [(f64, bool); 4] = [(0.95, true), (1.0, true), (1.05, true), (1.1, true)];

/// A second round's lengths under a cap at the sentence's own ratio, pulled.
const SECOND_ROUND_AT_MOST: [(f64, bool); 4] = [(1.0, true), (0.9, true), (0.8, true), (0.7, true)];

/// What a text's translation should measure in characters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CharGoal {
    pub about: Option<About>,
    /// At most this many characters, spaces counted (`max_chars`).
    pub at_most: Option<usize>,
}

/// A character length asked for, met within [`CHAR_TOLERANCE`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct About {
    /// Characters wanted, counted as `spaces_count` says.
    pub chars: usize,
    /// Spaces are counted (`target_chars`); IWSLT's isometric rule does not count them.
    pub spaces_count: bool,
    /// Characters per counted character in the source (1 when spaces count): turns a count
    /// without spaces into one with them, which the subword estimate is made in.
    pub spaced_per_counted: f64,
    /// IWSLT's rule for short pairs applies.
    pub isometric: bool,
}

impl About {
    /// `target_chars: N`: about N characters, spaces counted.
    pub fn chars(n: usize) -> About {
        About {
            chars: n,
            spaces_count: true,
            spaced_per_counted: 1.0,
            isometric: false,
        }
    }

    /// `target_chars: "source"`: the source's characters without spaces (IWSLT 2022).
    pub fn isometric(source: &str) -> About {
        let counted = count(source, false);
        About {
            chars: counted,
            spaces_count: false,
            spaced_per_counted: source.chars().count() as f64 / counted.max(1) as f64,
            isometric: true,
        }
    }

    fn measure(&self, text: &str) -> usize {
        count(text, self.spaces_count)
    }

    /// How far `text` is outside the tolerance, relative to the length asked (0 within).
    fn miss(&self, text: &str) -> f64 {
        let n = self.measure(text);
        if self.isometric && (n < ISOMETRIC_SHORT || self.chars < ISOMETRIC_SHORT) {
            return 0.0;
        }
        let wanted = self.chars as f64;
        let allowed = (CHAR_TOLERANCE * wanted).max(1.0);
        ((n as f64 - wanted).abs() - allowed).max(0.0) / wanted.max(1.0)
    }

    /// How far `text` is from the length asked, relative to it.
    fn distance(&self, text: &str) -> f64 {
        (self.measure(text) as f64 - self.chars as f64).abs() / (self.chars.max(1) as f64)
    }

    /// The characters wanted, spaces counted.
    fn spaced_chars(&self) -> f64 {
        self.chars as f64 * self.spaced_per_counted
    }
}

/// Characters of `text`, whitespace left out unless `spaces_count`.
pub fn count(text: &str, spaces_count: bool) -> usize {
    text.chars()
        .filter(|c| spaces_count || !c.is_whitespace())
        .count()
}

impl CharGoal {
    /// Whether `text` meets the goal.
    pub fn complies(&self, text: &str) -> bool {
        self.at_most.is_none_or(|max| text.chars().count() <= max)
            && self.about.is_none_or(|about| about.miss(text) == 0.0)
    }

    /// The plans to decode: `natural` (the text's plan without the goal) where it could
    /// comply, and lengths around the goal's estimate in subwords, `chars_per_subword`
    /// apart from the model's mean. Distinct targets, never above `max_output`.
    pub fn candidate_plans(
        &self,
        natural: &LengthPlan,
        chars_per_subword: f64,
        max_output: usize,
    ) -> Vec<LengthPlan> {
        let to_subwords = |chars: f64| chars / chars_per_subword;
        let (center, factors, source) = match (self.about, self.at_most) {
            (Some(about), at_most) => {
                let wanted = at_most.map_or(about.spaced_chars(), |max| {
                    about.spaced_chars().min(max as f64)
                });
                (
                    to_subwords(wanted),
                    ABOUT_FACTORS,
                    LengthSource::TargetChars,
                )
            }
            (None, Some(max)) => (
                to_subwords(max as f64),
                AT_MOST_FACTORS,
                LengthSource::MaxChars,
            ),
            (None, None) => return vec![*natural],
        };
        let mut plans = Vec::with_capacity(factors.len() + 1);
        // The natural length first: when it complies, the translation is the one the text
        // gets without a goal.
        let widest = factors.iter().map(|(f, _)| *f).fold(1.0, f64::max);
        if natural
            .target
            .is_none_or(|t| (t as f64) <= center * widest + 1.0)
        {
            plans.push(*natural);
        }
        add_around(
            &mut plans,
            center,
            &factors,
            source,
            natural.predicted,
            max_output,
        );
        plans
    }

    /// A second round's plans when none of the first round's `candidates` (decoded under
    /// `tried`) complies: lengths around the goal at this sentence's own characters per
    /// subword, measured on the candidate nearest the goal (the model's mean ratio placed
    /// the first round; a sentence of names or numbers strays far from it). Empty when one
    /// complies or nothing was measured.
    pub fn second_round(
        &self,
        tried: &[LengthPlan],
        candidates: &[Candidate],
        max_output: usize,
    ) -> Vec<LengthPlan> {
        if candidates.iter().any(|c| c.complies && c.ended) {
            return Vec::new();
        }
        let (wanted, nearest, factors, source) = match (self.about, self.at_most) {
            (Some(about), _) => (
                about.chars as f64,
                candidates
                    .iter()
                    .min_by(|a, b| about.distance(&a.text).total_cmp(&about.distance(&b.text))),
                SECOND_ROUND_ABOUT,
                LengthSource::TargetChars,
            ),
            (None, Some(max)) => (
                max as f64,
                candidates.iter().min_by_key(|c| c.characters),
                SECOND_ROUND_AT_MOST,
                LengthSource::MaxChars,
            ),
            (None, None) => return Vec::new(),
        };
        let Some(nearest) = nearest else {
            return Vec::new();
        };
        let measured = match self.about {
            Some(about) => about.measure(&nearest.text),
            None => nearest.characters,
        };
        if measured == 0 || nearest.output_tokens == 0 {
            return Vec::new();
        }
        let center = wanted * nearest.output_tokens as f64 / measured as f64;
        let mut plans = tried.to_vec();
        let predicted = tried.first().and_then(|p| p.predicted);
        add_around(&mut plans, center, &factors, source, predicted, max_output);
        plans.split_off(tried.len())
    }

    /// Which of `candidates` to return: among those that end (EOS) and comply, the model's
    /// best by mean log-probability per token, those ending as the source does first under
    /// a cap alone (a subtitle should read as a sentence); else the nearest miss (under a
    /// cap, the shortest, which the caller cuts). `exact`: the rows were cut at their
    /// lengths, so no score saw their ends; the longest under a cap wins instead, the
    /// nearest to the length asked otherwise.
    pub fn choose(
        &self,
        candidates: &[Candidate],
        source_ending: Option<char>,
        exact: bool,
    ) -> usize {
        let ends_as_source =
            |c: &Candidate| source_ending.is_none_or(|end| sentence_end(&c.text) == Some(end));
        let prefer_ending = self.about.is_none();
        // Ties go to the earlier candidate: the natural length, then the longer.
        let best = best_ranked(candidates, |c| {
            (c.complies && c.ended).then(|| Rank {
                ends_well: prefer_ending && ends_as_source(c),
                // A candidate that reached its length by saying a phrase twice scores well
                // token by token (a repeat is easy to predict) but reads badly.
                no_repeat: !repeats_a_phrase(&c.text),
                merit: match (exact, self.about) {
                    (false, _) => c.score,
                    (true, Some(about)) => -about.distance(&c.text),
                    (true, None) => c.characters as f64,
                },
            })
        });
        if let Some(i) = best {
            return i;
        }
        let miss = |c: &Candidate| match (self.about, self.at_most) {
            (Some(about), _) => about.miss(&c.text),
            (None, _) => c.text.chars().count() as f64,
        };
        candidates
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| {
                miss(a)
                    .total_cmp(&miss(b))
                    .then(b.score.total_cmp(&a.score))
            })
            .map_or(0, |(i, _)| i)
    }
}

/// Which of `candidates` (one text's rows, none with a goal to meet: an exact count's) to
/// return: those that ended where the model would have ended them first, then those that
/// say no phrase twice, then the model's best by mean log-probability per token.
pub fn best_scored(candidates: &[Candidate]) -> usize {
    best_ranked(candidates, |c| {
        Some(Rank {
            ends_well: c.ended,
            no_repeat: !repeats_a_phrase(&c.text),
            merit: c.score,
        })
    })
    .unwrap_or(0)
}

/// The candidate `rank` ranks highest, those it gives no rank passed over; the earlier on
/// ties.
fn best_ranked(
    candidates: &[Candidate],
    rank: impl Fn(&Candidate) -> Option<Rank>,
) -> Option<usize> {
    let mut best: Option<(usize, Rank)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let Some(r) = rank(c) else { continue };
        if best.as_ref().is_none_or(|(_, b)| r.beats(b)) {
            best = Some((i, r));
        }
    }
    best.map(|(i, _)| i)
}

/// Adds to `plans` a plan at `center` times each factor of `factors` subwords, pulled to it
/// or left to the length encoding as the factor says, where no plan has that target and
/// pull yet.
fn add_around(
    plans: &mut Vec<LengthPlan>,
    center: f64,
    factors: &[(f64, bool)],
    source: LengthSource,
    predicted: Option<f64>,
    max_output: usize,
) {
    for &(factor, pulled) in factors {
        let target = ((center * factor).round() as usize).clamp(1, max_output.max(1));
        if plans
            .iter()
            .all(|p| p.target != Some(target) || p.pulled != pulled)
        {
            plans.push(LengthPlan {
                target: Some(target),
                source: Some(source),
                predicted,
                pulled,
                tolerance: 1,
                told: None,
            });
        }
    }
}

/// How [`CharGoal::choose`] ranks a compliant candidate, most important first.
struct Rank {
    ends_well: bool,
    no_repeat: bool,
    /// The model's score, or in exact mode the length's fit.
    merit: f64,
}

impl Rank {
    fn beats(&self, other: &Rank) -> bool {
        (self.ends_well, self.no_repeat)
            .cmp(&(other.ends_well, other.no_repeat))
            .then(self.merit.total_cmp(&other.merit))
            .is_gt()
    }
}

/// Words in a phrase that [`repeats_a_phrase`] looks for.
const REPEATED_PHRASE_WORDS: usize = 4;

/// Whether some run of [`REPEATED_PHRASE_WORDS`] words occurs twice in `text`, punctuation
/// aside.
pub fn repeats_a_phrase(text: &str) -> bool {
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .filter(|w| !w.is_empty())
        .collect();
    let mut seen = std::collections::HashSet::new();
    words
        .windows(REPEATED_PHRASE_WORDS)
        .any(|phrase| !seen.insert(phrase))
}

/// One text decoded at one length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The target length it was decoded for, in subwords.
    pub target_length: Option<usize>,
    /// What its length encoding was told, where not `target_length` (an exact count's
    /// candidates: forced to the count, planned around it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_length: Option<usize>,
    pub text: String,
    /// Characters, spaces counted.
    pub characters: usize,
    /// Subwords generated.
    pub output_tokens: usize,
    /// The model's mean log-probability per token, EOS included.
    pub score: f64,
    /// It meets the request's character goal.
    pub complies: bool,
    /// It ended with EOS (not at its token budget).
    pub ended: bool,
    /// It is the one returned.
    pub chosen: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(text: &str, score: f64, complies: bool) -> Candidate {
        Candidate {
            target_length: None,
            planned_length: None,
            text: text.into(),
            characters: text.chars().count(),
            output_tokens: 1,
            score,
            complies,
            ended: true,
            chosen: false,
        }
    }

    #[test]
    fn isometric_counts_without_spaces_and_spares_short_pairs() {
        let goal = CharGoal {
            about: Some(About::isometric("abcde fghij klmno pqrst")),
            at_most: None,
        };
        assert_eq!(goal.about.unwrap().chars, 20);
        assert!(goal.complies("abcdefghij klmnopqrs")); // 19: within ±10%
        assert!(goal.complies("a b c d e f g h i j k l m n o p q r s t u v")); // 22
        assert!(!goal.complies("abcdefghij klmnopq")); // 17
        assert!(!goal.complies("abcdefghij klmnopqrstuvw")); // 23
                                                             // Either side under 10 characters complies (IWSLT's rule).
        assert!(goal.complies("abc"));
        let short = CharGoal {
            about: Some(About::isometric("Hi there")),
            at_most: None,
        };
        assert!(short.complies("a much longer translation"));
    }

    #[test]
    fn target_chars_counts_spaces_with_at_least_one_character_of_slack() {
        let goal = CharGoal {
            about: Some(About::chars(5)),
            at_most: None,
        };
        assert!(goal.complies("ab cd") && goal.complies("abcd") && goal.complies("abc de"));
        assert!(!goal.complies("abc defg") && !goal.complies("abc"));
    }

    #[test]
    fn candidates_surround_the_estimate_and_keep_the_natural_length() {
        let natural = LengthPlan {
            target: Some(10),
            source: Some(LengthSource::Predictor),
            predicted: Some(10.2),
            pulled: false,
            tolerance: 1,
            told: None,
        };
        let goal = CharGoal {
            about: Some(About::chars(40)),
            at_most: None,
        };
        let plans = goal.candidate_plans(&natural, 4.0, 100);
        let targets: Vec<_> = plans.iter().map(|p| p.target.unwrap()).collect();
        assert_eq!(targets, vec![10, 8, 9, 11, 12]);
        assert_eq!(plans[0].source, Some(LengthSource::Predictor));
        assert!(plans[1..]
            .iter()
            .all(|p| p.source == Some(LengthSource::TargetChars) && !p.pulled));
        // A natural length far past the goal is not worth a row; caps bound every target.
        let long = LengthPlan {
            target: Some(40),
            ..natural
        };
        let cap = CharGoal {
            about: None,
            at_most: Some(42),
        };
        let targets: Vec<_> = cap
            .candidate_plans(&long, 4.0, 100)
            .iter()
            .map(|p| p.target.unwrap())
            .collect();
        assert_eq!(targets, vec![11, 9, 8, 7, 6]);
    }

    #[test]
    fn the_best_compliant_candidate_wins_and_subtitles_prefer_sentences() {
        let about = CharGoal {
            about: Some(About::chars(10)),
            at_most: None,
        };
        let picks = [
            candidate("ten chars.", -0.5, true),
            candidate("ten chars!", -0.2, true),
            candidate("far too long", -0.1, false),
        ];
        assert_eq!(about.choose(&picks, Some('.'), false), 1);
        let cap = CharGoal {
            about: None,
            at_most: Some(12),
        };
        let cut = [
            candidate("Y dijo que", -0.1, true),
            candidate("Y lo dijo.", -0.4, true),
        ];
        assert_eq!(cap.choose(&cut, Some('.'), false), 1);
        assert_eq!(cap.choose(&cut, None, false), 0);
        // Exact rows are cut at their lengths: the longest that fits.
        assert_eq!(cap.choose(&cut, None, true), 0);
        let exact = [
            candidate("ab", -0.1, true),
            candidate("abcdefghij", -0.9, true),
        ];
        assert_eq!(about.choose(&exact, None, true), 1);
        // Nothing complies: the nearest miss, and under a cap the shortest.
        let none = [
            candidate("much much longer", -0.1, false),
            candidate("a bit longer", -0.3, false),
        ];
        assert_eq!(about.choose(&none, None, false), 1);
        assert_eq!(cap.choose(&none, None, false), 1);
    }

    #[test]
    fn a_second_round_aims_at_the_sentences_own_ratio() {
        let goal = CharGoal {
            about: Some(About::chars(40)),
            at_most: None,
        };
        let plan = |t| LengthPlan {
            target: Some(t),
            source: Some(LengthSource::TargetChars),
            predicted: None,
            pulled: false,
            tolerance: 1,
            told: None,
        };
        let tried = [plan(8), plan(10)];
        // 20 characters from 10 subwords: 2 a subword, so 40 want 20.
        let short = Candidate {
            output_tokens: 10,
            ..candidate("aaaaaaaaaaaaaaaaaaaa", -0.1, false)
        };
        let far = Candidate {
            output_tokens: 8,
            ..candidate("aaaaaaaaaa", -0.1, false)
        };
        let second = goal.second_round(&tried, &[far, short.clone()], 100);
        let targets: Vec<_> = second.iter().map(|p| p.target.unwrap()).collect();
        assert_eq!(targets, vec![19, 20, 21, 22]);
        assert!(
            second.iter().all(|p| p.pulled),
            "held to the lengths the first round missed"
        );
        let fits = candidate("abcdefghijklmnopqrstuvwxyzabcdefghijklmn", -0.1, true);
        assert!(goal.second_round(&tried, &[short, fits], 100).is_empty());
    }

    #[test]
    fn a_candidate_padded_by_a_repeat_gives_way() {
        let goal = CharGoal {
            about: Some(About::chars(40)),
            at_most: None,
        };
        let padded = candidate("y metió los vasos, y metió los vasos.", -0.1, true);
        let plain = candidate("y puso los vasos en la casa del tesoro.", -0.4, true);
        assert!(repeats_a_phrase(&padded.text) && !repeats_a_phrase(&plain.text));
        assert_eq!(goal.choose(&[padded, plain], Some('.'), false), 1);
    }
}
