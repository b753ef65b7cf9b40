//! The hyperparameters of the hybrids' gated delta-net layers (qwen35, qwen35moe, qwen3next),
//! read and validated as the parent module's table says.

use super::{invalid, Keys, MAX_LAYERS, MAX_WIDTH};
use crate::error::Result;
use crate::model::Arch;

/// The gated delta-net layers of a qwen35, qwen35moe or qwen3next file: every layer but each
/// `full_attention_interval`-th (default 4) is recurrent, unless `attention.recurrent_layers`
/// flags them one by one (the `n_layer` run of `n_blocks`); sizes from `ssm.*` (see the module's table); the M-RoPE sections
/// except for qwen3next, whose attention takes NeoX RoPE.
pub(super) fn delta_net(
    k: &Keys<'_>,
    n_layer: usize,
    n_blocks: usize,
    rope_dims: usize,
) -> Result<crate::model::DeltaNet> {
    let conv_kernel = k.int("ssm.conv_kernel", 2, 64)?;
    let n_k_heads = k.int("ssm.group_count", 1, 4096)?;
    let n_v_heads = k.int("ssm.time_step_rank", 1, 4096)?;
    if n_v_heads % n_k_heads != 0 {
        return Err(invalid(
            &k.key("ssm.time_step_rank"),
            n_v_heads,
            format!("must be a multiple of ssm.group_count ({n_k_heads})"),
        ));
    }
    let head_dim = k.int("ssm.state_size", 1, 4096)?;
    let inner = k.int("ssm.inner_size", 1, MAX_WIDTH)?;
    if head_dim * n_v_heads != inner {
        return Err(invalid(
            &k.key("ssm.inner_size"),
            inner,
            format!("must equal ssm.state_size × ssm.time_step_rank ({head_dim} × {n_v_heads})"),
        ));
    }
    if head_dim * (2 * n_k_heads + n_v_heads) > MAX_WIDTH {
        return Err(invalid(
            &k.key("ssm.group_count"),
            n_k_heads,
            format!("gives convolution channels wider than {MAX_WIDTH}"),
        ));
    }
    let flags_key = k.key("attention.recurrent_layers");
    let layers = match k.gguf.get(&flags_key).and_then(|v| v.as_array()) {
        // One flag per block, the multi-token prediction blocks' included (`n_blocks`).
        Some(flags) if flags.len() == n_layer || flags.len() == n_blocks => (0..n_layer)
            .map(|il| {
                let v = flags.get(il);
                v.as_ref()
                    .and_then(|v| v.as_bool().or(v.as_i64().map(|x| x != 0)))
                    .ok_or_else(|| invalid(&flags_key, il, "must be bools or integers"))
            })
            .collect::<Result<Vec<bool>>>()?,
        Some(flags) => {
            return Err(invalid(
                &flags_key,
                format!("{} flags", flags.len()),
                format!("must hold one flag per block ({n_blocks})"),
            ))
        }
        None => {
            let interval = k
                .opt_int("full_attention_interval", 1, MAX_LAYERS)?
                .unwrap_or(4);
            (0..n_layer).map(|il| (il + 1) % interval != 0).collect()
        }
    };
    let qwen3next = k.arch == Arch::Qwen3Next.name();
    let mut rope_sections = [0i32; 4];
    if !qwen3next {
        rope_sections = sections(k, rope_dims)?;
    }
    Ok(crate::model::DeltaNet {
        layers,
        conv_kernel,
        n_k_heads,
        n_v_heads,
        grouped_heads: qwen3next,
        head_dim,
        rope_sections,
    })
}

/// The four M-RoPE sections (`rope.dimension_sections`), each in `0..=rope_dims`.
fn sections(k: &Keys<'_>, rope_dims: usize) -> Result<[i32; 4]> {
    let sections_key = k.key("rope.dimension_sections");
    let sections = k
        .gguf
        .get(&sections_key)
        .and_then(|v| v.as_array())
        .ok_or_else(|| invalid(&sections_key, "absent", "must hold 4 sections"))?;
    let mut rope_sections = [0i32; 4];
    for (i, s) in rope_sections.iter_mut().enumerate() {
        *s = sections
            .get(i)
            .and_then(|v| v.as_i64())
            .and_then(|v| i32::try_from(v).ok())
            .filter(|&v| v >= 0 && v as usize <= rope_dims)
            .ok_or_else(|| {
                invalid(
                    &sections_key,
                    format!("{} values", sections.len()),
                    format!("must hold 4 integers in 0..={rope_dims}"),
                )
            })?;
    }
    Ok(rope_sections)
}
