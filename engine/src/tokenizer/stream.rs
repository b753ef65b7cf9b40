//! Streaming detokenisation that never cuts a UTF-8 character.

use super::Tokenizer;

/// Turns a stream of token ids into text without ever cutting a UTF-8 character: bytes of an
/// incomplete character are held until the token that completes it arrives.
///
/// Like [`Tokenizer::decode`], control and unknown tokens print nothing. Unlike it, no leading
/// space is stripped and no space clean-up is done (streams print pieces as they come, as
/// llama.cpp's examples do).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds a token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.visible_bytes(id));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Whether bytes of an incomplete character are held (the last token pushed is not yet
    /// all in the text returned).
    pub fn is_holding(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Returns whatever is still held, with incomplete characters as U+FFFD.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
