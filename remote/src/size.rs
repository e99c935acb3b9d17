//! `--cache-limit` sizes: `50GB`, `1.5GiB`, `500MB`, `4096` (bytes).
use crate::RemoteError;

/// Bytes in a size written with an optional decimal (`KB`, `MB`, `GB`, `TB`) or binary (`KiB`,
/// `MiB`, `GiB`, `TiB`) unit.
pub fn parse_size(text: &str) -> Result<u64, RemoteError> {
    let bad = |reason: &str| RemoteError::BadSize {
        text: text.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| bad("expected a number and a unit, e.g. 50GB"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(bad(
                "unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
            ))
        }
    };
    Ok((number * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn decimal_and_binary_units() -> Result<(), crate::RemoteError> {
        assert_eq!(parse_size("50GB")?, 50_000_000_000);
        assert_eq!(parse_size("1.5GiB")?, 1_610_612_736);
        assert_eq!(parse_size("4096")?, 4096);
        assert_eq!(parse_size(" 2 mb ")?, 2_000_000);
        assert!(parse_size("fifty").is_err());
        assert!(parse_size("5 parsecs").is_err());
        Ok(())
    }
}
