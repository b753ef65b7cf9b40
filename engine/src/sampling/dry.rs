//! DRY ("don't repeat yourself", after koboldcpp and llama.cpp): a candidate that would extend
//! a sequence already seen in the recent history is penalised exponentially in the length of
//! that sequence.

use std::collections::HashMap;

use super::SamplerParams;

/// Longest breaker text looked at, in bytes (llama.cpp's limit).
const MAX_BREAKER_BYTES: usize = 40;
/// Longest tail of a breaker, in tokens (llama.cpp's limit).
const MAX_TAIL_TOKENS: usize = 20;
/// ln(f32::MAX): the penalty's exponent is clamped so that `base^exponent` stays finite.
const LN_F32_MAX: f64 = 88.722_839;

/// Sequence breakers by their first token: the rest of each sequence (empty for a one-token
/// breaker).
pub(crate) type Breakers = HashMap<u32, Vec<Vec<u32>>>;

/// Groups [`SamplerParams::dry_sequence_breakers`] by their first token.
pub(crate) fn index_breakers(seqs: &[Vec<u32>]) -> Breakers {
    let mut map: Breakers = HashMap::new();
    for seq in seqs {
        if let Some((&head, tail)) = seq.split_first() {
            let tails = map.entry(head).or_default();
            if !tails.iter().any(|t| t == tail) {
                tails.push(tail.to_vec());
            }
        }
    }
    map
}

/// Token sequences for DRY's breakers given as text, the way llama.cpp derives them from its
/// vocabulary: every token whose text contains a breaker is a one-token breaker, and a token
/// whose text ends with the start of a breaker heads a sequence whose tail is the tokenized
/// rest of the breaker (at most 20 tokens). Breakers are cut to 40 bytes; empty ones are
/// skipped.
///
/// `piece(id)` gives the text (bytes) of token `id` for ids below `n_vocab`, and `tokenize`
/// tokenizes text without special tokens, e.g. with the engine's tokenizer:
/// `dry_breakers_from_strings(&breakers, tok.n_vocab(), |id| tok.token_bytes(id),
/// |s| tok.encode(s, false, false).unwrap_or_default())`.
///
/// The rest of a breaker is only tokenized where it starts on a character boundary: a token
/// ending inside a multi-byte character of a breaker does not head a sequence.
pub fn dry_breakers_from_strings<S, P, B, T>(
    breakers: &[S],
    n_vocab: usize,
    mut piece: P,
    mut tokenize: T,
) -> Vec<Vec<u32>>
where
    S: AsRef<str>,
    P: FnMut(u32) -> B,
    B: AsRef<[u8]>,
    T: FnMut(&str) -> Vec<u32>,
{
    let mut out: Vec<Vec<u32>> = Vec::new();
    let push = |seq: Vec<u32>, out: &mut Vec<Vec<u32>>| {
        if !out.contains(&seq) {
            out.push(seq);
        }
    };
    for breaker in breakers {
        let mut text = breaker.as_ref();
        if text.len() > MAX_BREAKER_BYTES {
            let mut end = MAX_BREAKER_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text = &text[..end];
        }
        let pat = text.as_bytes();
        if pat.is_empty() {
            continue;
        }
        for id in 0..n_vocab.min(u32::MAX as usize) as u32 {
            let bytes = piece(id);
            let word = bytes.as_ref();
            if word.windows(pat.len()).any(|w| w == pat) {
                push(vec![id], &mut out);
                continue;
            }
            // Suffixes of the token that are a proper prefix of the breaker.
            for start in 0..word.len() {
                let suffix = &word[start..];
                if suffix.len() >= pat.len() || !pat.starts_with(suffix) {
                    continue;
                }
                let rest = suffix.len();
                if !text.is_char_boundary(rest) {
                    continue;
                }
                let mut seq = vec![id];
                seq.extend(tokenize(&text[rest..]).into_iter().take(MAX_TAIL_TOKENS));
                push(seq, &mut out);
            }
        }
    }
    out
}

/// DRY's penalty for each token that would extend a repetition, from the last
/// `dry_penalty_last_n` tokens of `history`. Empty when DRY is off.
pub(crate) fn penalties(
    history: &[u32],
    p: &SamplerParams,
    breakers: &Breakers,
) -> HashMap<u32, f32> {
    let mut out = HashMap::new();
    if p.dry_multiplier == 0.0 || p.dry_base < 1.0 || p.dry_penalty_last_n == 0 {
        return out;
    }
    let n = history.len().min(p.dry_penalty_last_n);
    let allowed = p.dry_allowed_length;
    if n <= allowed {
        return out;
    }
    // The window read backwards: rev[0] is the last token.
    let rev: Vec<u32> = history[history.len() - n..].iter().rev().copied().collect();

    // A breaker in the window bounds how far back a repetition may reach: the tokens after
    // the most recent breaker.
    let mut limit = n;
    for (i, tok) in rev.iter().enumerate() {
        let Some(tails) = breakers.get(tok) else {
            continue;
        };
        // The tail follows the head in time: rev[i - 1], rev[i - 2], ...
        let longest = tails
            .iter()
            .filter(|t| t.len() <= i && t.iter().enumerate().all(|(o, &x)| rev[i - 1 - o] == x))
            .map(Vec::len)
            .max();
        if let Some(len) = longest {
            limit = i - len;
            break;
        }
    }
    if limit < allowed {
        return out;
    }

    // z[k]: how many tokens ending k tokens before the end repeat the window's last tokens.
    // The token after that earlier occurrence, rev[k - 1], would extend the repetition.
    let z = z_array(&rev);
    let mut longest: HashMap<u32, usize> = HashMap::new();
    for k in 1..n {
        let len = z[k].min(limit);
        if len >= allowed {
            let e = longest.entry(rev[k - 1]).or_insert(0);
            *e = (*e).max(len);
        }
    }

    let base = f64::from(p.dry_base);
    let max_exp = if base > 1.000_001 {
        (LN_F32_MAX / base.ln()) as usize
    } else {
        usize::MAX
    };
    for (tok, len) in longest {
        let is_breaker = breakers
            .get(&tok)
            .is_some_and(|tails| tails.iter().any(Vec::is_empty));
        if is_breaker {
            continue;
        }
        let exp = (len - allowed).min(max_exp);
        let exp = i32::try_from(exp).unwrap_or(i32::MAX);
        let penalty = f64::from(p.dry_multiplier) * base.powi(exp);
        out.insert(tok, penalty as f32);
    }
    out
}

/// The Z-array of `s`: `z[k]` is the length of the longest common prefix of `s` and `s[k..]`
/// (`z[0] = s.len()`), in linear time.
fn z_array(s: &[u32]) -> Vec<usize> {
    let n = s.len();
    let mut z = vec![0; n];
    if n == 0 {
        return z;
    }
    z[0] = n;
    // [left, right) is the rightmost window known to match a prefix of s.
    let (mut left, mut right) = (0, 0);
    for k in 1..n {
        let mut len = if k < right {
            z[k - left].min(right - k)
        } else {
            0
        };
        while k + len < n && s[len] == s[k + len] {
            len += 1;
        }
        z[k] = len;
        if k + len > right {
            left = k;
            right = k + len;
        }
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z_array_matches_the_naive_definition() {
        let s = [1u32, 2, 1, 2, 1, 3, 1, 2, 1, 2, 1, 2];
        let z = z_array(&s);
        for k in 1..s.len() {
            let naive = (0..s.len() - k).take_while(|&i| s[i] == s[k + i]).count();
            assert_eq!(z[k], naive, "k={k}");
        }
    }
}
