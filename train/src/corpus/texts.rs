//! The cleaned texts of a module: every verse through [`clean_verse`], plus the fixes each
//! module needs (English: psalm headings put back; Spanish: subscriptions cut, drop caps
//! re-cased).

use std::collections::BTreeMap;

use super::canon::{VerseRef, FIRST_NT_BOOK};
use super::osis::clean_verse;
use super::recase::{fix_drop_cap, CaseLexicon};
use super::sword::RawVerse;

/// Cleaned texts of one module (an empty string for a verse the module leaves empty).
pub type ModuleTexts = BTreeMap<VerseRef, String>;

/// Cleans the raw verses of an English module; a canonical heading is put in front of its
/// verse.
pub fn english_texts(raw: &[RawVerse]) -> ModuleTexts {
    raw.iter()
        .map(|v| {
            let body = clean_verse(&v.body);
            let text = match v.title.as_deref().map(clean_verse) {
                Some(title) if !title.is_empty() && !body.is_empty() => format!("{title} {body}"),
                _ => body,
            };
            (v.vref, text)
        })
        .collect()
}

/// Cleans the raw verses of the Spanish module: subscriptions cut from the last verse of the
/// New Testament books, chapter-initial capitals re-cased.
pub fn spanish_texts(raw: &[RawVerse]) -> ModuleTexts {
    let mut texts: ModuleTexts = raw.iter().map(|v| (v.vref, clean_verse(&v.body))).collect();
    let last_of_book: BTreeMap<usize, VerseRef> = texts
        .keys()
        .map(|r| (r.book, *r))
        .collect::<BTreeMap<_, _>>();
    for (book, vref) in last_of_book {
        if book >= FIRST_NT_BOOK {
            let t = texts.get_mut(&vref).unwrap();
            *t = strip_subscription(t);
        }
    }
    let lexicon = CaseLexicon::from_texts(texts.values().map(String::as_str));
    for (vref, text) in texts.iter_mut() {
        if vref.verse == 1 {
            *text = fix_drop_cap(text, &lexicon);
        }
    }
    texts
}

/// Cuts what the RV1909 appends after the last "Amén." of an epistle (its subscription:
/// "Fué escrita de Corinto á los Romanos, ...").
pub fn strip_subscription(text: &str) -> String {
    match text.rfind("Amén.") {
        Some(i) if !text[i + "Amén.".len()..].trim().is_empty() => {
            text[..i + "Amén.".len()].to_string()
        }
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::canon::book_index;
    use crate::corpus::osis::tests::CLEAN_CASES;
    use crate::corpus::sword::{parse_diatheke_output, KJV_MODULE};

    /// KJV Psalms as diatheke prints them with a whole-book key: the title of Ps 9 is printed
    /// again before Ps 10:1, as is the title of Ps 3 before Ps 3:2.
    const KJV_PSALMS: &str = concat!(
        r#"<title canonical="true" type="psalm">A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>, when he <w savlm="strong:H1272">fled</w> <w savlm="strong:H6440">from</w> <w savlm="strong:H0053">Absalom</w> his <w savlm="strong:H1121">son</w>.</title> <lg sID="gen2600"/> <l level="1" sID="gen2601"/> Psalms 3:1: <divineName><w savlm="strong:H3068">LORD</w></divineName>, how are they <w savlm="strong:H7231">increased</w> that <w savlm="strong:H6862">trouble</w> me! <w savlm="strong:H7227">many</w> <transChange type="added">are</transChange> they that rise <w savlm="strong:H6965">up</w> against me. <l eID="gen2601" level="1"/>"#,
        "\n",
        r#"<title canonical="true" type="psalm">A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>, when he <w savlm="strong:H1272">fled</w> <w savlm="strong:H6440">from</w> <w savlm="strong:H0053">Absalom</w> his <w savlm="strong:H1121">son</w>.</title> <lg sID="gen2600"/> <l level="1" sID="gen2601"/> Psalms 3:2: <w savlm="strong:H7227">Many</w> <transChange type="added">there be</transChange> which <w savlm="strong:H0559">say</w> of my <w savlm="strong:H5315">soul</w>, <transChange type="added">There is</transChange> no <w savlm="strong:H3444">help</w> for him in <w savlm="strong:H0430">God</w>. <w savlm="strong:H5542">Selah</w>. <l eID="gen2602" level="1"/>"#,
        "\n",
        r#"<title canonical="true" type="psalm">To the chief <w savlm="strong:H5329">Musician</w> upon <w savlm="strong:H4192">Muthlabben</w>, A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>.</title> <lg sID="gen2670"/> <l level="1" sID="gen2671"/> Psalms 9:20: <w savlm="strong:H7896">Put</w> them in <w savlm="strong:H4172">fear</w>, O <divineName><w savlm="strong:H3068">LORD</w></divineName>: <transChange type="added">that</transChange> the <w savlm="strong:H1471">nations</w> may <w savlm="strong:H3045">know</w> themselves <transChange type="added">to be but</transChange> <w savlm="strong:H0582">men</w>. <w savlm="strong:H5542">Selah</w>.  <chapter eID="Ps.9"/>"#,
        "\n",
        r#"<title canonical="true" type="psalm">To the chief <w savlm="strong:H5329">Musician</w> upon <w savlm="strong:H4192">Muthlabben</w>, A <w savlm="strong:H4210">Psalm</w> of <w savlm="strong:H1732">David</w>.</title> <lg sID="gen2670"/> <l level="1" sID="gen2671"/> Psalms 10:1: Why <w savlm="strong:H5975">standest</w> thou afar <w savlm="strong:H7350">off</w>, O <divineName><w savlm="strong:H3068">LORD</w></divineName>? <transChange type="added">why</transChange> <w savlm="strong:H5956">hidest</w> thou <transChange type="added">thyself</transChange> in <w savlm="strong:H6256">times</w> of <w savlm="strong:H6869">trouble</w>? <l eID="gen2691" level="1"/>"#,
        "\n",
        "(engKJV2006eb)\n"
    );

    #[test]
    fn parse_keeps_a_title_once_and_skips_the_trailer() {
        let ps = book_index("Ps").unwrap();
        let verses = parse_diatheke_output(KJV_MODULE, ps, KJV_PSALMS).unwrap();
        let refs: Vec<String> = verses.iter().map(|v| v.vref.to_string()).collect();
        assert_eq!(refs, ["Ps 3:1", "Ps 3:2", "Ps 9:20", "Ps 10:1"]);
        // Ps 3:1 has its title; Ps 3:2 and Ps 10:1 only carry diatheke's repetitions.
        assert!(verses[0].title.is_some());
        assert!(verses[1].title.is_none());
        assert!(verses[3].title.is_none());
        let texts = english_texts(&verses);
        assert_eq!(
            texts[&verses[0].vref],
            "A Psalm of David, when he fled from Absalom his son. LORD, how are they increased \
             that trouble me! many are they that rise up against me."
        );
        assert_eq!(
            texts[&verses[3].vref],
            "Why standest thou afar off, O LORD? why hidest thou thyself in times of trouble?"
        );
    }

    #[test]
    fn subscriptions_are_cut() {
        let rom_16_27 = clean_verse(
            CLEAN_CASES
                .iter()
                .find(|c| c.0.ends_with("Romans 16:27"))
                .unwrap()
                .1,
        );
        assert_eq!(
            strip_subscription(&rom_16_27),
            "Al solo Dios sabio, sea gloria por Jesucristo para siempre. Amén."
        );
        let plain = "La gracia de nuestro Señor Jesucristo sea con todos vosotros. Amén.";
        assert_eq!(strip_subscription(plain), plain);
    }
}
