//! KV element types between sessions and the store: a layout's block geometry, the check that
//! refuses a session of other types, and the conversion of spans when the store keeps its
//! blocks in other types than its sessions compute with ([`StoreConfig`](super::StoreConfig)).

use std::borrow::Cow;

use ckptfmt::{Geometry, LayerGeometry};

use super::{SessionStore, TOKENS_PER_BLOCK};
use crate::error::{Error, Foreign, Result};
use crate::kv::{KvLayout, KvType};

/// The checkpoint geometry of a KV layout: its element types ([`KvType::pair_elem`]), one page
/// per block.
pub fn geometry(layout: &KvLayout) -> Result<Geometry> {
    let layers = (0..layout.n_layers)
        .map(|l| LayerGeometry {
            k_bytes_per_token: layout.k_bytes_per_token[l] as u32,
            v_bytes_per_token: layout.v_bytes_per_token[l] as u32,
        })
        .collect();
    let elem = KvType::pair_elem(layout.type_k, layout.type_v);
    Geometry::new(layers, elem, TOKENS_PER_BLOCK).ours()
}

/// The checkpoint geometry of `layout` for a model with `hp`: [`geometry`], and for a hybrid
/// model each recurrent layer's state bytes (ckptfmt's format version 2: a checkpoint then
/// carries the state after its last token beside the KV).
pub(super) fn model_geometry(layout: &KvLayout, hp: &crate::model::HParams) -> Result<Geometry> {
    let g = geometry(layout)?;
    let Some(shape) = hp.state_shape() else {
        return Ok(g);
    };
    // The layout of `Context::recurrent_state`: per recurrent layer, its convolution state
    // then its delta-net state (if any), as f32.
    let per_layer = 4 * (shape.conv_len + shape.ssm_len);
    let state = shape
        .layers
        .iter()
        .map(|&r| if r { per_layer as u32 } else { 0 })
        .collect();
    g.with_state(state).ours()
}

/// Refuses a session layout whose KV element types differ from the stored geometry's, naming
/// both ([`Error::KvTypeMismatch`]).
pub(super) fn check_kv_types(stored: &Geometry, layout: &KvLayout) -> Result<()> {
    let session = (layout.type_k, layout.type_v);
    let stored_types = KvType::from_pair_elem(stored.elem());
    if stored_types == Some(session) {
        return Ok(());
    }
    let (stored_k, stored_v) = match stored_types {
        Some((k, v)) => (k.to_string(), v.to_string()),
        None => (
            stored.elem().name().to_string(),
            stored.elem().name().to_string(),
        ),
    };
    Err(Error::KvTypeMismatch {
        stored_k,
        stored_v,
        session_k: layout.type_k,
        session_v: layout.type_v,
    })
}

impl SessionStore {
    /// How spans move between the store and a context of `layout`: `None` byte for byte (the
    /// same types), `Some` converted (the session types of the configuration, stored as other
    /// types), and any other types refused ([`Error::KvTypeMismatch`]).
    pub(super) fn conversion(&self, layout: &KvLayout) -> Result<Option<KvLayout>> {
        let types = (layout.type_k, layout.type_v);
        if types == (self.stored.type_k, self.stored.type_v) {
            // `open` built the store's geometry from these types.
            return Ok(None);
        }
        if types == self.session_types {
            return Ok(Some(layout.clone()));
        }
        // Neither: refused, naming the stored types.
        check_kv_types(self.handle.geometry(), layout).map(|()| None)
    }

    /// A span of a context of `layout` in the store's types.
    pub(super) fn session_to_stored(
        &self,
        conversion: &Option<KvLayout>,
        span: Vec<u8>,
    ) -> Result<Vec<u8>> {
        match conversion {
            Some(layout) if !span.is_empty() => layout.convert_span(&span, &self.stored),
            _ => Ok(span),
        }
    }

    /// A stored span in the types of a context (see [`SessionStore::conversion`]).
    pub(super) fn stored_to_session<'a>(
        &self,
        conversion: &Option<KvLayout>,
        span: &'a [u8],
    ) -> Result<Cow<'a, [u8]>> {
        Ok(match conversion {
            Some(layout) if !span.is_empty() => self.stored.convert_span(span, layout)?.into(),
            _ => span.into(),
        })
    }
}
