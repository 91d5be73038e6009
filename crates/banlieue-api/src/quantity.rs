//! Kubernetes quantities (`1Gi`, `512Mi`, `10G`, `1073741824`) as byte counts.

/// Bytes of a quantity, or `None` when it is not a whole, non-negative number of bytes in a
/// binary (Ki…Ei) or decimal (k…E) unit. Fractions and exponents are refused rather than
/// rounded: a disk or memory size is never guessed.
pub fn to_bytes(quantity: &str) -> Option<u64> {
    let q = quantity.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let number: u64 = digits.parse().ok()?;
    let multiplier: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units() {
        assert_eq!(to_bytes("1Gi"), Some(1 << 30));
        assert_eq!(to_bytes("512Mi"), Some(512 << 20));
        assert_eq!(to_bytes("10G"), Some(10_000_000_000));
        assert_eq!(to_bytes("4096"), Some(4096));
        assert_eq!(to_bytes("1k"), Some(1000));
    }

    #[test]
    fn refuses_what_it_cannot_size_exactly() {
        for q in ["", "Gi", "1.5Gi", "1e3", "-1Gi", "1Xi", "99999999999Ei"] {
            assert_eq!(to_bytes(q), None, "{q}");
        }
    }
}
