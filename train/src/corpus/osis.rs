//! One verse's OSIS markup, as diatheke prints it, to plain text ([`clean_verse`]).

/// Elements whose text is not part of the verse: notes, headings, speaker labels of the Song
/// of Songs, cross-references, variant readings.
const DROPPED_ELEMENTS: [&str; 6] = ["note", "title", "speaker", "reference", "rdg", "figure"];
/// Elements that separate words (poetry lines, paragraphs, line breaks, ...).
const BREAK_ELEMENTS: [&str; 14] = [
    "l",
    "lg",
    "lb",
    "div",
    "chapter",
    "p",
    "milestone",
    "list",
    "item",
    "table",
    "row",
    "cell",
    "br",
    "verse",
];
/// Spanish clitic pronouns: an added `<transChange>` holding one of them right after a verb
/// form ("sáca</w><transChange>lo</transChange>") is part of that word ("sácalo").
const ENCLITICS: [&str; 11] = [
    "lo", "la", "los", "las", "le", "les", "me", "te", "se", "nos", "os",
];
/// Short Spanish imperatives and forms that take enclitics without looking like verbs.
const SHORT_VERBS: [&str; 14] = [
    "di", "da", "haz", "he", "vi", "ve", "ten", "pon", "sal", "ven", "id", "oid", "dad", "sed",
];
/// Accented words that are not verbs and take no enclitic ("Josué los circuncidó").
const NOT_VERBS: [&str; 22] = [
    "jehová", "josué", "cuánto", "cuánta", "cuántos", "cuántas", "qué", "quién", "cómo", "dónde",
    "cuándo", "también", "además", "después", "allí", "aquí", "así", "más", "él", "mí", "tú",
    "jesús",
];

#[derive(Debug, Clone, Copy)]
struct InlineTag {
    start: bool,
    end: bool,
    trans_change: bool,
}

enum Piece {
    Text(String),
    Break,
    Tag(InlineTag),
}

/// Turns one verse of a module's raw OSIS markup into plain text.
///
/// - Markup is removed; the text of notes, headings, speaker labels and cross-references is
///   dropped; everything after the end of the book (the WEB appends its glossary to Rev 22:21)
///   is dropped.
/// - Where a tag boundary has no space between two words, one is put back when the tags
///   separate words (`God</w><w ...>created` -> "God created", `fringes</q><q><w>of`,
///   `Behold,<w>he`), and not when they split one word (`give</w>n` -> "given") or attach a
///   Spanish clitic to its verb (`sáca</w><transChange>lo</transChange>` -> "sácalo").
/// - Pilcrows (¶), stray USFM markers (`\nd`) and XML entities are removed or decoded;
///   whitespace is collapsed to single spaces and trimmed; no space is left before `, ; : . ! ?`.
pub fn clean_verse(raw: &str) -> String {
    let pieces = markup_pieces(raw);
    let mut out = String::with_capacity(raw.len() / 2);
    let mut pending: Vec<InlineTag> = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Break => {
                out.push(' ');
                pending.clear();
            }
            Piece::Tag(t) => pending.push(*t),
            Piece::Text(text) => {
                if !pending.is_empty() {
                    let next_is_tc_end =
                        matches!(pieces.get(i + 1), Some(Piece::Tag(t)) if t.end && t.trans_change);
                    if needs_space(&out, &pending, text, next_is_tc_end) {
                        out.push(' ');
                    }
                    pending.clear();
                }
                out.push_str(text);
            }
        }
    }
    normalize_text(&out)
}

/// Splits markup into text, inline tags and word breaks, dropping the elements whose text is
/// not verse text and stopping at the end of the book.
fn markup_pieces(raw: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut skip: Option<(String, usize)> = None; // dropped element name, nesting depth
    let mut rest = raw;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            if skip.is_none() {
                pieces.push(Piece::Text(decode_entities(rest)));
            }
            break;
        };
        if lt > 0 && skip.is_none() {
            pieces.push(Piece::Text(decode_entities(&rest[..lt])));
        }
        let Some(gt) = rest[lt..].find('>') else {
            // A lone '<' is text.
            if skip.is_none() {
                pieces.push(Piece::Text(decode_entities(&rest[lt..])));
            }
            break;
        };
        let tag = &rest[lt + 1..lt + gt];
        rest = &rest[lt + gt + 1..];
        let end = tag.starts_with('/');
        let empty = tag.ends_with('/');
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == ':' || *c == '_')
            .collect();
        if let Some((skip_name, depth)) = &mut skip {
            if *skip_name == name && !empty {
                if end {
                    *depth -= 1;
                    if *depth == 0 {
                        skip = None;
                    }
                } else {
                    *depth += 1;
                }
            }
            continue;
        }
        if name == "div" {
            let kind = attr(tag, "type");
            if matches!(kind, Some("glossary") | Some("introduction"))
                || (kind == Some("book") && attr(tag, "eID").is_some())
            {
                break; // back matter after the book's last verse
            }
        }
        if DROPPED_ELEMENTS.contains(&name.as_str()) {
            if !end && !empty {
                skip = Some((name, 1));
            }
            continue;
        }
        if BREAK_ELEMENTS.contains(&name.as_str()) {
            pieces.push(Piece::Break);
            continue;
        }
        pieces.push(Piece::Tag(InlineTag {
            start: !end && !empty,
            end,
            trans_change: name == "transChange",
        }));
    }
    pieces
}

/// Whether a run of inline tags between the text written so far and `next` separates words.
fn needs_space(out: &str, tags: &[InlineTag], next: &str, next_is_tc_end: bool) -> bool {
    let (Some(a), Some(b)) = (out.chars().next_back(), next.chars().next()) else {
        return false;
    };
    if a.is_whitespace() || b.is_whitespace() {
        return false;
    }
    let has_start = tags.iter().any(|t| t.start);
    let has_end = tags.iter().any(|t| t.end);
    let a_word = a.is_alphanumeric();
    let b_word = b.is_alphanumeric();
    if a_word && b_word {
        if !has_start {
            return false; // closing tags inside a word: KJV "give</w>n"
        }
        let opens_clitic = tags.last().is_some_and(|t| t.start && t.trans_change)
            && next_is_tc_end
            && ENCLITICS.contains(&next.to_lowercase().as_str());
        if opens_clitic && (!has_end || verb_like(last_word(out))) {
            return false; // "sáca</w><transChange>lo" -> "sácalo"
        }
        return true;
    }
    if b_word {
        if a == '’' && !has_end && next == "s" {
            return false; // KJV "day</w>’<w>s</w>" -> "day’s"
        }
        return ",.;:!?”’)]".contains(a);
    }
    "“‘¿¡(".contains(b) && (a_word || ",.;:!?”’)".contains(a))
}

fn last_word(s: &str) -> &str {
    let start = s
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_alphabetic())
        .last()
        .map_or(s.len(), |(i, _)| i);
    &s[start..]
}

/// Whether a Spanish word looks like a verb form that takes enclitic pronouns: infinitives
/// (-r), plural imperatives (-d), gerunds (-ndo), accented forms (sáca, díjo, plantó) and a few
/// short imperatives (di, haz, dad).
fn verb_like(word: &str) -> bool {
    let w = word.to_lowercase();
    if w.is_empty() || NOT_VERBS.contains(&w.as_str()) {
        return false;
    }
    SHORT_VERBS.contains(&w.as_str())
        || w.ends_with('r')
        || w.ends_with('d')
        || w.ends_with("ndo")
        || w.chars().any(|c| "áéíóú".contains(c))
}

fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let decoded = after.find(';').filter(|&e| e <= 10).and_then(|e| {
            let ent = &after[1..e];
            let c = match ent {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some(' '),
                _ => ent
                    .strip_prefix("#x")
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                    .and_then(char::from_u32),
            };
            c.map(|c| (c, e))
        });
        match decoded {
            Some((c, e)) => {
                out.push(c);
                rest = &after[e + 1..];
            }
            None => {
                out.push('&');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Removes pilcrows and stray USFM markers, collapses whitespace, removes spaces before
/// closing punctuation.
fn normalize_text(s: &str) -> String {
    let mut t = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '¶' => t.push(' '),
            // USFM character markers left in the KJV text ("the \nd LORD").
            '\\' if chars.peek().is_some_and(|c| c.is_ascii_alphabetic()) => {
                while chars.peek().is_some_and(|c| c.is_ascii_alphanumeric()) {
                    chars.next();
                }
                if chars.peek() == Some(&'*') {
                    chars.next();
                }
                t.push(' ');
            }
            c if c.is_whitespace() || c.is_control() => t.push(' '),
            c => t.push(c),
        }
    }
    let mut out = String::with_capacity(t.len());
    for word in t.split(' ').filter(|w| !w.is_empty()) {
        // "word ," (a break element before punctuation) -> "word,".
        let glue = word.starts_with(|c: char| ",;:.!?".contains(c));
        if !out.is_empty() && !glue {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// Value of attribute `key` in the text of a tag (`<w savlm="x" ...`).
pub(super) fn attr<'a>(tag: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = tag;
    while let Some(i) = rest.find(key) {
        let before_ok = i > 0 && rest.as_bytes()[i - 1].is_ascii_whitespace();
        let after = &rest[i + key.len()..];
        if before_ok {
            if let Some(v) = after.strip_prefix("=\"") {
                return v.find('"').map(|e| &v[..e]);
            }
        }
        rest = after;
    }
    None
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Real verses as `diatheke -b <module> -k <book>` prints them (the markup after
    /// "<Book> <c>:<v>: "), with what [`clean_verse`] must make of them: glued words (WEB
    /// Gen 1:1, Ps 42:8, Ps 7:14, Matt 13:25), a word split by markup (KJV Mark 4:24), a
    /// possessive split by markup (KJV Acts 1:12), a pilcrow (KJV 1 Sam 23:29), a stray USFM
    /// marker (KJV Exod 6:3), a speaker label (WEB Song 1:4), italics and red letters (KJV Gen
    /// 1:2, Matt 5:3), Spanish clitics added in italics (RV Gen 19:12, 1 Chr 10:13, Rev 1:1)
    /// and words that are not clitics (RV Gen 2:12, Josh 5:4, 1 Sam 14:1).
    pub(in crate::corpus) const CLEAN_CASES: &[(&str, &str, &str)] = &[
        (
            "engWEB2015eb Genesis 1:1",
            r#"<w savlm="strong:H0430">In</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H7225">beginning</w>, <w savlm="strong:H0430">God</w><w savlm="strong:H1254">created</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H8064">heavens</w> <w savlm="strong:H0430">and</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H0776">earth</w>."#,
            "In the beginning, God created the heavens and the earth.",
        ),
        (
            "engWEB2015eb Psalms 42:8",
            r#"Yahweh<w savlm="strong:H6963">will</w> <w savlm="strong:H5921">command</w> <w savlm="strong:H3605">his</w> loving kindness <w savlm="strong:H5921">in</w> <w savlm="strong:H3605">the</w> daytime.<l eID="gen9297" level="1"/> <l level="2" sID="gen9298"/><w savlm="strong:H5921">In</w> <w savlm="strong:H3605">the</w> night <w savlm="strong:H3605">his</w> song shall <w savlm="strong:H6963">be</w> <w savlm="strong:H0413">with</w> <w savlm="strong:H0413">me</w>:<l eID="gen9298" level="2"/> <l level="2" sID="gen9299"/><w savlm="strong:H7121">a</w> prayer <w savlm="strong:H0413">to</w> <w savlm="strong:H3605">the</w> <w savlm="strong:H0413">God</w> <w savlm="strong:H6963">of</w> <w savlm="strong:H3605">my</w> life. <l eID="gen9299" level="2"/>"#,
            "Yahweh will command his loving kindness in the daytime. In the night his song shall be with me: a prayer to the God of my life.",
        ),
        (
            "engWEB2015eb Matthew 13:25",
            r#"<q marker=""><w savlm="strong:G1161">but</w> <w savlm="strong:G1722">while</w> <w savlm="strong:G0444">people</w> slept, <w savlm="strong:G0846">his</w> <w savlm="strong:G2190">enemy</w> <w savlm="strong:G2064">came</w> <w savlm="strong:G2532">and</w> <w savlm="strong:G4687">sowed</w> darnel <w savlm="strong:G2215">weeds</w></q><q marker=""><w savlm="strong:G2532">also</w> <w savlm="strong:G1722">among</w> <w savlm="strong:G3588">the</w> <w savlm="strong:G4621">wheat</w>, <w savlm="strong:G2532">and</w> <w savlm="strong:G0565">went</w> <w savlm="strong:G0565">away</w>. </q>"#,
            "but while people slept, his enemy came and sowed darnel weeds also among the wheat, and went away.",
        ),
        (
            "engWEB2015eb Song of Solomon 1:4",
            r#"<w savlm="strong:H0935">Take</w> <w savlm="strong:H0935">me</w> <w savlm="strong:H0310">away</w> <w savlm="strong:H0935">with</w> <w savlm="strong:H0935">you</w>.<l eID="gen15623" level="1"/> <l level="2" sID="gen15624"/><w savlm="strong:H1523">Let’s</w> hurry.<l eID="gen15624" level="2"/> <l level="2" sID="gen15625"/><w savlm="strong:H0935">The</w> <w savlm="strong:H4428">king</w> <w savlm="strong:H4428">has</w> <w savlm="strong:H0935">brought</w> <w savlm="strong:H0935">me</w> <w savlm="strong:H0935">into</w> <w savlm="strong:H0935">his</w> <w savlm="strong:H2315">rooms</w>.<l eID="gen15625" level="2"/> <lg eID="gen15617"/> <speaker>Friends</speaker> <lg sID="gen15626"/> <l level="1" sID="gen15627"/>We <w savlm="strong:H4428">will</w> <w savlm="strong:H4428">be</w> <w savlm="strong:H8055">glad</w> <w savlm="strong:H0935">and</w> <w savlm="strong:H8055">rejoice</w> <w savlm="strong:H0935">in</w> <w savlm="strong:H0935">you</w>.<l eID="gen15627" level="1"/> <l level="2" sID="gen15628"/>We <w savlm="strong:H4428">will</w> praise <w savlm="strong:H0935">your</w> <w savlm="strong:H0157">love</w> more <w savlm="strong:H4428">than</w> <w savlm="strong:H3196">wine</w>!<l eID="gen15628" level="2"/> <lg eID="gen15626"/> <speaker>Beloved</speaker> <lg sID="gen15629"/> <l level="1" sID="gen15630"/><w savlm="strong:H0935">They</w> <w savlm="strong:H4428">are</w> <w savlm="strong:H4339">right</w> <w savlm="strong:H0935">to</w> <w savlm="strong:H0157">love</w> <w savlm="strong:H0935">you</w>. <l eID="gen15630" level="1"/>"#,
            "Take me away with you. Let’s hurry. The king has brought me into his rooms. We will be glad and rejoice in you. We will praise your love more than wine! They are right to love you.",
        ),
        (
            "engWEB2015eb Numbers 21:14",
            r#"<w savlm="strong:H3651">Therefore</w> <w savlm="strong:H5921">it</w> <w savlm="strong:H3068">is</w> <w savlm="strong:H0559">said</w> <w savlm="strong:H5921">in</w> <name type="x-usfm-bk"><w savlm="strong:H0853">The</w> <w savlm="strong:H5612">Book</w> <w savlm="strong:H3068">of</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H4421">Wars</w> <w savlm="strong:H3068">of</w> <w savlm="strong:H3068">Yahweh</w></name>, “Vaheb <w savlm="strong:H5921">in</w> Suphah, <w savlm="strong:H0853">the</w> <w savlm="strong:H5158">valleys</w> <w savlm="strong:H3068">of</w> <w savlm="strong:H0853">the</w> <w savlm="strong:H0769">Arnon</w>,"#,
            "Therefore it is said in The Book of the Wars of Yahweh, “Vaheb in Suphah, the valleys of the Arnon,",
        ),
        (
            "engWEB2015eb Psalms 7:14",
            r#"Behold,<w savlm="strong:H4194">he</w> travails <w savlm="strong:H3627">with</w> iniquity.<l eID="gen7986" level="1"/> <l level="2" sID="gen7987"/>Yes, <w savlm="strong:H4194">he</w> <w savlm="strong:H4194">has</w> conceived mischief,<l eID="gen7987" level="2"/> <l level="2" sID="gen7988"/><w savlm="strong:H3627">and</w> brought <w savlm="strong:H3559">out</w> falsehood. <l eID="gen7988" level="2"/>"#,
            "Behold, he travails with iniquity. Yes, he has conceived mischief, and brought out falsehood.",
        ),
        (
            "engKJV2006eb Genesis 1:2",
            r#"And the <w savlm="strong:H0776">earth</w> <w savlm="strong:H1961">was</w> without <w savlm="strong:H8414">form</w>, and <w savlm="strong:H0922">void</w>; and <w savlm="strong:H2822">darkness</w> <transChange type="added">was</transChange> upon the <w savlm="strong:H6440">face</w> of the <w savlm="strong:H8415">deep</w>. And the <w savlm="strong:H7307">Spirit</w> of <w savlm="strong:H0430">God</w> <w savlm="strong:H7363">moved</w> <w savlm="strong:H5921">upon</w> the <w savlm="strong:H6440">face</w> of the <w savlm="strong:H4325">waters</w>.  <div eID="gen3" type="x-p"/>"#,
            "And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.",
        ),
        (
            "engKJV2006eb Mark 4:24",
            r#"<w savlm="strong:G2532">And</w> he <w savlm="strong:G3004">said</w> unto <w savlm="strong:G0846">them</w>, <q marker=""><w savlm="strong:G0991">Take heed</w> <w savlm="strong:G5101">what</w> <w savlm="strong:G0191">ye hear</w>: <w savlm="strong:G1722">with</w> <w savlm="strong:G3739">what</w> <w savlm="strong:G3358">measure</w> <w savlm="strong:G3354">ye mete</w>, <w savlm="strong:G3354">it shall be measured</w> <w savlm="strong:G5213">to you</w>: <w savlm="strong:G2532">and</w> <w savlm="strong:G5213">unto you</w> <w savlm="strong:G0191">that hear</w> <w savlm="strong:G4369">shall more be give</w>n.</q>"#,
            "And he said unto them, Take heed what ye hear: with what measure ye mete, it shall be measured to you: and unto you that hear shall more be given.",
        ),
        (
            "engKJV2006eb Acts 1:12",
            r#"<w savlm="strong:G5119">Then</w> returned <w savlm="strong:G5290">they</w> <w savlm="strong:G1519">unto</w> <w savlm="strong:G2419">Jerusalem</w> <w savlm="strong:G0575">from</w> the <w savlm="strong:G3735">mount</w> <w savlm="strong:G2564">called</w> <w savlm="strong:G1638">Olivet</w>, <w savlm="strong:G3739">which</w> <w savlm="strong:G2076">is</w> <w savlm="strong:G1451">from</w> <w savlm="strong:G2419">Jerusalem</w> a sabbath <w savlm="strong:G4521">day</w>’<w savlm="strong:G2192">s</w> <w savlm="strong:G3598">journey</w>."#,
            "Then returned they unto Jerusalem from the mount called Olivet, which is from Jerusalem a sabbath day’s journey.",
        ),
        (
            "engKJV2006eb I Samuel 23:29",
            r#"¶ And <w savlm="strong:H1732">David</w> went <w savlm="strong:H5927">up</w> from thence, and <w savlm="strong:H3427">dwelt</w> in strong <w savlm="strong:H4679">holds</w> at <w savlm="strong:H5872">En-gedi</w>.  <chapter eID="1Sam.23"/> <div eID="gen1530" type="x-p"/>"#,
            "And David went up from thence, and dwelt in strong holds at En-gedi.",
        ),
        (
            "engKJV2006eb Exodus 6:3",
            r#"And I <w savlm="strong:H7200">appeared</w> unto <w savlm="strong:H0085">Abraham</w>, unto <w savlm="strong:H3327">Isaac</w>, and unto <w savlm="strong:H3290">Jacob</w>, by <transChange type="added">the name of</transChange> <w savlm="strong:H0410">God</w> <w savlm="strong:H7706">Almighty</w>, but by my <w savlm="strong:H8034">name</w> \nd <w savlm="strong:H3068">JEHOVAH</w></divineName> was I not <w savlm="strong:H3045">known</w> to them."#,
            "And I appeared unto Abraham, unto Isaac, and unto Jacob, by the name of God Almighty, but by my name JEHOVAH was I not known to them.",
        ),
        (
            "engKJV2006eb Matthew 5:3",
            r#"<q marker=""><w savlm="strong:G3107">Blessed</w> <seg type="x-nested"><transChange type="added">are</transChange></seg> <w savlm="strong:G4434">the poor</w> <w savlm="strong:G4151">in spirit</w>: <w savlm="strong:G3754">for</w> <w savlm="strong:G0846">theirs</w> <w savlm="strong:G2076">is</w> <w savlm="strong:G0932">the kingdom</w> <w savlm="strong:G3772">of heaven</w>.</q>"#,
            "Blessed are the poor in spirit: for theirs is the kingdom of heaven.",
        ),
        (
            "spaRV1909eb Genesis 2:12",
            r#"<w savlm="strong:H2091">Y el oro</w> <w savlm="strong:H1931">de aquella</w> <w savlm="strong:H0776">tierra</w> <w savlm="strong:H2896">es bueno</w>: <w savlm="strong:H8033">hay allí</w><transChange type="added">también</transChange><w savlm="strong:H0916">bdelio</w> <w savlm="strong:H0068">y piedra</w> <w savlm="strong:H7718">cornerina</w>."#,
            "Y el oro de aquella tierra es bueno: hay allí también bdelio y piedra cornerina.",
        ),
        (
            "spaRV1909eb Genesis 19:12",
            r#"<w savlm="strong:H0559">Y dijeron</w> <w savlm="strong:H0582">los varones</w> <w savlm="strong:H3876">á Lot</w>: ¿<w savlm="strong:H5750">Tienes</w> <w savlm="strong:H4310">aquí alguno</w> más? <w savlm="strong:H2860">Yernos</w>, <w savlm="strong:H1121">y tus hijos</w> <w savlm="strong:H1323">y tus hijas</w>, <w savlm="strong:H3605">y todo</w> <w savlm="strong:H0834">lo que</w> <w savlm="strong:H5750">tienes</w> <w savlm="strong:H5892">en la ciudad</w>, <w savlm="strong:H3318">sáca</w><transChange type="added">lo</transChange> <w savlm="strong:H4480">de</w> <w savlm="strong:H4725">este lugar</w>:"#,
            "Y dijeron los varones á Lot: ¿Tienes aquí alguno más? Yernos, y tus hijos y tus hijas, y todo lo que tienes en la ciudad, sácalo de este lugar:",
        ),
        (
            "spaRV1909eb I Chronicles 10:13",
            r#"<w savlm="strong:H4191">Así murió</w> <w savlm="strong:H7586">Saúl</w> <w savlm="strong:H4604">por su rebelión</w> <w savlm="strong:H0834">con que</w> <w savlm="strong:H4603">prevaricó</w> <w savlm="strong:H3068">contra Jehová</w>, <w savlm="strong:H5921">contra</w> <w savlm="strong:H1697">la palabra</w> <w savlm="strong:H3068">de Jehová</w>, <w savlm="strong:H0834">la cual</w> <w savlm="strong:H3808">no</w> <w savlm="strong:H8104">guardó</w>; <w savlm="strong:H1571">y porque</w> <w savlm="strong:H1875">consultó</w> <w savlm="strong:H0178">al pythón</w>, preguntándo<transChange type="added">le</transChange>,"#,
            "Así murió Saúl por su rebelión con que prevaricó contra Jehová, contra la palabra de Jehová, la cual no guardó; y porque consultó al pythón, preguntándole,",
        ),
        (
            "spaRV1909eb Joshua 5:4",
            r#"<w savlm="strong:H2088">Esta</w> <w savlm="strong:H1697">es la causa</w> <w savlm="strong:H0834">por la cual</w> <w savlm="strong:H3091">Josué</w><transChange type="added">los</transChange> circuncidó: <w savlm="strong:H3605">todo</w> <w savlm="strong:H5971">el pueblo</w> <w savlm="strong:H3318">que había salido</w> <w savlm="strong:H4714">de Egipto</w>, <w savlm="strong:H2145">los varones</w>, <w savlm="strong:H3605">todos</w> <w savlm="strong:H0582">los hombres</w> <w savlm="strong:H4421">de guerra</w>, <w savlm="strong:H4191">habían muerto</w> <w savlm="strong:H4057">en el desierto</w> <w savlm="strong:H1870">por el camino</w>, <w savlm="strong:H3318">después que salieron</w> <w savlm="strong:H4714">de Egipto</w>."#,
            "Esta es la causa por la cual Josué los circuncidó: todo el pueblo que había salido de Egipto, los varones, todos los hombres de guerra, habían muerto en el desierto por el camino, después que salieron de Egipto.",
        ),
        (
            "spaRV1909eb I Samuel 14:1",
            r#"<w savlm="strong:H3117">Y UN día</w> <w savlm="strong:H1961">aconteció</w>, <w savlm="strong:H3129">que Jonathán</w> <w savlm="strong:H1121">hijo</w> <w savlm="strong:H7586">de Saúl</w> <w savlm="strong:H0559">dijo</w> <w savlm="strong:H5288">á su criado</w> <w savlm="strong:H5375">que le traía</w> <w savlm="strong:H3627">las armas</w>: <w savlm="strong:H3212">Ven</w>, <w savlm="strong:H5676">y pasemos</w> <w savlm="strong:H4673">á la guarnición</w> <w savlm="strong:H6430">de los Filisteos</w>, <w savlm="strong:H0834">que</w> <w savlm="strong:H5674">está á aquel lado</w>. <w savlm="strong:H3808">Y no</w><transChange type="added">lo</transChange><w savlm="strong:H5046">hizo saber</w> <w savlm="strong:H0001">á su padre</w>."#,
            "Y UN día aconteció, que Jonathán hijo de Saúl dijo á su criado que le traía las armas: Ven, y pasemos á la guarnición de los Filisteos, que está á aquel lado. Y no lo hizo saber á su padre.",
        ),
        (
            "spaRV1909eb Revelation of John 1:1",
            r#"<w savlm="strong:G0602">LA revelación</w> <w lemma="G5547" savlm="strong:G2424 G5547">de Jesucristo</w>, <w savlm="strong:G3739">que</w> <w savlm="strong:G2316">Dios</w> <w savlm="strong:G0846">le</w> <w savlm="strong:G1325">dió</w>, <w savlm="strong:G1166">para manifestar</w> <w savlm="strong:G0846">á sus</w> <w savlm="strong:G1401">siervos</w> <w savlm="strong:G3739">las cosas que</w> <w savlm="strong:G1163">deben</w> <w savlm="strong:G1096">suceder</w> <w lemma="G5034" savlm="strong:G1722 G5034">presto</w>; <w savlm="strong:G2532">y</w><transChange type="added">la</transChange><w savlm="strong:G4591">declaró</w>, <w savlm="strong:G0649">enviándo</w><transChange type="added">la</transChange><w savlm="strong:G1223">por</w> <w savlm="strong:G0846">su</w> <w savlm="strong:G0032">ángel</w> <w savlm="strong:G2491">á Juan</w> <w savlm="strong:G0846">su</w> <w savlm="strong:G1401">siervo</w>,"#,
            "LA revelación de Jesucristo, que Dios le dió, para manifestar á sus siervos las cosas que deben suceder presto; y la declaró, enviándola por su ángel á Juan su siervo,",
        ),
        (
            "spaRV1909eb Romans 16:27",
            r#"<w savlm="strong:G3441">Al solo</w> <w savlm="strong:G2316">Dios</w> <w savlm="strong:G4680">sabio</w>, <w savlm="strong:G1391">sea gloria</w> <w lemma="G5547" savlm="strong:G2424 G5547">por Jesucristo</w> <w savlm="strong:G1519">para</w> <w savlm="strong:G0165">siempre</w>. <w savlm="strong:G0281">Amén</w>. <w savlm="strong:G1125">Fué escrita</w> <w savlm="strong:G0575">de</w> <w savlm="strong:G2882">Corinto</w> <w savlm="strong:G4314">á</w> <w savlm="strong:G4514">los Romanos</w>, <transChange type="added">enviada</transChange><w savlm="strong:G1223">por</w><transChange type="added">medio de</transChange><w savlm="strong:G5402">Febe</w>, <w savlm="strong:G1249">diaconisa</w> <w savlm="strong:G1577">de la iglesia</w> <w savlm="strong:G2747">de Cencreas</w>. <chapter eID="Rom.16"/><div eID="gen1108" type="x-p"/> <div canonical="true" eID="gen1092" osisID="Rom" type="book"/>"#,
            "Al solo Dios sabio, sea gloria por Jesucristo para siempre. Amén. Fué escrita de Corinto á los Romanos, enviada por medio de Febe, diaconisa de la iglesia de Cencreas.",
        ),
        (
            "spaRV1909eb Luke 17:1",
            r#"<w savlm="strong:G1161">Y</w> <w savlm="strong:G4314">Á</w> <w savlm="strong:G3588">SUS</w> <w savlm="strong:G3101">discípulos</w> <w savlm="strong:G2036">dice</w>: <w savlm="strong:G0418">Imposible</w> <w savlm="strong:G2076">es</w> <w savlm="strong:G3588">que</w> <w savlm="strong:G3361">no</w> <w savlm="strong:G2064">vengan</w> <w savlm="strong:G4625">escándalos</w>; <w savlm="strong:G1161">mas</w> ¡<w savlm="strong:G3759">ay</w> <w savlm="strong:G1223">de aquél por</w> <w savlm="strong:G3739">quien</w> <w savlm="strong:G2064">vienen</w>!"#,
            "Y Á SUS discípulos dice: Imposible es que no vengan escándalos; mas ¡ay de aquél por quien vienen!",
        ),
        (
            "spaRV1909eb Genesis 1:1",
            r#"<w savlm="strong:H7225">EN el principio</w> <w savlm="strong:H1254">crió</w> <w savlm="strong:H0430">Dios</w> <w savlm="strong:H8064">los cielos</w> <w savlm="strong:H0776">y la tierra</w>."#,
            "EN el principio crió Dios los cielos y la tierra.",
        ),
        (
            "spaRV1909eb Genesis 3:1",
            r#"<w savlm="strong:H5175">EMPERO la serpiente</w> <w savlm="strong:H1961">era</w> <w savlm="strong:H6175">astuta</w>, <w savlm="strong:H3605">más que todos</w> <w savlm="strong:H2416">los animales</w> <w savlm="strong:H7704">del campo</w> <w savlm="strong:H0834">que</w> <w savlm="strong:H3068">Jehová</w> <w savlm="strong:H0430">Dios</w> <w savlm="strong:H6213">había hecho</w>; <w savlm="strong:H0559">la cual dijo</w> <w savlm="strong:H0413">á</w> <w savlm="strong:H0802">la mujer</w>: ¿<w lemma="H3588" savlm="strong:H0637 H3588">Conque</w> <w savlm="strong:H0430">Dios</w> <w savlm="strong:H0559">os ha dicho</w>: <w savlm="strong:H3808">No</w> <w savlm="strong:H0398">comáis</w> <w savlm="strong:H3605">de todo</w> <w savlm="strong:H6086">árbol</w> <w savlm="strong:H1588">del huerto</w>?"#,
            "EMPERO la serpiente era astuta, más que todos los animales del campo que Jehová Dios había hecho; la cual dijo á la mujer: ¿Conque Dios os ha dicho: No comáis de todo árbol del huerto?",
        ),
    ];

    #[test]
    fn clean_verse_on_real_verses() {
        for (reference, raw, want) in CLEAN_CASES {
            assert_eq!(clean_verse(raw), *want, "{reference}");
        }
    }

    #[test]
    fn markup_details() {
        // Notes are dropped with their text; entities are decoded; back matter is cut.
        assert_eq!(
            clean_verse(r#"God<note placement="foot">Or, gods</note><w>created</w> &amp; made"#),
            "God created & made"
        );
        assert_eq!(
            clean_verse(
                r#"Amen. <div canonical="true" eID="gen1" osisID="Rev" type="book"/> <list><item>Glossary</item></list>"#
            ),
            "Amen."
        );
        // A break element before punctuation leaves no space before it.
        assert_eq!(clean_verse(r#"word<l eID="x"/> , next"#), "word, next");
        assert_eq!(clean_verse("  a \t b\u{a0}c  "), "a b c");
    }
}
