//! The ggml tensor element types a GGUF file can name: code, block size, bytes per block.
//!
//! The table mirrors ggml's own type traits; a unit test checks every entry against the linked
//! ggml, so the two cannot drift apart unnoticed.

use crate::{Error, Result};

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $name:ident = $code:literal, $block:literal, $size:literal; )*) => {
        /// A ggml tensor element type, with its GGUF type code.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum GgmlType {
            $( $(#[$doc])* $name = $code, )*
        }

        impl GgmlType {
            /// The type for a GGUF type code; `None` for codes this engine does not know.
            pub fn from_code(code: u32) -> Option<GgmlType> {
                match code {
                    $( $code => Some(GgmlType::$name), )*
                    _ => None,
                }
            }

            /// Elements per quantization block (1 for plain types).
            pub fn block_size(self) -> u64 {
                match self { $( GgmlType::$name => $block, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self { $( GgmlType::$name => $size, )* }
            }

            /// The type's name, e.g. `"Q4_1"`.
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$name => stringify!($name), )* }
            }
        }
    };
}

ggml_types! {
    /// 32-bit float.
    F32 = 0, 1, 4;
    /// 16-bit IEEE float.
    F16 = 1, 1, 2;
    /// 4-bit, one f16 scale per 32.
    Q4_0 = 2, 32, 18;
    /// 4-bit, f16 scale and min per 32.
    Q4_1 = 3, 32, 20;
    /// 5-bit, one f16 scale per 32.
    Q5_0 = 6, 32, 22;
    /// 5-bit, f16 scale and min per 32.
    Q5_1 = 7, 32, 24;
    /// 8-bit, one f16 scale per 32.
    Q8_0 = 8, 32, 34;
    /// 8-bit, f16 scale and sum per 32.
    Q8_1 = 9, 32, 36;
    /// 2-bit k-quant.
    Q2_K = 10, 256, 84;
    /// 3-bit k-quant.
    Q3_K = 11, 256, 110;
    /// 4-bit k-quant.
    Q4_K = 12, 256, 144;
    /// 5-bit k-quant.
    Q5_K = 13, 256, 176;
    /// 6-bit k-quant.
    Q6_K = 14, 256, 210;
    /// 8-bit k-quant (intermediate type).
    Q8_K = 15, 256, 292;
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS = 16, 256, 66;
    /// i-quant, 2.31 bits per weight.
    IQ2_XS = 17, 256, 74;
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS = 18, 256, 98;
    /// i-quant, 1.56 bits per weight.
    IQ1_S = 19, 256, 50;
    /// 4-bit non-linear, blocks of 32.
    IQ4_NL = 20, 32, 18;
    /// i-quant, 3.44 bits per weight.
    IQ3_S = 21, 256, 110;
    /// i-quant, 2.5 bits per weight.
    IQ2_S = 22, 256, 82;
    /// 4-bit non-linear, blocks of 256.
    IQ4_XS = 23, 256, 136;
    /// 8-bit integer.
    I8 = 24, 1, 1;
    /// 16-bit integer.
    I16 = 25, 1, 2;
    /// 32-bit integer.
    I32 = 26, 1, 4;
    /// 64-bit integer.
    I64 = 27, 1, 8;
    /// 64-bit float.
    F64 = 28, 1, 8;
    /// i-quant, 1.75 bits per weight.
    IQ1_M = 29, 256, 56;
    /// bfloat16.
    BF16 = 30, 1, 2;
    /// ternary, 1.69 bits per weight.
    TQ1_0 = 34, 256, 54;
    /// ternary, 2.06 bits per weight.
    TQ2_0 = 35, 256, 66;
    /// 4-bit microscaling float.
    MXFP4 = 39, 32, 17;
}

impl GgmlType {
    /// The type for a GGUF type code, or [`Error::UnsupportedTensorType`] naming `tensor`.
    pub fn from_u32(code: u32, tensor: &str) -> Result<GgmlType> {
        GgmlType::from_code(code).ok_or_else(|| Error::UnsupportedTensorType {
            type_code: code,
            tensor: tensor.to_string(),
        })
    }

    /// Bytes taken by `n` consecutive elements. `n` should be a multiple of
    /// [`block_size`](Self::block_size); a partial block counts as a whole one.
    pub fn row_bytes(self, n: u64) -> u64 {
        n.div_ceil(self.block_size()) * self.type_size()
    }

    /// Bytes of a tensor of this type with `shape`, or `None` when a row is not a whole number of
    /// blocks or the size overflows.
    pub fn tensor_bytes(self, shape: &[u64]) -> Option<u64> {
        let (&ne0, rest) = match shape.split_first() {
            Some(split) => split,
            None => return Some(self.type_size()),
        };
        if ne0 % self.block_size() != 0 {
            return None;
        }
        let row = (ne0 / self.block_size()).checked_mul(self.type_size())?;
        rest.iter().try_fold(row, |acc, &ne| acc.checked_mul(ne))
    }
}

#[cfg(test)]
mod tests {
    use super::GgmlType;
    use crate::ggml::type_facts;

    #[test]
    fn the_table_agrees_with_ggml() {
        let mut checked = 0;
        for code in 0..64 {
            let Some(ours) = GgmlType::from_code(code) else {
                continue;
            };
            let facts = type_facts(code)
                .unwrap_or_else(|| panic!("ggml does not know type {code} ({})", ours.name()));
            assert_eq!(ours.block_size(), facts.block_size, "{}", ours.name());
            assert_eq!(ours.type_size(), facts.type_size, "{}", ours.name());
            assert!(
                ours.name().eq_ignore_ascii_case(&facts.name),
                "code {code}: {} here, {} in ggml",
                ours.name(),
                facts.name
            );
            checked += 1;
        }
        assert_eq!(checked, 32);
    }
}
