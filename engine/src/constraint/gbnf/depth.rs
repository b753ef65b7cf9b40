//! The bound on chains of rules ([`MAX_RULE_DEPTH`]), checked without recursion.

use super::{Expr, GbnfError, Parser, MAX_RULE_DEPTH};

impl Parser<'_> {
    /// Refuses a chain of more than [`MAX_RULE_DEPTH`] rules, each referring to the next,
    /// whatever order the rules come in: the longest path of references, found by a walk of its
    /// own (no recursion), where a reference back to a rule on the walk's path (recursion in the
    /// grammar) does not lengthen a chain.
    pub(super) fn check_rule_depth(&self) -> Result<(), GbnfError> {
        let refs: Vec<Vec<usize>> = self
            .rules
            .iter()
            .map(|r| rule_refs(r.body.as_deref().unwrap_or(&[])))
            .collect();
        // 0: not seen, 1: on the path, 2: done, with its chain's length in `depth`.
        let mut state = vec![0u8; refs.len()];
        let mut depth = vec![0usize; refs.len()];
        let mut path: Vec<(usize, usize)> = Vec::new();
        for start in 0..refs.len() {
            if state[start] != 0 {
                continue;
            }
            state[start] = 1;
            path.push((start, 0));
            while let Some(&mut (rule, ref mut next)) = path.last_mut() {
                if let Some(&to) = refs[rule].get(*next) {
                    *next += 1;
                    if state[to] == 0 {
                        state[to] = 1;
                        path.push((to, 0));
                    }
                    continue;
                }
                let below = refs[rule]
                    .iter()
                    .filter(|&&c| state[c] == 2)
                    .map(|&c| depth[c])
                    .max()
                    .unwrap_or(0);
                depth[rule] = below + 1;
                if depth[rule] > MAX_RULE_DEPTH {
                    let (line, column) = self.rules[rule].first_use;
                    return Err(GbnfError {
                        line,
                        column,
                        rule: Some(self.rules[rule].name.clone()),
                        message: format!(
                            "rules refer to each other in a chain more than {MAX_RULE_DEPTH} deep"
                        ),
                    });
                }
                state[rule] = 2;
                path.pop();
            }
        }
        Ok(())
    }
}

/// The rules that `alts` refers to, each once (its items nest at most
/// [`MAX_NESTING`](super::MAX_NESTING) deep).
fn rule_refs(alts: &[Vec<Expr>]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut todo: Vec<&Expr> = alts.iter().flatten().collect();
    while let Some(e) = todo.pop() {
        match e {
            Expr::Rule(i) => out.push(*i),
            Expr::Group(alts) => todo.extend(alts.iter().flatten()),
            Expr::Repeat { inner, .. } => todo.push(inner),
            Expr::Literal(_) | Expr::Chars(_) | Expr::Token { .. } => {}
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
