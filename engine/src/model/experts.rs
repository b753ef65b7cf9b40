//! The mixture of experts a file describes (`expert_*` keys), validated as
//! [`super::hparams`] validates the rest.

use super::hparams::{invalid, Keys, MAX_LAYERS, MAX_WIDTH};
use super::{Arch, Experts};
use crate::error::Result;

/// Most experts a block may have (llama.cpp's limit).
const MAX_EXPERTS: usize = 512;

/// The mixture of experts, when `expert_count` is present and not 0 (required for qwen3moe,
/// qwen2moe and gpt-oss): `expert_used_count` of them run per token, each `feed_forward_length`
/// wide (llama), or `expert_feed_forward_length` (absent or 0: the feed-forward length divided
/// among the used experts; qwen3moe, qwen2moe; required for gpt-oss), as llama.cpp reads them.
/// qwen35moe and qwen3next read the expert width as qwen3moe does. qwen2moe, qwen35moe and
/// qwen3next add a shared expert `expert_shared_feed_forward_length` wide (absent or 0: the
/// feed-forward length); qwen2moe, as llama.cpp's graph, does not normalise the chosen experts'
/// weights, nor does gpt-oss (its softmax over the chosen logits sums to 1). As llama.cpp, none
/// of these architectures reads `expert_weights_scale`.
pub(super) fn experts(k: &Keys<'_>, arch: Arch, n_ff: usize) -> Result<Option<Experts>> {
    let required = matches!(
        arch,
        Arch::Qwen3Moe
            | Arch::Qwen2Moe
            | Arch::GptOss
            | Arch::Lfm2Moe
            | Arch::Qwen35Moe
            | Arch::Qwen3Next
    );
    let n_expert = match k.opt_int("expert_count", 0, MAX_EXPERTS)? {
        None | Some(0) if required => {
            return Err(invalid(
                &k.key("expert_count"),
                "absent or 0",
                format!("must be at least 1 for {}", arch.name()),
            ))
        }
        None | Some(0) => return Ok(None),
        Some(n) => n,
    };
    if !matches!(
        arch,
        Arch::Llama
            | Arch::Qwen3Moe
            | Arch::Qwen2Moe
            | Arch::Gemma4
            | Arch::Mistral3
            | Arch::GptOss
            | Arch::Lfm2Moe
            | Arch::Qwen35Moe
            | Arch::Qwen3Next
            | Arch::GraniteHybrid
    ) {
        return Err(invalid(
            &k.key("expert_count"),
            n_expert,
            format!("experts are not supported for {}", arch.name()),
        ));
    }
    let n_used = k.int("expert_used_count", 1, n_expert)?;
    // llama (Mixtral) experts are `feed_forward_length` wide, as llama.cpp reads them.
    let n_ff_exp = match arch {
        // Required for gemma4 and gpt-oss, as llama.cpp reads it.
        Arch::Gemma4 | Arch::GptOss | Arch::Lfm2Moe => {
            k.int("expert_feed_forward_length", 1, MAX_WIDTH)?
        }
        Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Qwen35Moe | Arch::Qwen3Next => k
            .opt_int("expert_feed_forward_length", 0, MAX_WIDTH)?
            .filter(|&w| w > 0)
            .unwrap_or((n_ff / n_used).max(1)),
        _ => n_ff,
    };
    let qwen2moe = arch == Arch::Qwen2Moe;
    // lfm2moe: the router's gating function (1 softmax, 2 sigmoid) and dense leading blocks.
    let (sigmoid, n_dense_lead) = match arch {
        Arch::Lfm2Moe => {
            let sigmoid = k.int("expert_gating_func", 1, 2)? == 2;
            let n_dense_lead = k
                .opt_int("leading_dense_block_count", 0, MAX_LAYERS)?
                .unwrap_or(0);
            (sigmoid, n_dense_lead)
        }
        _ => (false, 0),
    };
    let shared = matches!(arch, Arch::Qwen2Moe | Arch::Qwen35Moe | Arch::Qwen3Next);
    let n_ff_shared = match shared {
        true => Some(
            k.opt_int("expert_shared_feed_forward_length", 0, MAX_WIDTH)?
                .filter(|&w| w > 0)
                .unwrap_or(n_ff),
        ),
        // granitehybrid's shared expert is optional: absent or 0, none.
        false if arch == Arch::GraniteHybrid => k
            .opt_int("expert_shared_feed_forward_length", 0, MAX_WIDTH)?
            .filter(|&w| w > 0),
        false => None,
    };
    Ok(Some(Experts {
        n_expert,
        n_used,
        n_ff_exp,
        // qwen2moe leaves the chosen experts' weights as the router gave them; gpt-oss's are
        // a softmax over the chosen logits, which sums to 1 already.
        norm_weights: !qwen2moe && arch != Arch::GptOss,
        // llama.cpp reads `expert_weights_scale` for none of these architectures (it stays
        // 0, no scaling, whatever the file says): neither does this.
        weights_scale: 1.0,
        n_ff_shared,
        sigmoid,
        n_dense_lead,
    }))
}
