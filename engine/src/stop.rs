//! Stop strings over text that grows a token at a time: where the earliest one starts, and how
//! much of the text can be handed on without risking handing on the start of one. The one
//! implementation the session's generation loop and the server's slots share.

/// A set of stop strings matched against a text that only grows between calls of
/// [`StopStrings::find`]: each call searches only the part that can hold a match it has not
/// seen, so a reply of `n` tokens costs `O(n)` comparisons, not `O(n²)`.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Bytes of the longest stop string.
    longest: usize,
    /// Bytes of the text searched by the last call.
    searched: usize,
}

impl StopStrings {
    /// The stop strings `stops` (empty ones are ignored).
    pub fn new(stops: &[String]) -> StopStrings {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopStrings {
            stops,
            longest,
            searched: 0,
        }
    }

    /// Whether there is no stop string.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The byte offset where the earliest stop string starts in `text`, and that string. `text`
    /// must extend the text of the previous call (a shorter or different text starts over).
    pub fn find(&mut self, text: &str) -> Option<(usize, &str)> {
        if self.stops.is_empty() {
            return None;
        }
        // A match not seen before ends in the new bytes, so it starts at most `longest - 1`
        // bytes before them.
        let mut from = match self.searched <= text.len() {
            true => self.searched.saturating_sub(self.longest.saturating_sub(1)),
            false => 0,
        };
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        self.searched = text.len();
        let tail = &text[from..];
        self.stops
            .iter()
            .filter_map(|s| tail.find(s.as_str()).map(|at| (from + at, s.as_str())))
            .min_by_key(|&(at, _)| at)
    }

    /// Length of the longest prefix of `text` after which no continuation can complete a stop
    /// string that starts before it (only the last characters are looked at).
    pub fn safe_prefix_len(&self, text: &str) -> usize {
        let mut safe = text.len();
        for stop in &self.stops {
            // The longest suffix of `text` that is a proper prefix of `stop`.
            for (start, _) in text.char_indices().rev().take(stop.chars().count()) {
                if stop.starts_with(&text[start..]) {
                    safe = safe.min(start);
                }
            }
        }
        safe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> StopStrings {
        StopStrings::new(&s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn the_earliest_stop_string_is_found() {
        assert_eq!(
            stops(&["STOP", "END"]).find("abc END xyz STOP"),
            Some((4, "END"))
        );
        assert_eq!(stops(&["", "x"]).find("abc"), None);
        assert!(stops(&[""]).is_empty());
    }

    #[test]
    fn a_stop_string_split_across_calls_is_found_where_it_starts() {
        let mut s = stops(&["</end>", "ééé"]);
        let mut text = String::new();
        for piece in ["hello </", "en", "d> more"] {
            text.push_str(piece);
            if let Some(found) = s.find(&text) {
                assert_eq!(found, (6, "</end>"));
                assert_eq!(text, "hello </end> more");
                break;
            }
        }
        // Multi-byte characters: the search starts on a character boundary.
        let mut s = stops(&["ééé"]);
        assert_eq!(s.find("aéé"), None);
        assert_eq!(s.find("aééé"), Some((1, "ééé")));
    }

    #[test]
    fn text_that_does_not_extend_the_last_one_is_searched_whole() {
        let mut s = stops(&["END"]);
        assert_eq!(s.find("a long text without it"), None);
        assert_eq!(s.find("END"), Some((0, "END")));
    }

    #[test]
    fn text_that_may_begin_a_stop_string_is_held_back() {
        let s = stops(&["END", "</end>"]);
        assert_eq!(s.safe_prefix_len("hello EN"), 6);
        assert_eq!(s.safe_prefix_len("hello </e"), 6);
        assert_eq!(s.safe_prefix_len("hello"), 5);
        assert_eq!(s.safe_prefix_len("a<"), 1);
        assert_eq!(stops(&["éx"]).safe_prefix_len("héé"), 3);
    }
}
