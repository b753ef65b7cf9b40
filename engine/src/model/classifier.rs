//! What a GGUF brings for reranking, as llama.cpp reads it: the pooling its embeddings are
//! meant for (`{arch}.pooling_type`), the classifier head (`cls.weight`/`cls.bias`, then
//! `cls.output.weight`/`cls.output.bias`; llama.cpp's `LLM_TENSOR_CLS` and `LLM_TENSOR_CLS_OUT`),
//! its output labels (`{arch}.classifier.output_labels`, one output each, else one output), and
//! how a query and a document become one prompt: the file's `tokenizer.chat_template.rerank`
//! with `{query}` and `{document}` in it, else `[BOS] query [EOS] [SEP] document [EOS]` as the
//! vocabulary's flags say (llama-server's `format_prompt_rerank`).
//!
//! llama.cpp reads the head of bert-like families and of qwen3 (a Qwen3 reranker's
//! `cls.output.weight` is its output head's rows for "yes" and "no"); this engine reads it for
//! every family it runs. The graph part is `arch`'s `Forward::rank_head`.

use super::{Model, Role, Specs};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::HParams;

/// The pooling a GGUF declares for its embeddings (`{arch}.pooling_type`, llama.cpp's
/// numbering: 0 none, 1 mean, 2 cls, 3 last, 4 rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolingType {
    /// Every token's embedding.
    None,
    /// The mean over the tokens.
    Mean,
    /// The first token's.
    Cls,
    /// The last token's.
    Last,
    /// A relevance score from the classifier head (a reranker).
    Rank,
}

/// The classifier head's tensors: indices into the model's weights, or handles to them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HeadWeights<T = usize> {
    /// `[n_embd, n_embd]`, then `tanh`.
    pub cls: Option<T>,
    pub cls_b: Option<T>,
    /// `[n_embd, n_outputs]`.
    pub out: Option<T>,
    pub out_b: Option<T>,
}

impl HeadWeights {
    pub(crate) fn map<U>(&self, f: impl Fn(usize) -> U) -> HeadWeights<U> {
        HeadWeights {
            cls: self.cls.map(&f),
            cls_b: self.cls_b.map(&f),
            out: self.out.map(&f),
            out_b: self.out_b.map(&f),
        }
    }
}

/// What a model brings for reranking ([`Model::ranking`]).
#[derive(Clone, Debug)]
pub struct Ranking {
    pooling: Option<PoolingType>,
    labels: Vec<String>,
    template: Option<String>,
    sep: Option<u32>,
    add_sep: bool,
    pub(crate) head: HeadWeights,
}

impl Ranking {
    /// The pooling the file declares, if it declares one.
    pub fn pooling(&self) -> Option<PoolingType> {
        self.pooling
    }

    /// The classifier's output labels (`{arch}.classifier.output_labels`); empty when the file
    /// names none.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// How many floats a rank pooling gives ([`crate::Context::rank`]): one per label, else one.
    pub fn n_outputs(&self) -> usize {
        self.labels.len().max(1)
    }

    /// Whether the file has a classifier head (`cls.weight` or `cls.output.weight`). Without
    /// one, a rank pooling reads the last token's final-norm output, as llama.cpp does.
    pub fn has_head(&self) -> bool {
        self.head.cls.is_some() || self.head.out.is_some()
    }

    /// The file's rerank prompt (`tokenizer.chat_template.rerank`), if it has one.
    pub fn template(&self) -> Option<&str> {
        self.template.as_deref()
    }
}

/// Reads the ranking metadata and registers the head's tensors in `specs`.
pub(super) fn load(specs: &mut Specs<'_>, gguf: &Gguf, hp: &HParams) -> Result<Ranking> {
    let arch = hp.arch.name();
    let key = format!("{arch}.pooling_type");
    // -1 is llama.cpp's "unspecified".
    let pooling = match gguf.get(&key).map(|v| (v, v.as_i64())) {
        None | Some((_, Some(-1))) => None,
        Some((_, Some(0))) => Some(PoolingType::None),
        Some((_, Some(1))) => Some(PoolingType::Mean),
        Some((_, Some(2))) => Some(PoolingType::Cls),
        Some((_, Some(3))) => Some(PoolingType::Last),
        Some((_, Some(4))) => Some(PoolingType::Rank),
        Some((v, _)) => {
            return Err(Error::InvalidHParam {
                key,
                value: v.describe(),
                requirement: "one of 0 (none), 1 (mean), 2 (cls), 3 (last), 4 (rank)".into(),
            })
        }
    };
    let key = format!("{arch}.classifier.output_labels");
    let labels: Vec<String> = match gguf.get(&key) {
        None => Vec::new(),
        Some(_) => gguf.get_strs(&key)?.iter().map(str::to_owned).collect(),
    };
    let template = match gguf.get("tokenizer.chat_template.rerank") {
        None => None,
        Some(_) => Some(gguf.get_str("tokenizer.chat_template.rerank")?.to_owned()),
    };
    let sep = match gguf.get("tokenizer.ggml.seperator_token_id") {
        None => None,
        Some(_) => Some(gguf.get_u32("tokenizer.ggml.seperator_token_id")?),
    };
    let add_sep = match gguf.get("tokenizer.ggml.add_sep_token") {
        None => false,
        Some(_) => gguf.get_bool("tokenizer.ggml.add_sep_token")?,
    };
    let e = hp.n_embd;
    let n_out = labels.len().max(1);
    let cls = specs.find("cls.weight", &[e, e], Role::Matrix)?;
    let cls_b = match cls {
        Some(_) => specs.find("cls.bias", &[e], Role::Vector)?,
        None => None,
    };
    let out = specs.find("cls.output.weight", &[e, n_out], Role::Matrix)?;
    let out_b = match out {
        Some(_) => specs.find("cls.output.bias", &[n_out], Role::Vector)?,
        None => None,
    };
    Ok(Ranking {
        pooling,
        labels,
        template,
        sep,
        add_sep,
        head: HeadWeights {
            cls,
            cls_b,
            out,
            out_b,
        },
    })
}

impl Model {
    /// What the model brings for reranking: its declared pooling, classifier head and labels,
    /// rerank prompt.
    pub fn ranking(&self) -> &Ranking {
        &self.ranking
    }

    /// The tokens of the prompt that scores `document` against `query`, as llama-server builds
    /// it: the file's rerank template with `{query}` and `{document}` replaced, tokenized with
    /// its special tokens recognised and none added; else `[BOS] query [EOS] [SEP] document
    /// [EOS]`, each special token where the vocabulary's `add_bos_token`, `add_eos_token` and
    /// `add_sep_token` ask for it (SEP in place of a missing EOS), the texts tokenized as plain
    /// text.
    pub fn rerank_tokens(&self, query: &str, document: &str) -> Result<Vec<u32>> {
        let tok = &self.tokenizer;
        if let Some(t) = &self.ranking.template {
            let prompt = t.replace("{query}", query).replace("{document}", document);
            return tok.encode(&prompt, false, true);
        }
        let r = &self.ranking;
        let special = |id: Option<u32>, what: &str| {
            id.ok_or_else(|| Error::InvalidHParam {
                key: format!("tokenizer.ggml.{what}"),
                value: "absent".into(),
                requirement: "the rerank prompt adds this token".into(),
            })
        };
        let eos = || special(tok.eos().or(r.sep), "eos_token_id");
        let mut ids = Vec::new();
        if tok.add_bos() {
            ids.push(special(tok.bos(), "bos_token_id")?);
        }
        ids.extend(tok.encode(query, false, false)?);
        if tok.add_eos() {
            ids.push(eos()?);
        }
        if r.add_sep {
            ids.push(special(r.sep, "seperator_token_id")?);
        }
        ids.extend(tok.encode(document, false, false)?);
        if tok.add_eos() {
            ids.push(eos()?);
        }
        Ok(ids)
    }

    /// The classifier head's tensors.
    pub(crate) fn head_weights(&self) -> HeadWeights<crate::ggml::RawTensor<'_>> {
        self.ranking.head.map(|i| self.weights.get(i))
    }
}
