//! Inputs of a chosen length, for what depends on how long a text is (memory, timeouts).

/// The longest run of `words` (repeated as needed) that `subwords` (the count the server
/// would see, EOS included) keeps within `length`, and its count: found by bisection, since
/// the count of a run of words is not the sum of the words' counts.
pub fn text_of_subwords<E>(
    words: &[&str],
    length: usize,
    subwords: impl Fn(&str) -> Result<usize, E>,
) -> Result<(String, usize), E> {
    let all: Vec<&str> = words.iter().copied().cycle().take(4 * length).collect();
    let count = |n: usize| subwords(&all[..n].join(" "));
    let (mut lo, mut hi) = (1, all.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if count(mid)? <= length {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok((all[..lo].join(" "), count(lo)?))
}

/// `count` texts of at most `length` subwords each (by `subwords`, as in [`text_of_subwords`]),
/// with their counts: runs of `words`, each starting 7 words further in, so that no two are
/// alike (a cache or a batch cannot share them).
pub fn distinct_texts_of_subwords<E>(
    words: &[&str],
    count: usize,
    length: usize,
    subwords: impl Fn(&str) -> Result<usize, E>,
) -> Result<Vec<(String, usize)>, E> {
    (0..count)
        .map(|k| {
            let start = (k * 7) % words.len().max(1);
            let rotated: Vec<&str> = words[start..]
                .iter()
                .chain(&words[..start])
                .copied()
                .collect();
            text_of_subwords(&rotated, length, &subwords)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_run_within_the_length() {
        // One subword per character, plus EOS: "ab cd" is 6.
        let count = |t: &str| Ok::<_, ()>(t.len() + 1);
        let (text, n) = text_of_subwords(&["ab", "cd"], 9, count).unwrap();
        assert_eq!((text.as_str(), n), ("ab cd ab", 9));
        let (text, n) = text_of_subwords(&["ab", "cd"], 8, count).unwrap();
        assert_eq!((text.as_str(), n), ("ab cd", 6));
    }
}
