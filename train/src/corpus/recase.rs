//! The capitalised first word(s) the RV1909 prints at the start of a chapter, re-cased
//! ([`fix_drop_cap`]).

use std::collections::HashMap;

/// How often each lower-cased word is written in lower case and capitalised, away from the
/// start of a sentence: tells names ("Jehová", "Jacob") from other words ("aconteció").
#[derive(Debug, Default, Clone)]
pub struct CaseLexicon {
    counts: HashMap<String, (usize, usize)>,
}

impl CaseLexicon {
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut counts: HashMap<String, (usize, usize)> = HashMap::new();
        for text in texts {
            for (start, word) in words(text) {
                if sentence_initial(&text[..start]) {
                    continue;
                }
                let mut cs = word.chars();
                let first_upper = cs.next().is_some_and(char::is_uppercase);
                let rest_lower = cs.all(|c| !c.is_uppercase());
                if !rest_lower {
                    continue;
                }
                let e = counts.entry(word.to_lowercase()).or_default();
                if first_upper {
                    e.1 += 1;
                } else {
                    e.0 += 1;
                }
            }
        }
        Self { counts }
    }

    /// `word` (upper case) written the way the text usually writes it mid-sentence.
    fn recase(&self, word: &str) -> String {
        let lower = word.to_lowercase();
        match self.counts.get(&lower) {
            Some(&(l, t)) if t > l => capitalize(&lower),
            _ => lower,
        }
    }
}

fn capitalize(lower: &str) -> String {
    let mut cs = lower.chars();
    match cs.next() {
        Some(f) => f.to_uppercase().chain(cs).collect(),
        None => String::new(),
    }
}

/// Words (maximal runs of letters) with their byte offsets.
fn words(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        match (c.is_alphabetic(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &text[s..]));
    }
    out
}

fn sentence_initial(before: &str) -> bool {
    let t = before.trim_end_matches(|c: char| c.is_whitespace() || "¿¡(“‘\"'".contains(c));
    t.is_empty() || t.ends_with(|c: char| ".:;?!".contains(c))
}

/// Hebrew letters heading the stanzas of Psalm 119 ("ALEPH. Bienaventurados ..."): kept.
const HEBREW_LETTERS: [&str; 22] = [
    "ALEPH", "BETH", "GIMEL", "DALETH", "HE", "VAU", "ZAIN", "CHETH", "TETH", "JOD", "CAPH",
    "LAMED", "MEM", "NUN", "SAMECH", "AIN", "PE", "TZADDI", "COPH", "RESH", "SCHIN", "TAU",
];

/// Re-cases the capitalised first word(s) the RV1909 prints at the start of a chapter ("EN el
/// principio" -> "En el principio", "Y ACONTECIÓ que" -> "Y aconteció que", "Salmo de David.
/// JEHOVÁ es mi pastor" -> "... Jehová es mi pastor"). Only the first run of all-capital words
/// of at least two letters is touched (the Hebrew letters of Psalm 119 are skipped), with a
/// one-letter capital word just before it unless that one starts the sentence; a word that
/// starts a sentence is capitalised, the others are written as `lexicon` says the text usually
/// writes them.
pub fn fix_drop_cap(text: &str, lexicon: &CaseLexicon) -> String {
    let ws = words(text);
    let is_caps = |w: &str| w.chars().count() >= 2 && w.chars().all(|c| !c.is_lowercase());
    let mut i = 0;
    while i < ws.len() {
        if is_caps(ws[i].1) && !HEBREW_LETTERS.contains(&ws[i].1) {
            break;
        }
        i += 1;
    }
    if i == ws.len() {
        return text.to_string();
    }
    // The run: following all-capital words separated by single spaces, and a one-letter word
    // before them that does not start the sentence ("Y Á SUS discípulos" -> "Y á sus").
    let mut run = vec![ws[i]];
    if i > 0 {
        let (s, w) = ws[i - 1];
        if w.chars().count() == 1
            && w.chars().all(char::is_uppercase)
            && &text[s + w.len()..ws[i].0] == " "
            && !sentence_initial(&text[..s])
        {
            run.insert(0, ws[i - 1]);
        }
    }
    let mut j = i + 1;
    while j < ws.len() {
        let (prev_start, prev) = *run.last().unwrap();
        let gap = &text[prev_start + prev.len()..ws[j].0];
        if gap == " " && is_caps(ws[j].1) {
            run.push(ws[j]);
            j += 1;
        } else {
            break;
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    for (k, &(start, word)) in run.iter().enumerate() {
        out.push_str(&text[pos..start]);
        if k == 0 && sentence_initial(&text[..start]) {
            out.push_str(&capitalize(&word.to_lowercase()));
        } else {
            out.push_str(&lexicon.recase(word));
        }
        pos = start + word.len();
    }
    out.push_str(&text[pos..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lexicon from real RV1909 sentences: "Jehová" is a name, "aconteció" is not.
    fn lexicon() -> CaseLexicon {
        CaseLexicon::from_texts([
            "Y dijo Jehová á Moisés: Entra tú.",
            "Y aconteció que cuando hubo Isaac envejecido, y sus ojos se oscurecieron",
            "y el espíritu de Jehová cayó sobre él, y sus discípulos le siguieron.",
        ])
    }

    #[test]
    fn drop_caps_are_recased() {
        let lex = lexicon();
        let cases = [
            (
                "EN el principio crió Dios los cielos y la tierra.",
                "En el principio crió Dios los cielos y la tierra.",
            ),
            ("Y ACONTECIÓ que como oyeron", "Y aconteció que como oyeron"),
            (
                "Y JEHOVÁ dijo á Noé: Entra tú",
                "Y Jehová dijo á Noé: Entra tú",
            ),
            (
                "Salmo de David. JEHOVÁ es mi pastor; nada me faltará.",
                "Salmo de David. Jehová es mi pastor; nada me faltará.",
            ),
            (
                "¿POR qué se amotinan las gentes",
                "¿Por qué se amotinan las gentes",
            ),
            (
                "YO DIJE: Atenderé á mis caminos",
                "Yo dije: Atenderé á mis caminos",
            ),
            (
                "Y Á SUS discípulos dice: Imposible es",
                "Y á sus discípulos dice: Imposible es",
            ),
            (
                "ALEPH. BIENAVENTURADOS los perfectos de camino",
                "ALEPH. Bienaventurados los perfectos de camino",
            ),
            (
                "BETH ¿Con qué limpiará el joven su camino?",
                "BETH ¿Con qué limpiará el joven su camino?",
            ),
            ("Ya normal, sin capitales.", "Ya normal, sin capitales."),
        ];
        for (input, want) in cases {
            assert_eq!(fix_drop_cap(input, &lex), want);
        }
    }
}
