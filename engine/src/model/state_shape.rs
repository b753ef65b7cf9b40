//! The shape of a hybrid model's per-sequence recurrent state (`recurrent.rs`), whichever
//! kind its recurrent layers are: gated delta-nets (qwen35), gated short convolutions (lfm2)
//! or Mamba-2 (nemotron_h).

use super::HParams;

/// The per-sequence state of a hybrid's recurrent layers, whichever kind they are: per
/// recurrent layer a convolution state of `conv_len` f32 values and, for delta-nets and Mamba-2,
/// a matrix state of `ssm_len` (0 for short convolutions, which keep none).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StateShape<'a> {
    /// Per layer: whether it is recurrent.
    pub layers: &'a [bool],
    pub conv_len: usize,
    pub ssm_len: usize,
}

impl HParams {
    /// Whether layer `il` is recurrent (a gated delta-net, short convolution or Mamba-2 layer
    /// of a hybrid).
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.state_shape()
            .is_some_and(|s| s.layers.get(il).copied().unwrap_or(false))
    }

    /// The shape of a hybrid's per-sequence recurrent state; `None` for attention-only models.
    pub(crate) fn state_shape(&self) -> Option<StateShape<'_>> {
        if let Some(d) = &self.delta_net {
            return Some(StateShape {
                layers: &d.layers,
                conv_len: d.conv_state_len(),
                ssm_len: d.ssm_state_len(),
            });
        }
        if let Some(m) = &self.mamba2 {
            return m.layers.contains(&true).then(|| StateShape {
                layers: &m.layers,
                conv_len: m.conv_state_len(),
                ssm_len: m.ssm_state_len(),
            });
        }
        // An lfm2 file without convolution layers keeps no state.
        let s = self.short_conv.as_ref()?;
        s.layers.contains(&true).then(|| StateShape {
            layers: &s.layers,
            conv_len: s.conv_state_len(self.n_embd),
            ssm_len: 0,
        })
    }
}
