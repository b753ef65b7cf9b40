//! Probabilities of generated tokens, as llama-server's `n_probs` and OpenAI's `logprobs`
//! report them: the softmax of the logits the sampler was given.

use super::TokenProbs;

/// The probability of `chosen` and the `n` most likely tokens under the softmax of `logits`
/// (NaN logits count as impossible).
pub(super) fn token_probs(logits: &[f32], chosen: u32, n: usize) -> TokenProbs {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let weight = |l: f32| {
        if l.is_nan() || max == f32::NEG_INFINITY {
            0.0
        } else {
            f64::from(l - max).exp()
        }
    };
    let total: f64 = logits.iter().map(|&l| weight(l)).sum();
    let prob = |l: f32| {
        if total > 0.0 {
            (weight(l) / total) as f32
        } else {
            0.0
        }
    };
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let key = |&i: &u32| {
        let l = logits[i as usize];
        if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            l
        }
    };
    let n = n.min(order.len());
    if n > 0 && n < order.len() {
        order.select_nth_unstable_by(n - 1, |a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
    }
    order.truncate(n);
    order.sort_unstable_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
    TokenProbs {
        id: chosen,
        prob: logits.get(chosen as usize).map_or(0.0, |&l| prob(l)),
        top: order
            .into_iter()
            .map(|i| (i, prob(logits[i as usize])))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_tokens_come_most_likely_first_with_softmax_probabilities() {
        let logits = [0.0, 2.0, f32::NAN, 1.0, f32::NEG_INFINITY];
        let p = token_probs(&logits, 3, 3);
        let ids: Vec<u32> = p.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 0]);
        let e = |x: f64| x.exp();
        let total = e(0.0) + e(2.0) + e(1.0);
        assert!((f64::from(p.prob) - e(1.0) / total).abs() < 1e-6);
        assert!((f64::from(p.top[0].1) - e(2.0) / total).abs() < 1e-6);
        let sum: f32 = token_probs(&logits, 0, 5).top.iter().map(|t| t.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }
}
