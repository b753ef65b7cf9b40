//! Constrained decoding: only tokens that keep the output inside a grammar may be sampled.
//!
//! The grammars are llama-server's: a GBNF grammar (`grammar`, llama.cpp's dialect, or Lark
//! when it starts with `%llguidance`), a JSON schema (`json_schema`, `response_format`) or any
//! JSON object (`response_format: {"type": "json_object"}`). They are compiled by
//! [llguidance](https://github.com/guidance-ai/llguidance), which checks every token of the
//! vocabulary against the grammar through a byte trie of the vocabulary.
//!
//! The trie and llguidance's precomputed token classes cost a fraction of a second for a 50k
//! vocabulary: build a [`Vocab`] once per tokenizer and share it; a [`Constraint`] per request
//! is cheap to build from it (about a millisecond for a small JSON schema).
//!
//! ```no_run
//! use engine::constraint::{Constraint, Grammar, Vocab};
//! use engine::sampling::{Sampler, SamplerParams};
//! use engine::{Model, Session, ContextParams};
//! # fn main() -> engine::Result<()> {
//! let model = Model::load("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let vocab = Vocab::new(model.tokenizer())?;
//! let mut constraint = Constraint::new(&vocab, &Grammar::Gbnf(r#"root ::= "yes" | "no""#.into()))?;
//! let mut session = Session::new(model.clone(), ContextParams::default())?;
//! let mut sampler = Sampler::new(SamplerParams::greedy());
//! let mut logits = session.feed_text("Is the sky blue? Answer: ")?.to_vec();
//! while !constraint.is_done() {
//!     constraint.mask_logits(&mut logits)?;
//!     let token = sampler.sample(&logits, session.tokens());
//!     constraint.accept(token)?;
//!     if model.tokenizer().is_eog(token) {
//!         break;
//!     }
//!     logits = session.feed(&[token])?.to_vec();
//! }
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod gbnf;
mod schema;

pub(crate) use schema::close_objects;

use std::sync::Arc;

use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A grammar the output must follow.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A GBNF grammar in llama.cpp's dialect, with `root` as its start rule. Text that starts
    /// with `%llguidance` is taken as [`Grammar::Lark`], as llama.cpp does.
    Gbnf(String),
    /// A grammar in llguidance's Lark dialect (start rule `start`).
    Lark(String),
    /// JSON that validates against this JSON schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
}

/// The whitespace allowed between JSON tokens unless the schema says otherwise (llguidance's
/// `x-guidance` options), as llama.cpp's schema converter allows it: one space, or one or two
/// newlines and at most 20 spaces or tabs of indentation, so that a model cannot fill its budget
/// with whitespace inside a value.
pub(crate) const JSON_WHITESPACE: &str = r"(\x20|\x0A{1,2}[\x20\x09]{0,20})";

impl Grammar {
    /// The text of a grammar that llguidance reads as Lark: [`Grammar::Lark`], or GBNF that
    /// starts with `%llguidance`.
    fn lark_text(&self) -> Option<&str> {
        match self {
            Grammar::Lark(text) => Some(text),
            Grammar::Gbnf(text) if text.trim_start().starts_with("%llguidance") => Some(text),
            _ => None,
        }
    }

    fn to_llguidance(&self, vocab: &Vocab) -> Result<TopLevelGrammar> {
        if let Some(text) = self.lark_text() {
            return Ok(TopLevelGrammar::from_lark(text.to_owned()));
        }
        Ok(match self {
            Grammar::Gbnf(text) => {
                let lookup = |t: &str| vocab.token_by_text(t);
                let lark = gbnf::gbnf_to_lark(text, &lookup, vocab.n_vocab)
                    .map_err(|e| Error::Grammar(e.to_string()))?;
                TopLevelGrammar::from_lark(lark)
            }
            // Taken above, with marked GBNF.
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(json_options(schema)),
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(json_options(
                &serde_json::json!({"type": "object"}),
            )),
        })
    }
}

/// `schema` with [`JSON_WHITESPACE`] as its whitespace, unless it sets `x-guidance` itself,
/// and its objects closed to keys they do not list, as llama.cpp reads schemas
/// ([`close_objects`]).
fn json_options(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    close_objects(&mut schema);
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
    schema
}

/// The vocabulary as llguidance sees it: each token's bytes in a trie (control tokens behind
/// llguidance's special-token marker, so that text never matches them), and the
/// end-of-generation tokens. Build it once per tokenizer and share it.
pub struct Vocab {
    factory: ParserFactory,
    n_vocab: usize,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocab")
            .field("n_vocab", &self.n_vocab)
            .field("eog", &self.eog)
            .finish()
    }
}

/// llguidance's view of the tokenizer: the trie, and greedy tokenization over it (used only
/// for forced tokens, which [`Constraint`] does not ask for).
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

impl Vocab {
    /// Builds the token trie of `tokenizer`'s vocabulary.
    pub fn new(tokenizer: &Tokenizer) -> Result<Arc<Vocab>> {
        let n_vocab = tokenizer.n_vocab();
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id);
                // Control and unknown tokens print nothing: grammar text must not match them.
                let special = tokenizer.is_eog(id)
                    || (tokenizer.visible_bytes(id).is_empty() && !bytes.is_empty());
                if special {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(bytes);
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let mut eog: Vec<u32> = tokenizer.eog_tokens().to_vec();
        eog.extend(tokenizer.eos());
        eog.sort_unstable();
        eog.dedup();
        let mut info = TokRxInfo::new(
            n_vocab as u32,
            tokenizer
                .eos()
                .or(eog.first().copied())
                .unwrap_or(llguidance::toktrie::INVALID_TOKEN),
        );
        info.tok_bos = tokenizer.bos();
        info.tok_unk = tokenizer.unk();
        info.tok_end_of_turn = tokenizer.eot();
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: llguidance::toktrie::TokEnv = Arc::new(TrieEnv { trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(grammar_error)?;
        factory.quiet();
        factory.limits_mut().verbose_errors = false;
        Ok(Arc::new(Vocab {
            factory,
            n_vocab,
            eog,
        }))
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The end-of-generation tokens (EOS, EOT, ...), ascending: what [`Constraint`] allows
    /// once the grammar may end.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    fn is_eog(&self, token: u32) -> bool {
        self.eog.binary_search(&token).is_ok()
    }

    /// The token whose text is `text` (a control token's or an ordinary one's).
    fn token_by_text(&self, text: &str) -> Option<u32> {
        let trie = self.factory.tok_env().tok_trie();
        let mut special = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        special.extend_from_slice(text.as_bytes());
        trie.token_id(&special)
            .or_else(|| trie.token_id(text.as_bytes()))
    }
}

/// The GBNF translator alone: `src` as the Lark grammar llguidance would be given, or what is
/// wrong with it (a token reference resolves only as `<[ID]>`, below 1,000). For fuzzing.
#[cfg(feature = "test-util")]
pub fn gbnf_to_lark(src: &str) -> std::result::Result<String, String> {
    gbnf::gbnf_to_lark(src, &|_| None, 1000).map_err(|e| e.to_string())
}

/// The stack of the thread that compiles a grammar: room for llguidance's recursion over the
/// largest grammar the bounds below let through (measured in a debug build: about 10 KiB a
/// level of a chain of schema references, 5 KiB of Lark rules).
pub const COMPILE_STACK_BYTES: usize = 256 << 20;

/// The most lines a Lark grammar may have (each rule starts a line, so this bounds a chain of
/// rules).
pub const MAX_LARK_LINES: usize = 10_000;

/// The most objects a JSON schema may hold (each subschema is one, so this bounds a chain of
/// references).
pub const MAX_SCHEMA_OBJECTS: usize = 10_000;

/// Refuses a grammar past the bounds that [`COMPILE_STACK_BYTES`] is sized for (GBNF's own
/// bounds are checked as it is parsed).
fn check_size(grammar: &Grammar) -> Result<()> {
    if let Some(text) = grammar.lark_text() {
        let lines = text.lines().count();
        if lines > MAX_LARK_LINES {
            return Err(Error::Grammar(format!(
                "a Lark grammar of {lines} lines is longer than the {MAX_LARK_LINES} allowed"
            )));
        }
        return Ok(());
    }
    match grammar {
        Grammar::JsonSchema(schema) => {
            // Counted with a list of its own: a schema built in code may nest without limit.
            let mut objects = 0usize;
            let mut todo = vec![schema];
            while let Some(v) = todo.pop() {
                match v {
                    serde_json::Value::Object(map) => {
                        objects += 1;
                        if objects > MAX_SCHEMA_OBJECTS {
                            return Err(Error::Grammar(format!(
                                "the JSON schema holds more than {MAX_SCHEMA_OBJECTS} objects"
                            )));
                        }
                        todo.extend(map.values());
                    }
                    serde_json::Value::Array(items) => todo.extend(items),
                    _ => {}
                }
            }
            Ok(())
        }
        Grammar::Gbnf(_) | Grammar::Lark(_) | Grammar::JsonObject => Ok(()),
    }
}

/// llguidance's error `e` in the project's words: [`Error::Grammar`] with one line that never
/// carries a panic's message or backtrace, nor the parser's internal names.
fn grammar_error(e: impl std::fmt::Display) -> Error {
    Error::Grammar(describe_llguidance_error(&e.to_string()))
}

/// The longest message [`describe_llguidance_error`] passes on, in bytes.
const MAX_ERROR_BYTES: usize = 240;

/// One line for a client out of llguidance's error text: a caught panic (message and backtrace
/// name the build's source files) becomes a plain refusal, its parser limits and stop reasons
/// are said in words, and anything else keeps only its first line, at most
/// [`MAX_ERROR_BYTES`].
pub(crate) fn describe_llguidance_error(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default().trim();
    if first.starts_with("panic") || text.contains("<backtrace>") || first.is_empty() {
        // llguidance numbers a grammar's symbols in 16 bits and asserts that they fit.
        if first.contains("symbols.len()") {
            return "the grammar is too large to compile: it has more than 65,000 symbols \
                    (each character of a GBNF literal is one)"
                .to_owned();
        }
        return "the grammar could not be compiled".to_owned();
    }
    let limits: &[(&str, &str)] = &[
        (
            "Current row has",
            "the grammar is too ambiguous to follow: the parser ran past its limit of items \
             (a long right-recursive rule can be written left-recursive)",
        ),
        (
            "fuel exhausted",
            "the grammar is too complex: compiling it ran past its work limit",
        ),
    ];
    if let Some((_, said)) = limits.iter().find(|(k, _)| first.contains(k)) {
        return (*said).to_owned();
    }
    // A stopped parser's error is the name of its stop reason alone.
    let stop = match first {
        "NoExtension" | "NoExtensionBias" => {
            Some("the output is complete and nothing may follow it")
        }
        "EndOfSentence" => Some("the output has already ended"),
        "MaxTokensTotal" | "MaxTokensParser" => Some("the output reached its length limit"),
        "LexerTooComplex" => Some("the grammar's lexer ran past its size limit"),
        "ParserTooComplex" => Some("the grammar's parser ran past its size limit"),
        "InternalError" => Some("the grammar could not be followed"),
        "Cancelled" => Some("the grammar was cancelled"),
        _ => None,
    };
    if let Some(said) = stop {
        return said.to_owned();
    }
    let mut end = first.len().min(MAX_ERROR_BYTES);
    while !first.is_char_boundary(end) {
        end -= 1;
    }
    first[..end].to_owned()
}

/// One generation's grammar state: which tokens may come next, and the tokens taken so far.
///
/// Per step: [`mask_logits`](Self::mask_logits), sample, [`accept`](Self::accept) the sampled
/// token; stop when [`is_done`](Self::is_done) or an end-of-generation token was accepted.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocab: Arc<Vocab>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stop_reason", &self.matcher.stop_reason())
            .finish()
    }
}

impl Constraint {
    /// Compiles `grammar` over `vocab`. A malformed grammar or schema is [`Error::Grammar`]
    /// with what is wrong and (for GBNF) where, in one line.
    ///
    /// Compiling runs on a thread of its own with a [`COMPILE_STACK_BYTES`] stack, whatever
    /// thread calls this, and every grammar is first held to bounds that keep the compiler's
    /// recursion inside that stack: GBNF's nesting and chains of rules, at most
    /// [`MAX_LARK_LINES`] lines of Lark, at most [`MAX_SCHEMA_OBJECTS`] objects in a JSON schema.
    pub fn new(vocab: &Arc<Vocab>, grammar: &Grammar) -> Result<Constraint> {
        check_size(grammar)?;
        let compile = || -> Result<Matcher> {
            let top = grammar.to_llguidance(vocab)?;
            let parser = vocab.factory.create_parser(top).map_err(grammar_error)?;
            let matcher = Matcher::new(Ok(parser));
            match matcher.get_error() {
                Some(e) => Err(grammar_error(e)),
                None => Ok(matcher),
            }
        };
        let matcher = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("grammar".into())
                .stack_size(COMPILE_STACK_BYTES)
                .spawn_scoped(scope, compile)
                .map_err(|e| Error::Grammar(format!("no thread to compile the grammar on: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(Error::Grammar("the grammar could not be compiled".into())))
        })?;
        Ok(Constraint {
            matcher,
            vocab: vocab.clone(),
        })
    }

    /// The vocabulary this constraint was built over.
    pub fn vocab(&self) -> &Arc<Vocab> {
        &self.vocab
    }

    /// Sets the logit of every token the grammar does not allow next to `-inf`. End-of-generation
    /// tokens stay only where the grammar may end; after [`is_done`](Self::is_done) they are all
    /// that stays. Logits past the vocabulary (padding) are disallowed too.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<()> {
        let mask = self.matcher.compute_mask_or_eos().map_err(grammar_error)?;
        let words = mask.as_slice();
        let n = logits.len().min(self.vocab.n_vocab);
        let (inside, padding) = logits.split_at_mut(n);
        for (chunk, &word) in inside.chunks_mut(32).zip(words) {
            if word == u32::MAX {
                continue;
            }
            for (bit, l) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        // A mask shorter than the vocabulary (it never is) allows nothing past its end.
        inside
            .iter_mut()
            .skip(words.len() * 32)
            .for_each(|l| *l = f32::NEG_INFINITY);
        padding.fill(f32::NEG_INFINITY);
        Ok(())
    }

    /// Whether `token` may come next (cheaper than a whole mask: sample first, check, and mask
    /// only when the check fails).
    pub fn is_allowed(&mut self, token: u32) -> Result<bool> {
        if token as usize >= self.vocab.n_vocab {
            return Ok(false);
        }
        if self.vocab.is_eog(token) {
            return Ok(self.can_end());
        }
        if self.is_done() {
            return Ok(false);
        }
        Ok(self
            .matcher
            .validate_tokens(&[token])
            .map_err(grammar_error)?
            == 1)
    }

    /// Advances the grammar past `token`. A token the grammar does not allow here (one that
    /// [`mask_logits`](Self::mask_logits) would have masked) is [`Error::Grammar`], and leaves
    /// the constraint failed.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        if token as usize >= self.vocab.n_vocab {
            return Err(Error::Grammar(format!(
                "token {token} is outside the vocabulary of {}",
                self.vocab.n_vocab
            )));
        }
        if self.is_done() {
            if self.vocab.is_eog(token) {
                return Ok(());
            }
            return Err(Error::Grammar(
                "the output is complete and nothing may follow it".into(),
            ));
        }
        self.matcher.consume_token(token).map_err(grammar_error)
    }

    /// Whether the output is complete and nothing can follow it: generation must stop (only
    /// end-of-generation tokens are allowed now).
    pub fn is_done(&self) -> bool {
        matches!(
            self.matcher.stop_reason(),
            StopReason::NoExtension | StopReason::NoExtensionBias | StopReason::EndOfSentence
        )
    }

    /// Whether the output so far is complete (an end-of-generation token is allowed), though
    /// it may also go on.
    pub fn can_end(&mut self) -> bool {
        self.is_done() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Why the constraint failed (a rejected token, a grammar too complex to follow), if it did.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

#[cfg(test)]
mod tests {
    use super::describe_llguidance_error as describe;

    #[test]
    fn llguidance_errors_are_one_line_without_internals() {
        let panic =
            "panic: index out of bounds\n<backtrace>\n  at /home/build/src/x.rs:1\n</backtrace>";
        assert_eq!(describe(panic), "the grammar could not be compiled");
        assert!(
            describe("panic: assertion failed: grammar.symbols.len() < 65525").contains("65,000")
        );
        assert!(describe("NoExtensionBias\n<non-verbose/>").contains("nothing may follow"));
        assert!(describe("Current row has 2151 items; max is 2000; consider").contains("limit"));
        assert_eq!(
            describe("unknown name: foo\n<non-verbose/>"),
            "unknown name: foo"
        );
        let long = "é".repeat(500);
        let said = describe(&long);
        assert!(said.len() <= super::MAX_ERROR_BYTES && long.starts_with(&said));
    }
}
