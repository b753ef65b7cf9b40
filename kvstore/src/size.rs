//! Byte sizes as people write them (`50MB`, `1GiB`, `512k`, `1.5 GB`), for
//! disk budgets given on a command line, and back.

use crate::error::{Result, StoreError};

/// Units: decimal (`k`, `M`, `G`, `T`, optionally followed by `B`) and binary
/// (`KiB`, `MiB`, `GiB`, `TiB`), matched without regard to case.
const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1_000),
    ("kb", 1_000),
    ("kib", 1 << 10),
    ("m", 1_000_000),
    ("mb", 1_000_000),
    ("mib", 1 << 20),
    ("g", 1_000_000_000),
    ("gb", 1_000_000_000),
    ("gib", 1 << 30),
    ("t", 1_000_000_000_000),
    ("tb", 1_000_000_000_000),
    ("tib", 1 << 40),
];

/// Parses a byte size: a number (decimals allowed) and an optional unit, as
/// in `4096`, `50MB` (50 × 10⁶), `1GiB` (2³⁰), `1.5 gb`. A negative, non-finite,
/// unknown or too large size is [`StoreError::Invalid`].
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = |why: &str| StoreError::Invalid {
        what: "size",
        detail: format!("{text:?}: {why} (examples: 4096, 50MB, 1GiB)"),
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let scale = UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, s)| *s)
        .ok_or_else(|| bad("unknown unit"))?;
    if num.is_empty() {
        return Err(bad("no number"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(scale).ok_or_else(|| bad("too large"));
    }
    let x: f64 = num.parse().map_err(|_| bad("not a number"))?;
    let bytes = (x * scale as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad("too large"));
    }
    Ok(bytes as u64)
}

/// Formats a byte count for people: `512 B`, `1.5 KiB`, `23.4 MiB`, `1.0 GiB`.
pub fn format_size(bytes: u64) -> String {
    const NAMES: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = bytes as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < NAMES.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{x:.1} {}", NAMES[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_decimal_and_binary_units() {
        let cases = [
            ("4096", 4096),
            ("50MB", 50_000_000),
            ("50 mb", 50_000_000),
            ("1GiB", 1_073_741_824),
            ("1.5GB", 1_500_000_000),
            ("512k", 512_000),
            ("2KiB", 2048),
            ("0", 0),
            ("7b", 7),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text).unwrap(), want, "{text}");
        }
        for text in [
            "",
            "MB",
            "-1MB",
            "1.2.3",
            "5 parsecs",
            "99999999999TiB",
            "nan",
        ] {
            assert!(parse_size(text).is_err(), "{text}");
        }
    }

    #[test]
    fn sizes_format_with_binary_units() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(50_000_000), "47.7 MiB");
        assert_eq!(format_size(1 << 30), "1.0 GiB");
    }
}
