//! "Did you mean …?": the closest known name to a misspelt one, by edit distance.

/// The candidate closest to `typo`, when it is close enough to be a likely misspelling: at most a
/// third of the typo's length in edits (at least one), as rustc judges its own suggestions.
pub(crate) fn closest<'a>(typo: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (typo.chars().count() / 3).max(1);
    candidates
        .iter()
        .map(|c| (edit_distance(typo, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance: the fewest single-character insertions, deletions and substitutions
/// that turn `a` into `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    // One row of the DP table: row[j] = distance between the prefix of `a` so far and b[..j].
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("ttl_ms", "ttl_ms"), 0);
        assert_eq!(edit_distance("ttl_msec", "ttl_ms"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "key"), 3);
        assert_eq!(edit_distance("wachdog", "watchdog"), 1);
    }

    #[test]
    fn suggests_only_close_names() {
        let names = ["key", "ttl_ms", "ttl", "watchdog", "wait_ms", "read", "write"];
        assert_eq!(closest("ttl_msec", &names), Some("ttl_ms"));
        assert_eq!(closest("watch_dog", &names), Some("watchdog"));
        assert_eq!(closest("keys", &names), Some("key"));
        assert_eq!(closest("reed", &names), Some("read"));
        assert_eq!(closest("timeout_ms", &names), None);
        assert_eq!(closest("x", &names), None);
    }
}
