//! Every mapping from an XDR name to a Rust name lives here, so that collisions and keywords
//! are handled in one place.

const RUST_KEYWORDS: &[&str] = &[
    "as", "break", "const", "continue", "else", "enum", "extern", "false", "fn", "for", "if",
    "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static",
    "struct", "trait", "true", "type", "unsafe", "use", "where", "while", "async", "await", "dyn",
    "abstract", "become", "box", "do", "final", "macro", "override", "priv", "typeof", "unsized",
    "virtual", "yield", "try", "gen",
];
/// Keywords that cannot be raw identifiers.
const NON_RAW_KEYWORDS: &[&str] = &["self", "Self", "super", "crate", "_"];

fn words(name: &str) -> impl Iterator<Item = &str> {
    name.split('_').filter(|w| !w.is_empty())
}

fn upper_first(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(c) => c.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

fn not_leading_digit(name: String, prefix: &str) -> String {
    if name.starts_with(|c: char| c.is_ascii_digit()) || name.is_empty() {
        format!("{prefix}{name}")
    } else {
        name
    }
}

/// `remote_domain_get_info_ret` → `RemoteDomainGetInfoRet`; `virNetMessageHeader` →
/// `VirNetMessageHeader`. The casing inside a word is kept.
pub fn type_name(xdr: &str) -> String {
    not_leading_digit(words(xdr).map(upper_first).collect(), "T")
}

/// `CONNECT_OPEN` → `ConnectOpen`, for procedure markers and union variants.
pub fn variant_name(xdr: &str) -> String {
    not_leading_digit(
        words(xdr)
            .map(|w| upper_first(&w.to_ascii_lowercase()))
            .collect(),
        "V",
    )
}

/// `nrVirtCpu` → `nr_virt_cpu`; keywords become raw identifiers (`r#type`), as prost does.
pub fn field_name(xdr: &str) -> String {
    let mut out = String::with_capacity(xdr.len() + 4);
    let mut prev: Option<char> = None;
    for c in xdr.chars() {
        if c.is_ascii_uppercase() {
            if matches!(prev, Some(p) if p.is_ascii_lowercase() || p.is_ascii_digit()) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
        prev = Some(c);
    }
    let out = not_leading_digit(out, "f_");
    if NON_RAW_KEYWORDS.contains(&out.as_str()) {
        format!("{out}_")
    } else if RUST_KEYWORDS.contains(&out.as_str()) {
        format!("r#{out}")
    } else {
        out
    }
}

/// Constants keep their XDR spelling, upper-cased.
pub fn const_name(xdr: &str) -> String {
    not_leading_digit(xdr.to_ascii_uppercase(), "C_")
}

/// The module a file's items go to: `remote_protocol` → `remote`.
pub fn module_name(file_stem: &str) -> String {
    let stem = file_stem
        .trim_end_matches("_protocol")
        .trim_end_matches("protocol");
    let stem = stem
        .strip_prefix("vir")
        .filter(|s| !s.is_empty())
        .unwrap_or(stem);
    field_name(&stem.to_ascii_lowercase())
}

/// Drops the longest prefix of whole `_`-separated words shared by all `names`, when every
/// remainder is still a usable identifier: `VIR_NET_CALL`, `VIR_NET_REPLY` → `CALL`, `REPLY`.
pub fn strip_common_prefix(names: &[&str]) -> Vec<String> {
    if names.len() < 2 {
        return names.iter().map(|n| n.to_string()).collect();
    }
    let split: Vec<Vec<&str>> = names.iter().map(|n| n.split('_').collect()).collect();
    let mut common = 0;
    'outer: while let Some(word) = split[0].get(common) {
        for s in &split {
            // Keep at least one word, and never leave a remainder that starts with a digit.
            if s.len() <= common + 1 || s[common] != *word {
                break 'outer;
            }
            if s[common + 1].starts_with(|c: char| c.is_ascii_digit()) || s[common + 1].is_empty() {
                break 'outer;
            }
        }
        common += 1;
    }
    split.iter().map(|s| s[common..].join("_")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert_eq!(
            type_name("remote_domain_get_info_ret"),
            "RemoteDomainGetInfoRet"
        );
        assert_eq!(type_name("virNetMessageHeader"), "VirNetMessageHeader");
        assert_eq!(type_name("remote_UUID"), "RemoteUUID");
        assert_eq!(type_name("_x"), "X");
        assert_eq!(type_name("9lives"), "T9lives");
    }

    #[test]
    fn type_names_collide_only_when_words_match() {
        // Both spellings map to one Rust name; the model reports such pairs as duplicates.
        assert_eq!(type_name("remote_foo_bar"), type_name("remote_fooBar"));
        assert_ne!(type_name("remote_foobar"), type_name("remote_foo_bar"));
    }

    #[test]
    fn field_names() {
        assert_eq!(field_name("nrVirtCpu"), "nr_virt_cpu");
        assert_eq!(field_name("type"), "r#type");
        assert_eq!(field_name("match"), "r#match");
        assert_eq!(field_name("self"), "self_");
        assert_eq!(field_name("Self"), "self_");
        assert_eq!(field_name("cpumap"), "cpumap");
        assert_eq!(field_name("str1"), "str1");
        assert_eq!(field_name("uuid"), "uuid");
        assert_eq!(field_name("1st"), "f_1st");
    }

    #[test]
    fn field_names_collide_when_casing_differs_only() {
        assert_eq!(field_name("fooBar"), field_name("foo_bar"));
    }

    #[test]
    fn variant_names() {
        assert_eq!(variant_name("CONNECT_OPEN"), "ConnectOpen");
        assert_eq!(variant_name("ULLONG"), "Ullong");
        assert_eq!(variant_name("2"), "V2");
    }

    #[test]
    fn modules() {
        assert_eq!(module_name("remote_protocol"), "remote");
        assert_eq!(module_name("virnetprotocol"), "net");
        assert_eq!(module_name("virkeepaliveprotocol"), "keepalive");
        assert_eq!(module_name("admin_protocol"), "admin");
    }

    #[test]
    fn common_prefixes() {
        assert_eq!(
            strip_common_prefix(&["VIR_NET_CALL", "VIR_NET_REPLY"]),
            vec!["CALL", "REPLY"]
        );
        assert_eq!(strip_common_prefix(&["A_1", "A_2"]), vec!["A_1", "A_2"]);
        assert_eq!(strip_common_prefix(&["ONLY_ONE"]), vec!["ONLY_ONE"]);
        assert_eq!(strip_common_prefix(&["X_Y", "X_Y_Z"]), vec!["Y", "Y_Z"]);
        assert_eq!(strip_common_prefix(&["SAME", "SAME"]), vec!["SAME", "SAME"]);
    }
}
