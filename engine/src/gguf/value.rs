//! The metadata value model: scalars, strings and typed arrays.
//!
//! Arrays are held as typed vectors (`Vec<u8>`, `Vec<f32>`, ...) rather than as vectors of
//! values, and the strings of a string array share one buffer, so the memory a parsed array takes
//! stays within a small multiple of the bytes that encode it in the file.

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `u8` (type 0).
    U8(u8),
    /// `i8` (type 1).
    I8(i8),
    /// `u16` (type 2).
    U16(u16),
    /// `i16` (type 3).
    I16(i16),
    /// `u32` (type 4).
    U32(u32),
    /// `i32` (type 5).
    I32(i32),
    /// `u64` (type 10).
    U64(u64),
    /// `i64` (type 11).
    I64(i64),
    /// `f32` (type 6).
    F32(f32),
    /// `f64` (type 12).
    F64(f64),
    /// `bool` (type 7), one byte that must be 0 or 1.
    Bool(bool),
    /// A string (type 8). Invalid UTF-8 in a value is replaced with U+FFFD.
    Str(String),
    /// An array (type 9) of values of one type.
    Array(Box<MetaArray>),
}

/// An array value: the elements of one type, stored compactly.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    /// Elements of type `u8`.
    U8(Vec<u8>),
    /// Elements of type `i8`.
    I8(Vec<i8>),
    /// Elements of type `u16`.
    U16(Vec<u16>),
    /// Elements of type `i16`.
    I16(Vec<i16>),
    /// Elements of type `u32`.
    U32(Vec<u32>),
    /// Elements of type `i32`.
    I32(Vec<i32>),
    /// Elements of type `u64`.
    U64(Vec<u64>),
    /// Elements of type `i64`.
    I64(Vec<i64>),
    /// Elements of type `f32`.
    F32(Vec<f32>),
    /// Elements of type `f64`.
    F64(Vec<f64>),
    /// Elements of type `bool`.
    Bool(Vec<bool>),
    /// Strings.
    Str(StrArray),
    /// Arrays (nested at most a few levels deep).
    Array(Vec<MetaArray>),
}

/// The strings of a string array, in one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StrArray {
    text: String,
    /// End offset in `text` of each string.
    ends: Vec<usize>,
}

impl StrArray {
    /// An empty array.
    pub fn new() -> StrArray {
        StrArray::default()
    }

    /// An empty array with room for `n` strings of `bytes` bytes in all.
    pub fn with_capacity(n: usize, bytes: usize) -> StrArray {
        StrArray {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends a string.
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the array holds no strings.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The string at `index`.
    pub fn get(&self, index: usize) -> Option<&str> {
        let end = *self.ends.get(index)?;
        let start = match index {
            0 => 0,
            i => self.ends[i - 1],
        };
        self.text.get(start..end)
    }

    /// The strings in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }
}

impl<S: AsRef<str>> FromIterator<S> for StrArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> StrArray {
        let mut out = StrArray::new();
        for s in iter {
            out.push(s.as_ref());
        }
        out
    }
}

/// Calls `$body` with `$v` bound to the vector of whichever numeric or bool variant `$arr` is;
/// evaluates `$other` for strings and nested arrays.
macro_rules! each_plain {
    ($arr:expr, $v:ident => $body:expr, $other:expr) => {
        match $arr {
            MetaArray::U8($v) => $body,
            MetaArray::I8($v) => $body,
            MetaArray::U16($v) => $body,
            MetaArray::I16($v) => $body,
            MetaArray::U32($v) => $body,
            MetaArray::I32($v) => $body,
            MetaArray::U64($v) => $body,
            MetaArray::I64($v) => $body,
            MetaArray::F32($v) => $body,
            MetaArray::F64($v) => $body,
            MetaArray::Bool($v) => $body,
            _ => $other,
        }
    };
}

impl MetaArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::Str(s) => s.len(),
            MetaArray::Array(a) => a.len(),
            other => each_plain!(other, v => v.len(), 0),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF type code of the elements.
    pub fn elem_type_code(&self) -> u32 {
        match self {
            MetaArray::U8(_) => 0,
            MetaArray::I8(_) => 1,
            MetaArray::U16(_) => 2,
            MetaArray::I16(_) => 3,
            MetaArray::U32(_) => 4,
            MetaArray::I32(_) => 5,
            MetaArray::F32(_) => 6,
            MetaArray::Bool(_) => 7,
            MetaArray::Str(_) => 8,
            MetaArray::Array(_) => 9,
            MetaArray::U64(_) => 10,
            MetaArray::I64(_) => 11,
            MetaArray::F64(_) => 12,
        }
    }

    /// The GGUF type name of the elements, for messages.
    pub fn elem_type_name(&self) -> &'static str {
        type_name(self.elem_type_code())
    }

    /// The strings, if this is an array of strings.
    pub fn as_strs(&self) -> Option<&StrArray> {
        match self {
            MetaArray::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The elements as `i64`, if this is an array of integers that all fit.
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            MetaArray::U8(v) => conv(v, |x| Some(x.into())),
            MetaArray::I8(v) => conv(v, |x| Some(x.into())),
            MetaArray::U16(v) => conv(v, |x| Some(x.into())),
            MetaArray::I16(v) => conv(v, |x| Some(x.into())),
            MetaArray::U32(v) => conv(v, |x| Some(x.into())),
            MetaArray::I32(v) => conv(v, |x| Some(x.into())),
            MetaArray::U64(v) => conv(v, |x| i64::try_from(x).ok()),
            MetaArray::I64(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// The elements as `f64`, if this is an array of numbers (floats or integers).
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        match self {
            MetaArray::F32(v) => Some(v.iter().map(|&x| x.into()).collect()),
            MetaArray::F64(v) => Some(v.clone()),
            other => other
                .to_i64s()
                .map(|v| v.into_iter().map(|x| x as f64).collect()),
        }
    }

    /// The element at `index` as a value (strings and nested arrays are copied).
    pub fn get(&self, index: usize) -> Option<MetaValue> {
        Some(match self {
            MetaArray::U8(v) => MetaValue::U8(*v.get(index)?),
            MetaArray::I8(v) => MetaValue::I8(*v.get(index)?),
            MetaArray::U16(v) => MetaValue::U16(*v.get(index)?),
            MetaArray::I16(v) => MetaValue::I16(*v.get(index)?),
            MetaArray::U32(v) => MetaValue::U32(*v.get(index)?),
            MetaArray::I32(v) => MetaValue::I32(*v.get(index)?),
            MetaArray::U64(v) => MetaValue::U64(*v.get(index)?),
            MetaArray::I64(v) => MetaValue::I64(*v.get(index)?),
            MetaArray::F32(v) => MetaValue::F32(*v.get(index)?),
            MetaArray::F64(v) => MetaValue::F64(*v.get(index)?),
            MetaArray::Bool(v) => MetaValue::Bool(*v.get(index)?),
            MetaArray::Str(v) => MetaValue::Str(v.get(index)?.to_owned()),
            MetaArray::Array(v) => MetaValue::Array(Box::new(v.get(index)?.clone())),
        })
    }
}

/// The GGUF name of a value type code.
pub(crate) fn type_name(code: u32) -> &'static str {
    match code {
        0 => "u8",
        1 => "i8",
        2 => "u16",
        3 => "i16",
        4 => "u32",
        5 => "i32",
        6 => "f32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "u64",
        11 => "i64",
        12 => "f64",
        _ => "unknown",
    }
}

impl MetaValue {
    /// The GGUF type code of this value.
    pub fn type_code(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }

    /// The GGUF type name of this value, for messages.
    pub fn type_name(&self) -> &'static str {
        type_name(self.type_code())
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an `i64`, if this is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a `u64`, if this is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// The value as an `f64`, if this is a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value, if this is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The array, if this is an array.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// A short description for error messages: the type, and for arrays the element type.
    pub(crate) fn describe(&self) -> String {
        match self {
            MetaValue::Array(items) if items.is_empty() => "empty array".to_string(),
            MetaValue::Array(items) => format!("array of {}", items.elem_type_name()),
            other => other.type_name().to_string(),
        }
    }
}

impl From<MetaArray> for MetaValue {
    fn from(a: MetaArray) -> MetaValue {
        MetaValue::Array(Box::new(a))
    }
}
