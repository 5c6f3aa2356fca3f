//! The 66 books of the Protestant canon and verse references, shared by every step.

use std::fmt;

/// The 66 books, as OSIS ids (diatheke accepts them as keys), in canonical order.
pub const BOOKS: [&str; 66] = [
    "Gen", "Exod", "Lev", "Num", "Deut", "Josh", "Judg", "Ruth", "1Sam", "2Sam", "1Kgs", "2Kgs",
    "1Chr", "2Chr", "Ezra", "Neh", "Esth", "Job", "Ps", "Prov", "Eccl", "Song", "Isa", "Jer",
    "Lam", "Ezek", "Dan", "Hos", "Joel", "Amos", "Obad", "Jonah", "Mic", "Nah", "Hab", "Zeph",
    "Hag", "Zech", "Mal", "Matt", "Mark", "Luke", "John", "Acts", "Rom", "1Cor", "2Cor", "Gal",
    "Eph", "Phil", "Col", "1Thess", "2Thess", "1Tim", "2Tim", "Titus", "Phlm", "Heb", "Jas",
    "1Pet", "2Pet", "1John", "2John", "3John", "Jude", "Rev",
];
/// Index of the first New Testament book (Matthew) in [`BOOKS`].
pub(super) const FIRST_NT_BOOK: usize = 39;

/// Index of an OSIS book id in [`BOOKS`] (case-insensitive).
pub fn book_index(osis: &str) -> Option<usize> {
    BOOKS
        .iter()
        .position(|b| b.eq_ignore_ascii_case(osis.trim()))
}

/// A verse reference; orders as the canon does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VerseRef {
    /// Index in [`BOOKS`].
    pub book: usize,
    pub chapter: u32,
    pub verse: u32,
}

impl fmt::Display for VerseRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{}", BOOKS[self.book], self.chapter, self.verse)
    }
}

/// The reference of `book` (an OSIS id) `chapter:verse`.
#[cfg(test)]
pub(super) fn vref(book: &str, chapter: u32, verse: u32) -> VerseRef {
    VerseRef {
        book: book_index(book).unwrap(),
        chapter,
        verse,
    }
}
