//! Stop strings: where one starts, and how much text can be sent without risking sending the
//! start of one.

/// Byte offset where the earliest stop string starts, and that string, if one occurs.
pub(super) fn find_stop<'a>(text: &str, stops: &'a [String]) -> Option<(usize, &'a str)> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s.as_str())))
        .min_by_key(|&(at, _)| at)
}

/// Length of the longest prefix of `text` after which no continuation can complete a stop
/// string that starts before it.
pub(super) fn safe_prefix_len(text: &str, stops: &[String]) -> usize {
    let mut safe = text.len();
    for stop in stops.iter().filter(|s| !s.is_empty()) {
        for (start, _) in text.char_indices().rev().take(stop.chars().count()) {
            if stop.starts_with(&text[start..]) {
                safe = safe.min(start);
            }
        }
    }
    safe
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_stop_string_is_found_at_its_earliest_start() {
        assert_eq!(
            find_stop("abc END xyz STOP", &stops(&["STOP", "END"])),
            Some((4, "END"))
        );
        assert_eq!(find_stop("abc", &stops(&["", "x"])), None);
    }

    #[test]
    fn text_that_may_begin_a_stop_string_is_held_back() {
        assert_eq!(safe_prefix_len("hello EN", &stops(&["END"])), 6);
        assert_eq!(safe_prefix_len("hello", &stops(&["END"])), 5);
        assert_eq!(safe_prefix_len("héé", &stops(&["éx"])), 3);
    }
}
