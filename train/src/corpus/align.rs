//! Aligning an English module with the Spanish one, verse by verse ([`align`]), and the
//! Gale & Church length model that finds merged, split and shifted verses.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::canon::VerseRef;
use super::sword::{KJV_MODULE, WEB_MODULE};
use super::texts::ModuleTexts;

/// A pair is dropped when one side is more than this many times longer (in characters) than
/// the other, the longer side having at least [`LENGTH_RATIO_MIN_CHARS`] characters.
pub const MAX_LENGTH_RATIO: f64 = 2.0;
/// See [`MAX_LENGTH_RATIO`]: short verses vary too much to be judged by their length.
pub const LENGTH_RATIO_MIN_CHARS: usize = 60;

/// One aligned verse pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub vref: VerseRef,
    pub en: String,
    pub es: String,
}

/// What [`align`] kept and dropped.
#[derive(Debug, Default, Clone)]
pub struct AlignReport {
    /// References present in both modules.
    pub common: usize,
    /// Pairs with an empty side.
    pub empty: usize,
    /// Pairs in a chapter dropped because of a versification mismatch.
    pub disturbed: usize,
    /// Pairs the length-based alignment puts off the diagonal (merged, split, shifted).
    pub off_diagonal: usize,
    /// Pairs dropped by the length-ratio filter.
    pub length_ratio: usize,
    /// The length model estimated for the alignment check.
    pub length_model: Option<LengthModel>,
    /// References of the pairs put off the diagonal.
    pub off_diagonal_refs: Vec<VerseRef>,
    /// Chapters dropped, as "Book chapter".
    pub disturbed_chapters: BTreeSet<(usize, u32)>,
    /// References of the pairs dropped by the length-ratio filter.
    pub length_ratio_refs: Vec<VerseRef>,
}

/// Aligns an English module with the Spanish one by reference. Keeps the references present and
/// non-empty in both, except
/// - in the chapters where one side has an empty verse that the other side has (with the next
///   chapter too when the empty verses end their chapter);
/// - the verses that a length-based alignment of their chapter (Gale & Church, with priors
///   that make anything but 1-1 rare: [`BEADS`]) does not pair with the verse of the same
///   number: the RV1909 merges, splits and shifts verses inside some chapters without leaving
///   any empty (1 Kgs 22:43-53, 1 Chr 21:15-30, Judg 14:18-20, ...), and moves clauses across
///   verse boundaries here and there (1 Kgs 18:33-34);
/// - the pairs whose lengths disagree anyway (see [`MAX_LENGTH_RATIO`]).
///
/// `model` is the length model of the check ([`LengthModel::for_source`]); `None` estimates it
/// from the pairs given.
pub fn align(
    en: &ModuleTexts,
    es: &ModuleTexts,
    model: Option<LengthModel>,
) -> (Vec<Pair>, AlignReport) {
    let mut report = AlignReport::default();
    for (side, other) in [(en, es), (es, en)] {
        // Last non-empty verse of each chapter on this side.
        let mut last_text: BTreeMap<(usize, u32), u32> = BTreeMap::new();
        for (r, t) in side {
            if !t.is_empty() {
                let e = last_text.entry((r.book, r.chapter)).or_default();
                *e = (*e).max(r.verse);
            }
        }
        for (r, t) in side {
            if t.is_empty() && other.get(r).is_some_and(|o| !o.is_empty()) {
                report.disturbed_chapters.insert((r.book, r.chapter));
                let trailing = last_text
                    .get(&(r.book, r.chapter))
                    .is_none_or(|&l| r.verse > l);
                if trailing {
                    report.disturbed_chapters.insert((r.book, r.chapter + 1));
                }
            }
        }
    }
    // Length-based check of the chapters left: merged, split and shifted verses.
    let both: Vec<(VerseRef, usize, usize)> = en
        .iter()
        .filter_map(|(r, e)| {
            let s = es.get(r)?;
            (!e.is_empty() && !s.is_empty()).then(|| (*r, e.chars().count(), s.chars().count()))
        })
        .collect();
    let model = model.unwrap_or_else(|| {
        LengthModel::estimate(&both.iter().map(|&(_, a, b)| (a, b)).collect::<Vec<_>>())
    });
    report.length_model = Some(model);
    let mut off: HashSet<VerseRef> = HashSet::new();
    for chapter in both.chunk_by(|a, b| (a.0.book, a.0.chapter) == (b.0.book, b.0.chapter)) {
        let r0 = chapter[0].0;
        if report.disturbed_chapters.contains(&(r0.book, r0.chapter)) {
            continue;
        }
        let a: Vec<usize> = chapter.iter().map(|x| x.1).collect();
        let b: Vec<usize> = chapter.iter().map(|x| x.2).collect();
        for (k, o) in off_diagonal(&model, &a, &b).into_iter().enumerate() {
            if o {
                off.insert(chapter[k].0);
            }
        }
    }

    let mut pairs = Vec::new();
    for (r, e) in en {
        let Some(s) = es.get(r) else { continue };
        report.common += 1;
        if e.is_empty() || s.is_empty() {
            report.empty += 1;
        } else if report.disturbed_chapters.contains(&(r.book, r.chapter)) {
            report.disturbed += 1;
        } else if off.contains(r) {
            report.off_diagonal += 1;
            report.off_diagonal_refs.push(*r);
        } else if !lengths_agree(e, s) {
            report.length_ratio += 1;
            report.length_ratio_refs.push(*r);
        } else {
            pairs.push(Pair {
                vref: *r,
                en: e.clone(),
                es: s.clone(),
            });
        }
    }
    (pairs, report)
}

/// Bead types of the length-based alignment check, as (English verses, Spanish verses, prior
/// probability). Verses are nearly always 1-1 here, so the other types are rare.
pub const BEADS: [(usize, usize, f64); 6] = [
    (1, 1, 0.978),
    (1, 0, 0.0025),
    (0, 1, 0.0025),
    (2, 1, 0.0075),
    (1, 2, 0.0075),
    (2, 2, 0.002),
];

/// Gale & Church's (1993) length model: the Spanish length of a verse is about `c` times the
/// English one, with a variance proportional to the length (`s2` per character).
#[derive(Debug, Clone, Copy)]
pub struct LengthModel {
    pub c: f64,
    pub s2: f64,
}

impl LengthModel {
    /// The model of an English source against the RV1909, as [`LengthModel::estimate`] gives
    /// it on all 66 books (fixed, so that the dev and test splits do not depend on `--books`);
    /// `None` for another module.
    pub fn for_source(module: &str) -> Option<Self> {
        match module {
            WEB_MODULE => Some(Self {
                c: 0.9586,
                s2: 2.2905,
            }),
            KJV_MODULE => Some(Self {
                c: 0.9194,
                s2: 2.0896,
            }),
            _ => None,
        }
    }

    /// Estimates `c` and `s2` from (English, Spanish) lengths in characters.
    pub fn estimate(lengths: &[(usize, usize)]) -> Self {
        let (sa, sb) = lengths
            .iter()
            .fold((0.0, 0.0), |(x, y), &(a, b)| (x + a as f64, y + b as f64));
        let c = if sa > 0.0 { sb / sa } else { 1.0 };
        let n = lengths.iter().filter(|(a, _)| *a > 0).count().max(1) as f64;
        let s2 = lengths
            .iter()
            .filter(|(a, _)| *a > 0)
            .map(|&(a, b)| (b as f64 - c * a as f64).powi(2) / a as f64)
            .sum::<f64>()
            / n;
        Self {
            c,
            s2: if s2 > 0.0 { s2 } else { 1.0 },
        }
    }

    /// -log of the probability that texts of these lengths are translations of each other.
    fn cost(&self, l1: usize, l2: usize) -> f64 {
        if l1 == 0 && l2 == 0 {
            return 0.0;
        }
        let (l1, l2) = (l1 as f64, l2 as f64);
        let mean = ((l1 + l2 / self.c) / 2.0).max(1.0);
        let z = (l2 - l1 * self.c) / (mean * self.s2).sqrt();
        let tail = erfc(z.abs() / std::f64::consts::SQRT_2);
        -tail.max(1e-12).ln()
    }
}

/// Complementary error function (Numerical Recipes' `erfcc`, fractional error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Aligns two equally long sequences of verse lengths with [`BEADS`] (dynamic programming over
/// the lowest total cost) and returns, per position, whether the best alignment leaves it off
/// the diagonal: the verse is merged, split or shifted with respect to the other text.
pub fn off_diagonal(model: &LengthModel, en: &[usize], es: &[usize]) -> Vec<bool> {
    let (n, m) = (en.len(), es.len());
    let w = m + 1;
    let mut cost = vec![f64::INFINITY; (n + 1) * w];
    let mut back = vec![(0usize, 0usize); (n + 1) * w];
    cost[0] = 0.0;
    for i in 0..=n {
        for j in 0..=m {
            let here = cost[i * w + j];
            if !here.is_finite() {
                continue;
            }
            for &(di, dj, p) in &BEADS {
                let (ii, jj) = (i + di, j + dj);
                if ii > n || jj > m {
                    continue;
                }
                let l1: usize = en[i..ii].iter().sum();
                let l2: usize = es[j..jj].iter().sum();
                let c = here - p.ln() + model.cost(l1, l2);
                if c < cost[ii * w + jj] {
                    cost[ii * w + jj] = c;
                    back[ii * w + jj] = (i, j);
                }
            }
        }
    }
    let mut off = vec![false; n.max(m)];
    let (mut i, mut j) = (n, m);
    while (i, j) != (0, 0) {
        let (pi, pj) = back[i * w + j];
        if !(i - pi == 1 && j - pj == 1 && pi == pj) {
            off[pi..i].iter_mut().for_each(|o| *o = true);
            off[pj..j].iter_mut().for_each(|o| *o = true);
        }
        (i, j) = (pi, pj);
    }
    off
}

fn lengths_agree(a: &str, b: &str) -> bool {
    let (la, lb) = (a.chars().count(), b.chars().count());
    let (short, long) = (la.min(lb), la.max(lb));
    long < LENGTH_RATIO_MIN_CHARS || (long as f64) <= MAX_LENGTH_RATIO * short as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::canon::{book_index, vref};

    /// A sentence of about `n` characters, different for every `seed`.
    fn text(n: usize, seed: usize) -> String {
        let mut s = format!("v{seed} ");
        while s.len() < n {
            s.push_str("lorem ");
        }
        s.truncate(n.max(4));
        s
    }

    #[test]
    fn off_diagonal_finds_shifts_only() {
        let model = LengthModel { c: 1.0, s2: 2.0 };
        let en: Vec<usize> = vec![40, 120, 60, 200, 35, 90, 150, 70, 45, 110];
        assert!(off_diagonal(&model, &en, &en).iter().all(|o| !o));
        // Verses 3 and 4 merged into 3 on the Spanish side, verse 5 split into 4 and 5.
        let es: Vec<usize> = vec![40, 120, 260, 20, 15, 90, 150, 70, 45, 110];
        let off = off_diagonal(&model, &en, &es);
        assert_eq!(
            off,
            [false, false, true, true, true, false, false, false, false, false]
        );
    }

    #[test]
    fn align_drops_mismatched_chapters_and_shifts() {
        let mut en = ModuleTexts::new();
        let mut es = ModuleTexts::new();
        let lens = [80, 150, 60, 120, 90, 140, 70, 100];
        // Num 12: the Spanish 12:8 is empty (its text opens Num 13): Num 12 and 13 go.
        // Num 14: fine. Num 15: one verse with lengths that disagree.
        for ch in 12..=15u32 {
            for (i, &l) in lens.iter().enumerate() {
                let v = i as u32 + 1;
                en.insert(vref("Num", ch, v), text(l, (ch * 100 + v) as usize));
                es.insert(vref("Num", ch, v), text(l, (ch * 100 + v) as usize + 1));
            }
        }
        es.insert(vref("Num", 12, 8), String::new());
        es.insert(vref("Num", 15, 3), text(400, 1));
        let (pairs, report) = align(&en, &es, None);
        let chapters: BTreeSet<u32> = pairs.iter().map(|p| p.vref.chapter).collect();
        assert_eq!(chapters, BTreeSet::from([14, 15]));
        assert!(report
            .disturbed_chapters
            .contains(&(book_index("Num").unwrap(), 13)));
        assert_eq!(report.empty, 1);
        assert_eq!(report.disturbed, 15);
        assert!(!pairs.iter().any(|p| p.vref == vref("Num", 15, 3)));
        assert_eq!(pairs.len(), 15);
    }
}
