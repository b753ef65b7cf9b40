//! The base file of llama.cpp's `llama-perplexity --kl-divergence-base FILE`, read so that our
//! evaluation is scored against llama.cpp's own logits, with the definitions of its
//! `--kl-divergence` mode.
//!
//! The layout (little-endian): the 8 bytes `_logits_`; `n_ctx`, `n_vocab` and `n_chunk` as i32;
//! the text's first `n_chunk * n_ctx` token ids as i32, as tokenized (before the first token of
//! each chunk is replaced by BOS); then, for each chunk and each of its `n_ctx - 1 - n_ctx / 2`
//! scored positions (those from `n_ctx / 2` on, each predicting the next token), one row of
//! `2 * ceil(n_vocab / 2) + 4` u16: the f32 `scale` and the f32 `min` (four u16), then one u16
//! `q` a token (padded to an even count), the token's natural-log probability being
//! `scale * q + min`. Tokens more than 16 nats less likely than the most likely one are stored as
//! `q = 0`, that is at `min`.
//!
//! The base's perplexity read back from the rows is llama.cpp's `Mean PPL(base)`: where a next
//! token lies more than 16 nats below the most likely one its stored log-probability is raised
//! to that bound, so it reads lower than the `Final estimate` the run that wrote the file printed
//! from its f32 logits. Ours is computed from our f32 logits: compare it with that estimate.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

/// Bytes of the magic at the start of the file.
const MAGIC: &[u8; 8] = b"_logits_";

/// The base's log-probabilities below this (nats) are left out of the KL divergence, as
/// llama.cpp does.
const KLD_FLOOR: f32 = -16.0;

/// An open base file: its header, then one chunk's rows at a time.
pub struct LlamaLogits {
    /// Tokens per chunk (llama.cpp's `-c`).
    pub n_ctx: usize,
    /// Vocabulary size of the model that wrote the file.
    pub n_vocab: usize,
    /// Chunks in the file.
    pub n_chunk: usize,
    /// The text's tokens, `n_chunk * n_ctx` of them.
    pub tokens: Vec<u32>,
    reader: BufReader<File>,
    row_bytes: usize,
}

fn read_i32(r: &mut impl Read) -> Result<i32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(i32::from_le_bytes(b))
}

fn count(r: &mut impl Read, what: &str) -> Result<usize> {
    let v = read_i32(r).with_context(|| format!("reading {what}"))?;
    usize::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .with_context(|| format!("{what} is {v}"))
}

impl LlamaLogits {
    /// Opens `path` and reads its header and tokens.
    pub fn open(path: &Path) -> Result<LlamaLogits> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        reader.read_exact(&mut magic).context("reading the magic")?;
        ensure!(
            &magic == MAGIC,
            "{} is not a llama-perplexity --kl-divergence-base file",
            path.display()
        );
        let n_ctx = count(&mut reader, "n_ctx")?;
        let n_vocab = count(&mut reader, "n_vocab")?;
        let n_chunk = count(&mut reader, "n_chunk")?;
        ensure!(n_ctx >= 4, "n_ctx is {n_ctx}");
        let mut raw = vec![0u8; n_chunk * n_ctx * 4];
        reader.read_exact(&mut raw).context("reading the tokens")?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .map(|t| u32::try_from(t).with_context(|| format!("token id {t}")))
            .collect::<Result<Vec<u32>>>()?;
        Ok(LlamaLogits {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            reader,
            row_bytes: 2 * (2 * n_vocab.div_ceil(2) + 4),
        })
    }

    /// Scored positions a chunk (`n_ctx - 1 - n_ctx / 2`).
    pub fn rows_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.n_ctx / 2
    }

    /// Reads the next chunk's rows into `buf` (raw bytes; [`row`](Self::row) cuts one out).
    pub fn read_chunk(&mut self, buf: &mut Vec<u8>) -> Result<()> {
        buf.resize(self.rows_per_chunk() * self.row_bytes, 0);
        self.reader.read_exact(buf).context(
            "reading a chunk's log-probabilities (the file is shorter than its header says)",
        )
    }

    /// Row `i` of a chunk read by [`read_chunk`](Self::read_chunk).
    pub fn row<'a>(&self, buf: &'a [u8], i: usize) -> BaseRow<'a> {
        BaseRow {
            bytes: &buf[i * self.row_bytes..(i + 1) * self.row_bytes],
            n_vocab: self.n_vocab,
        }
    }
}

/// One position's stored log-probabilities.
#[derive(Clone, Copy)]
pub struct BaseRow<'a> {
    bytes: &'a [u8],
    n_vocab: usize,
}

impl BaseRow<'_> {
    fn f32_at(&self, at: usize) -> f32 {
        f32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap())
    }

    fn q(&self, token: usize) -> u16 {
        let at = 8 + 2 * token;
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    /// The natural-log probability of `token` (f32 products, as llama.cpp decodes it).
    pub fn log_prob(&self, token: usize) -> f32 {
        self.f32_at(0) * self.q(token) as f32 + self.f32_at(4)
    }

    /// The most likely token (the first of equals).
    pub fn top(&self) -> usize {
        (0..self.n_vocab).fold(0, |best, i| if self.q(i) > self.q(best) { i } else { best })
    }
}

/// One scored position, measured as llama.cpp's `--kl-divergence` mode does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// Negative log-likelihood of the next token under the base (llama.cpp's stored row).
    pub nll_base: f64,
    /// Negative log-likelihood of the next token under ours.
    pub nll_test: f64,
    /// KL divergence of ours from the base, over the tokens the base gives more than -16 nats.
    pub kld: f64,
    /// Whether the most likely tokens (the first of equals on each side) are the same.
    pub same_top: bool,
}

/// Scores our `logits` at one position against the base's `row`, `target` being the next token.
pub fn score(row: BaseRow<'_>, logits: &[f32], target: usize) -> Scored {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let log_z = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let top = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
    let kld = (0..logits.len())
        .map(|i| (row.log_prob(i), logits[i] as f64 - log_z))
        .filter(|&(lb, _)| lb > KLD_FLOOR)
        .map(|(lb, lt)| (lb as f64).exp() * (lb as f64 - lt))
        .sum();
    Scored {
        nll_base: -(row.log_prob(target) as f64),
        nll_test: log_z - logits[target] as f64,
        kld,
        same_top: top == row.top(),
    }
}

/// Checks that the file's tokens are ours: the same text, tokenized the same way.
pub fn check_tokens(file: &[u32], ours: &[u32]) -> Result<()> {
    if let Some(i) = (0..file.len().min(ours.len())).find(|&i| file[i] != ours[i]) {
        bail!(
            "token {i} differs: {} in llama.cpp's file, {} in ours (another text or tokenizer?)",
            file[i],
            ours[i]
        );
    }
    ensure!(
        ours.len() >= file.len(),
        "llama.cpp's file holds {} tokens, the text gives us only {}",
        file.len(),
        ours.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a file by the documented layout, each row from its (scale, min, q) given by hand.
    fn write_file(
        n_ctx: i32,
        n_vocab: i32,
        tokens: &[i32],
        rows: &[(f32, f32, Vec<u16>)],
    ) -> Vec<u8> {
        let mut out = b"_logits_".to_vec();
        for v in [n_ctx, n_vocab, tokens.len() as i32 / n_ctx] {
            out.extend(v.to_le_bytes());
        }
        tokens.iter().for_each(|t| out.extend(t.to_le_bytes()));
        for (scale, min, q) in rows {
            out.extend(scale.to_le_bytes());
            out.extend(min.to_le_bytes());
            q.iter().for_each(|v| out.extend(v.to_le_bytes()));
            if n_vocab % 2 == 1 {
                out.extend([0u8, 0]);
            }
        }
        out
    }

    fn temp_path(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("llama-logits-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_the_header_tokens_and_rows() {
        // n_ctx 4: one scored row a chunk (4 - 1 - 2); n_vocab 3 (odd: one u16 of padding).
        let rows = vec![(0.5, -3.0, vec![6, 0, 2]), (0.25, -2.0, vec![1, 8, 8])];
        let bytes = write_file(4, 3, &[1, 5, 2, 7, 1, 0, 2, 2], &rows);
        let path = temp_path("rows", &bytes);
        let mut f = LlamaLogits::open(&path).unwrap();
        assert_eq!((f.n_ctx, f.n_vocab, f.n_chunk), (4, 3, 2));
        assert_eq!(f.tokens, [1, 5, 2, 7, 1, 0, 2, 2]);
        assert_eq!(f.rows_per_chunk(), 1);
        let mut buf = Vec::new();
        f.read_chunk(&mut buf).unwrap();
        let r = f.row(&buf, 0);
        assert_eq!(
            [r.log_prob(0), r.log_prob(1), r.log_prob(2)],
            [0.0, -3.0, -2.0]
        );
        assert_eq!(r.top(), 0);
        f.read_chunk(&mut buf).unwrap();
        let r = f.row(&buf, 0);
        assert_eq!(
            [r.log_prob(0), r.log_prob(1), r.log_prob(2)],
            [-1.75, 0.0, 0.0]
        );
        assert_eq!(r.top(), 1, "the first of equals");
        assert!(f.read_chunk(&mut buf).is_err(), "past the last chunk");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn refuses_another_format() {
        let path = temp_path("magic", b"_logitz_\x04\0\0\0\x03\0\0\0\x01\0\0\0");
        assert!(LlamaLogits::open(&path).is_err());
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn scores_as_the_definitions_say() {
        // Base: probabilities 0.5, 0.25, 0.25 (log-probabilities -ln 2 = ln(1/4) + 4 * ln(2)/4).
        let (l2, l4) = (-(2f32.ln()), -(4f32.ln()));
        let rows = vec![(2f32.ln() / 4.0, l4, vec![4, 0, 0])];
        let path = temp_path("score", &write_file(4, 3, &[0, 0, 0, 0], &rows));
        let mut f = LlamaLogits::open(&path).unwrap();
        let mut buf = Vec::new();
        f.read_chunk(&mut buf).unwrap();
        let row = f.row(&buf, 0);
        assert!((row.log_prob(0) - l2).abs() < 1e-6);
        // Ours: probabilities 0.25, 0.5, 0.25 (logits: log-probabilities + 3).
        let ours = [0.25f64, 0.5, 0.25].map(|p| (p.ln() + 3.0) as f32);
        let s = score(row, &ours, 1);
        // KL = 0.5 ln(0.5/0.25) + 0.25 ln(0.25/0.5) + 0.25 ln(0.25/0.25) = ln(2)/4.
        let kl = 2f64.ln() / 4.0;
        assert!((s.kld - kl).abs() < 1e-6, "{} against {kl}", s.kld);
        assert!((s.nll_base - 4f64.ln()).abs() < 1e-6);
        assert!((s.nll_test - 2f64.ln()).abs() < 1e-6);
        assert!(!s.same_top);
        let same = score(row, &[l2, l4, l4], 0);
        assert!(same.same_top);
        assert!(same.kld.abs() < 1e-6, "{}", same.kld);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn leaves_out_tokens_below_16_nats() {
        // Token 1 at min = -20 nats: out of the sum, though ours gives it half the mass.
        let rows = vec![(20.0 / 65535.0, -20.0, vec![65535, 0])];
        let path = temp_path("floor", &write_file(4, 2, &[0, 0, 0, 0], &rows));
        let mut f = LlamaLogits::open(&path).unwrap();
        let mut buf = Vec::new();
        f.read_chunk(&mut buf).unwrap();
        let s = score(f.row(&buf, 0), &[0.0, 0.0], 0);
        // Only token 0 counts: p_base 1 * (0 - ln 0.5).
        assert!((s.kld - 2f64.ln()).abs() < 1e-4, "{}", s.kld);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn names_the_first_differing_token() {
        assert!(check_tokens(&[1, 2, 3], &[1, 2, 3, 4]).is_ok());
        let e = check_tokens(&[1, 2, 3], &[1, 9, 3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("token 1 differs"), "{e}");
        assert!(check_tokens(&[1, 2, 3], &[1, 2]).is_err());
    }
}
