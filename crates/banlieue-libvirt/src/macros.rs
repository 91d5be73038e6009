//! The two macros behind the crate's hand-written libvirt values: [`open_enum!`] for integers
//! that name one thing (a state, an error code, an event type) and [`flag_set!`] for flag
//! words. Both keep values this version does not know: a newer libvirtd may send them, and a
//! caller may need to pass a flag this crate does not name yet.

/// An enum over a libvirt `int`: one variant per named value plus `Unknown(i32)` for the rest.
///
/// Rules, so every such enum behaves alike:
/// - `from_raw` maps a named value to its variant, anything else to `Unknown`; `raw` is the
///   inverse. `From<i32>` and `From<Self> for i32` do the same.
/// - Equality, ordering and hashing go by the number, so `Unknown(1)` equals the variant
///   whose value is 1: building `Unknown` by hand cannot make a value unequal to itself.
/// - `name()` is libvirt's (or virsh's) word for the value, `None` for unknown values;
///   `Display` prints the name or the number; `Debug` prints the variant.
/// - The enum is `#[non_exhaustive]`: naming a value libvirt adds later is not a breaking
///   change, so a `match` needs a wildcard arm.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $value:literal => $text:literal,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        #[non_exhaustive]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)*
            /// A value this version does not name, kept as sent.
            Unknown(i32),
        }

        impl $name {
            /// Every named value, in libvirt's order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),*];

            /// The value for libvirt's number: its variant, or `Unknown`.
            pub const fn from_raw(raw: i32) -> $name {
                match raw {
                    $($value => $name::$variant,)*
                    other => $name::Unknown(other),
                }
            }

            /// libvirt's number for the value.
            pub const fn raw(self) -> i32 {
                match self {
                    $($name::$variant => $value,)*
                    $name::Unknown(raw) => raw,
                }
            }

            /// libvirt's word for the value; `None` when this version does not name it.
            pub const fn name(self) -> Option<&'static str> {
                match $name::from_raw(self.raw()) {
                    $($name::$variant => Some($text),)*
                    $name::Unknown(_) => None,
                }
            }
        }

        impl From<i32> for $name {
            fn from(raw: i32) -> $name {
                $name::from_raw(raw)
            }
        }

        impl From<$name> for i32 {
            fn from(value: $name) -> i32 {
                value.raw()
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &$name) -> bool {
                self.raw() == other.raw()
            }
        }

        impl Eq for $name {}

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &$name) -> Option<::std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $name {
            fn cmp(&self, other: &$name) -> ::std::cmp::Ordering {
                self.raw().cmp(&other.raw())
            }
        }

        impl ::std::hash::Hash for $name {
            fn hash<H: ::std::hash::Hasher>(&self, state: &mut H) {
                self.raw().hash(state);
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match $name::from_raw(self.raw()) {
                    $($name::$variant => f.write_str(stringify!($variant)),)*
                    $name::Unknown(raw) => write!(f, "Unknown({raw})"),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self.name() {
                    Some(name) => f.write_str(name),
                    None => write!(f, "{}", self.raw()),
                }
            }
        }
    };
}

/// A set of libvirt flags (an `unsigned int` of `1 << n` values), bitflags-style.
///
/// Rules:
/// - Each flag is an associated constant with libvirt's name minus the type's prefix
///   (`VIR_DOMAIN_UNDEFINE_NVRAM` is `DomainUndefineFlags::NVRAM`); `|` combines them.
/// - `from_bits_retain` keeps bits this version does not name, so a caller can pass a flag of
///   a newer libvirt; `from_bits` refuses them. `bits` is the word sent to the daemon.
/// - `Debug` prints the named flags and any other bits in hex:
///   `DomainUndefineFlags(NVRAM | TPM | 0x100)`.
macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                const $flag:ident = $value:expr;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        $vis struct $name(u32);

        impl $name {
            $($(#[$fmeta])* pub const $flag: $name = $name($value);)*

            /// No flags: libvirt's default behaviour.
            pub const fn empty() -> $name {
                $name(0)
            }

            /// Every flag this version names.
            pub const fn all() -> $name {
                $name(0 $(| $value)*)
            }

            /// The word sent to libvirt.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// Flags from a word, keeping bits this version does not name.
            pub const fn from_bits_retain(bits: u32) -> $name {
                $name(bits)
            }

            /// Flags from a word; `None` if it has a bit this version does not name.
            pub const fn from_bits(bits: u32) -> Option<$name> {
                if bits & !$name::all().0 == 0 { Some($name(bits)) } else { None }
            }

            /// The flags of both; `|` in a `const`.
            pub const fn union(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }

            /// Whether no flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// Whether every flag of `other` is set here.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any flag of `other` is set here.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }

            /// Sets the flags of `other`.
            pub fn insert(&mut self, other: $name) {
                self.0 |= other.0;
            }

            /// Clears the flags of `other`.
            pub fn remove(&mut self, other: $name) {
                self.0 &= !other.0;
            }
        }

        impl ::std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }
        }

        impl ::std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, other: $name) {
                self.0 |= other.0;
            }
        }

        impl ::std::ops::BitAnd for $name {
            type Output = $name;
            fn bitand(self, other: $name) -> $name {
                $name(self.0 & other.0)
            }
        }

        impl ::std::ops::BitAndAssign for $name {
            fn bitand_assign(&mut self, other: $name) {
                self.0 &= other.0;
            }
        }

        impl ::std::ops::Sub for $name {
            type Output = $name;
            fn sub(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(concat!(stringify!($name), "("))?;
                let mut rest = self.0;
                let mut first = true;
                $(
                    if $value != 0 && rest & $value == $value {
                        if !first {
                            f.write_str(" | ")?;
                        }
                        f.write_str(stringify!($flag))?;
                        rest &= !$value;
                        first = false;
                    }
                )*
                if rest != 0 {
                    if !first {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{rest:#x}")?;
                } else if first {
                    f.write_str("empty")?;
                }
                f.write_str(")")
            }
        }
    };
}

#[cfg(test)]
mod tests {
    open_enum! {
        /// A test enum.
        pub enum Colour {
            /// Red.
            Red = 0 => "red",
            /// Green.
            Green = 1 => "green",
            /// Minus one.
            Negative = -1 => "negative",
        }
    }

    flag_set! {
        /// Test flags.
        pub struct Bits {
            /// A.
            const A = 1 << 0;
            /// B.
            const B = 1 << 1;
            /// C.
            const C = 1 << 4;
        }
    }

    #[test]
    fn open_enums_keep_unknown_values_and_compare_by_number() {
        assert_eq!(Colour::from_raw(1), Colour::Green);
        assert_eq!(Colour::from(-1), Colour::Negative);
        assert!(matches!(Colour::from_raw(7), Colour::Unknown(7)));
        assert_eq!(i32::from(Colour::Unknown(7)), 7);
        assert_eq!(Colour::Unknown(1), Colour::Green, "compared by number");
        assert_eq!(Colour::Unknown(1).name(), Some("green"));
        assert_eq!(format!("{:?}", Colour::Unknown(1)), "Green");
        assert_eq!(format!("{:?}", Colour::Unknown(9)), "Unknown(9)");
        assert_eq!(Colour::Red.to_string(), "red");
        assert_eq!(Colour::Unknown(9).to_string(), "9");
        assert!(Colour::Negative < Colour::Red);
        assert_eq!(Colour::KNOWN.len(), 3);
        for c in Colour::KNOWN {
            assert_eq!(Colour::from_raw(c.raw()), *c);
        }
        let set: std::collections::HashSet<Colour> = [Colour::Green, Colour::Unknown(1)].into();
        assert_eq!(set.len(), 1, "hashing agrees with equality");
    }

    #[test]
    fn flag_sets_combine_test_and_keep_unknown_bits() {
        let ab = Bits::A | Bits::B;
        assert_eq!(ab.bits(), 3);
        assert!(ab.contains(Bits::A) && !ab.contains(Bits::C));
        assert!(ab.intersects(Bits::B | Bits::C));
        assert_eq!(Bits::all().bits(), 0b10011);
        assert_eq!(Bits::from_bits(0b100), None);
        assert_eq!(Bits::from_bits(0b10001), Some(Bits::A | Bits::C));
        let odd = Bits::from_bits_retain(0x101);
        assert_eq!(odd.bits(), 0x101, "unknown bits survive");
        assert_eq!(format!("{odd:?}"), "Bits(A | 0x100)");
        assert_eq!(format!("{:?}", Bits::empty()), "Bits(empty)");
        assert_eq!(
            format!("{:?}", Bits::from_bits_retain(0x100)),
            "Bits(0x100)"
        );
        let mut f = Bits::default();
        assert!(f.is_empty());
        f |= Bits::C;
        f.insert(Bits::A);
        f.remove(Bits::C);
        assert_eq!(f, Bits::A);
        assert_eq!((Bits::all() - Bits::B) & Bits::B, Bits::empty());
        assert_eq!(Bits::A.union(Bits::B), ab);
    }
}
