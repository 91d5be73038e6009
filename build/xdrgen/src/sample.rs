//! Random *valid* XDR encodings of any type of a [`Model`], written straight from the schema.
//!
//! The XDR oracle and the wire snapshots feed these bytes to the generated Rust code and to
//! rpcgen's C code; a value both decode and re-encode to the same bytes is proof that the two
//! agree. Values stay within what C's decoders reproduce exactly: booleans are 0 or 1, chars
//! and shorts are sign- or zero-extended, strings hold no NUL, padding is zero.

use crate::model::{Model, Prim, Ty, TypeKind};

/// A source of randomness; a seeded generator gives deterministic samples.
pub trait Rng {
    fn next_u64(&mut self) -> u64;

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

/// SplitMix64: small, seedable, and good enough to pick sample values.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl Rng for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Limits that keep samples small; bounds declared in the schema still apply.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_array: u32,
    pub max_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_array: 3,
            max_bytes: 24,
        }
    }
}

/// Appends a random encoding of the named type. Returns `false` for an unknown name.
pub fn encode_named(
    model: &Model,
    name: &str,
    rng: &mut dyn Rng,
    limits: Limits,
    out: &mut Vec<u8>,
) -> bool {
    if !model.types.contains_key(name) {
        return false;
    }
    let ty = match &model.types[name].kind {
        TypeKind::Typedef(t) => t.clone(),
        _ => Ty::Named(name.to_string()),
    };
    encode(model, &ty, rng, limits, out);
    true
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn pad(out: &mut Vec<u8>, len: usize) {
    out.resize(out.len() + (4 - len % 4) % 4, 0);
}

/// Lengths favour the edges: empty, the declared maximum when small, and small values.
fn length(rng: &mut dyn Rng, max: Option<u32>, cap: u32) -> u32 {
    let max = max.unwrap_or(u32::MAX).min(cap);
    match rng.below(6) {
        0 => 0,
        1 => max,
        _ => rng.below(u64::from(max) + 1) as u32,
    }
}

pub fn encode(model: &Model, ty: &Ty, rng: &mut dyn Rng, limits: Limits, out: &mut Vec<u8>) {
    match ty {
        Ty::Prim(p) => prim(*p, rng, out),
        Ty::Alias(_, inner) => encode(model, inner, rng, limits, out),
        Ty::String(max) => {
            let len = length(rng, *max, limits.max_bytes);
            let mut s = String::new();
            while (s.len() as u32) < len {
                let c = match rng.below(16) {
                    0 if s.len() as u32 + 2 <= len => 'é',
                    1 if s.len() as u32 + 3 <= len => '€',
                    _ => char::from(b' ' + rng.below(95) as u8),
                };
                s.push(c);
            }
            put_u32(out, s.len() as u32);
            out.extend_from_slice(s.as_bytes());
            pad(out, s.len());
        }
        Ty::OpaqueFixed(n) => {
            out.extend((0..*n).map(|_| rng.next_u64() as u8));
            pad(out, *n as usize);
        }
        Ty::OpaqueVar(max) => {
            let len = length(rng, *max, limits.max_bytes);
            put_u32(out, len);
            out.extend((0..len).map(|_| rng.next_u64() as u8));
            pad(out, len as usize);
        }
        Ty::FixedArray(inner, n) => {
            for _ in 0..*n {
                encode(model, inner, rng, limits, out);
            }
        }
        Ty::VarArray(inner, max) => {
            let len = length(rng, *max, limits.max_array);
            put_u32(out, len);
            for _ in 0..len {
                encode(model, inner, rng, limits, out);
            }
        }
        Ty::Optional(inner) => {
            let present = rng.below(2) == 1;
            put_u32(out, u32::from(present));
            if present {
                encode(model, inner, rng, limits, out);
            }
        }
        Ty::Named(name) => match &model.types[name].kind {
            TypeKind::Enum(variants) => {
                // Mostly declared values; sometimes one this version does not know.
                let v = if variants.is_empty() || rng.below(8) == 0 {
                    rng.next_u64() as i32
                } else {
                    variants[rng.below(variants.len() as u64) as usize].1 as i32
                };
                put_u32(out, v as u32);
            }
            TypeKind::Struct(fields) => {
                for f in fields {
                    encode(model, &f.ty, rng, limits, out);
                }
            }
            TypeKind::Union(u) => {
                let use_default = u.default.is_some() && (u.arms.is_empty() || rng.below(4) == 0);
                if use_default {
                    let is_bool = matches!(u.discriminant.ty.unaliased(), Ty::Prim(Prim::Bool));
                    let taken: Vec<i64> = u.arms.iter().map(|a| a.value).collect();
                    let candidates: Vec<i64> = if is_bool {
                        vec![0, 1]
                    } else {
                        (0..64).map(|_| rng.next_u64() as i32 as i64).collect()
                    };
                    if let Some(d) = candidates.into_iter().find(|c| !taken.contains(c)) {
                        put_u32(out, d as u32);
                        if let Some(Some(f)) = &u.default {
                            encode(model, &f.ty, rng, limits, out);
                        }
                        return;
                    }
                }
                let arm = &u.arms[rng.below(u.arms.len() as u64) as usize];
                put_u32(out, arm.value as u32);
                if let Some(f) = &arm.body {
                    encode(model, &f.ty, rng, limits, out);
                }
            }
            TypeKind::Typedef(t) => encode(model, t, rng, limits, out),
        },
    }
}

fn prim(p: Prim, rng: &mut dyn Rng, out: &mut Vec<u8>) {
    let r = rng.next_u64();
    match p {
        Prim::I32 | Prim::U32 | Prim::F32 => put_u32(out, r as u32),
        Prim::I64 | Prim::U64 | Prim::F64 => out.extend_from_slice(&r.to_be_bytes()),
        Prim::Bool => put_u32(out, (r & 1) as u32),
        Prim::I8 => put_u32(out, r as i8 as i32 as u32),
        Prim::U8 => put_u32(out, u32::from(r as u8)),
        Prim::I16 => put_u32(out, r as i16 as i32 as u32),
        Prim::U16 => put_u32(out, u32::from(r as u16)),
    }
}
