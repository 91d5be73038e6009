//! The XDR runtime (RFC 4506) that generated protocol code is written against.
//!
//! Encoding appends to a [`BytesMut`]; decoding reads through a [`Reader`] that refuses short
//! input and, via [`Reader::finish`], trailing data. Every length read off the wire is checked
//! against the declared bound *and* against the bytes actually present before anything is
//! allocated, so a hostile length prefix costs nothing: an array never reserves more memory up
//! front than the input has bytes left.
//!
//! Strings decode lossily: bytes that are not UTF-8 become U+FFFD. libvirt's strings are C
//! strings (names, XML, messages) that the daemon does not check for UTF-8, so one object with
//! an odd name must not fail a whole listing.
//!
//! The traits, [`Reader`] and the procedure tables are public, for code that calls procedures
//! by type; the `put_*` functions and the `Reader::get_*` methods are the vocabulary of the
//! generated code, hidden from the documented API.

use bytes::BufMut;
pub use bytes::BytesMut;

/// Why a value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input ended before the value did.
    #[error("read past the end of input: needed {needed} bytes, {available} left")]
    ShortInput {
        /// Bytes the next item needs.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// The value ended before the input did.
    #[error("decode left {0} trailing bytes")]
    TrailingData(usize),
    /// A string, opaque or array is longer than its declared bound.
    #[error("encode {what}: length {len} exceeds its bound {max}")]
    EncodeBound {
        /// The field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// Its bound.
        max: u32,
    },
    /// The input claims a length beyond the field's declared bound.
    #[error("decode {what}: length {len} exceeds its bound {max}")]
    DecodeBound {
        /// The field.
        what: &'static str,
        /// The length claimed.
        len: u32,
        /// Its bound.
        max: u32,
    },
    /// Not produced by the generated decoders, which decode strings lossily; kept for callers
    /// that check strings themselves.
    #[error("decode {what}: string is not UTF-8")]
    InvalidUtf8 {
        /// The field.
        what: &'static str,
    },
    /// A union's discriminant names no arm and the union has no default.
    #[error("decode union {union}: unknown discriminant {value}")]
    UnknownDiscriminant {
        /// The union.
        union: &'static str,
        /// The discriminant read.
        value: i64,
    },
}

/// The result of encoding or decoding.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A type with an XDR encoding.
pub trait Xdr: Sized {
    /// Appends the encoding of `self`.
    fn encode(&self, out: &mut BytesMut) -> Result<()>;
    /// Reads one value, leaving the reader after it.
    fn decode(r: &mut Reader<'_>) -> Result<Self>;

    /// Encodes into a fresh buffer.
    fn to_bytes(&self) -> Result<BytesMut> {
        let mut out = BytesMut::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Decodes a value that must span all of `input`.
    fn from_bytes(input: &[u8]) -> Result<Self> {
        let mut r = Reader::new(input);
        let v = Self::decode(&mut r)?;
        r.finish()?;
        Ok(v)
    }
}

/// `void`: no bytes.
impl Xdr for () {
    fn encode(&self, _: &mut BytesMut) -> Result<()> {
        Ok(())
    }
    fn decode(_: &mut Reader<'_>) -> Result<Self> {
        Ok(())
    }
}

/// Which way a stream procedure moves data, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamDirection {
    /// The client reads (`@readstream`), e.g. a volume download.
    Read,
    /// The client writes (`@writestream`), e.g. a volume upload.
    Write,
}

/// A procedure of a program, as a type: its identity and its argument and return types.
pub trait Procedure {
    /// The program number (`REMOTE_PROGRAM`, …).
    const PROGRAM: u32;
    /// The program's protocol version.
    const VERSION: u32;
    /// The procedure number.
    const NUMBER: i32;
    /// libvirt's name for it (`REMOTE_PROC_CONNECT_GET_VERSION`).
    const NAME: &'static str;
    /// Set for procedures that open a data stream, with libvirt's parameter number.
    const STREAM: Option<(StreamDirection, u32)>;
    /// The call's arguments (`()` for none).
    type Args: Xdr;
    /// The reply's body (`()` for none).
    type Ret: Xdr;
}

/// A procedure the server uses to send unsolicited MESSAGE packets (events).
pub trait Event: Procedure {
    /// The body of the MESSAGE packets.
    type Message: Xdr;
}

/// A row of a program's procedure table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcedureInfo {
    /// The program number.
    pub program: u32,
    /// The program's protocol version.
    pub version: u32,
    /// The procedure number.
    pub number: i32,
    /// libvirt's name for it.
    pub name: &'static str,
    /// The XDR name of the argument type, if any.
    pub args: Option<&'static str>,
    /// The XDR name of the reply type, if any.
    pub ret: Option<&'static str>,
    /// The XDR name of the event message type, for procedures that carry events.
    pub message: Option<&'static str>,
    /// The stream it opens, with libvirt's parameter number.
    pub stream: Option<(StreamDirection, u32)>,
    /// libvirt's `@priority: high` annotation: the daemon runs it even when its workers are busy.
    pub priority_high: bool,
}

fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

#[doc(hidden)]
pub fn put_i32(out: &mut BytesMut, v: i32) -> Result<()> {
    out.put_i32(v);
    Ok(())
}
#[doc(hidden)]
pub fn put_u32(out: &mut BytesMut, v: u32) -> Result<()> {
    out.put_u32(v);
    Ok(())
}
#[doc(hidden)]
pub fn put_i64(out: &mut BytesMut, v: i64) -> Result<()> {
    out.put_i64(v);
    Ok(())
}
#[doc(hidden)]
pub fn put_u64(out: &mut BytesMut, v: u64) -> Result<()> {
    out.put_u64(v);
    Ok(())
}
#[doc(hidden)]
pub fn put_f32(out: &mut BytesMut, v: f32) -> Result<()> {
    out.put_u32(v.to_bits());
    Ok(())
}
#[doc(hidden)]
pub fn put_f64(out: &mut BytesMut, v: f64) -> Result<()> {
    out.put_u64(v.to_bits());
    Ok(())
}
#[doc(hidden)]
pub fn put_bool(out: &mut BytesMut, v: bool) -> Result<()> {
    put_u32(out, u32::from(v))
}
#[doc(hidden)]
/// `char` is a 4-byte signed integer on the wire (rpcgen's `xdr_char`).
pub fn put_char(out: &mut BytesMut, v: i8) -> Result<()> {
    put_i32(out, i32::from(v))
}
#[doc(hidden)]
pub fn put_uchar(out: &mut BytesMut, v: u8) -> Result<()> {
    put_u32(out, u32::from(v))
}
#[doc(hidden)]
pub fn put_short(out: &mut BytesMut, v: i16) -> Result<()> {
    put_i32(out, i32::from(v))
}
#[doc(hidden)]
pub fn put_ushort(out: &mut BytesMut, v: u16) -> Result<()> {
    put_u32(out, u32::from(v))
}

fn put_len(out: &mut BytesMut, len: usize, max: u32, what: &'static str) -> Result<()> {
    match u32::try_from(len) {
        Ok(n) if n <= max => put_u32(out, n),
        _ => Err(Error::EncodeBound { what, len, max }),
    }
}

fn put_padded(out: &mut BytesMut, bytes: &[u8]) {
    out.put_slice(bytes);
    out.put_bytes(0, padding(bytes.len()));
}

#[doc(hidden)]
pub fn put_string(out: &mut BytesMut, v: &str, max: u32, what: &'static str) -> Result<()> {
    put_len(out, v.len(), max, what)?;
    put_padded(out, v.as_bytes());
    Ok(())
}
#[doc(hidden)]
pub fn put_opaque_var(out: &mut BytesMut, v: &[u8], max: u32, what: &'static str) -> Result<()> {
    put_len(out, v.len(), max, what)?;
    put_padded(out, v);
    Ok(())
}
#[doc(hidden)]
pub fn put_opaque_fixed(out: &mut BytesMut, v: &[u8]) -> Result<()> {
    put_padded(out, v);
    Ok(())
}
#[doc(hidden)]
pub fn put_array<T>(
    out: &mut BytesMut,
    v: &[T],
    max: u32,
    what: &'static str,
    mut put: impl FnMut(&mut BytesMut, &T) -> Result<()>,
) -> Result<()> {
    put_len(out, v.len(), max, what)?;
    v.iter().try_for_each(|x| put(out, x))
}
#[doc(hidden)]
pub fn put_fixed_array<T>(
    out: &mut BytesMut,
    v: &[T],
    mut put: impl FnMut(&mut BytesMut, &T) -> Result<()>,
) -> Result<()> {
    v.iter().try_for_each(|x| put(out, x))
}
#[doc(hidden)]
pub fn put_option<T>(
    out: &mut BytesMut,
    v: Option<&T>,
    put: impl FnOnce(&mut BytesMut, &T) -> Result<()>,
) -> Result<()> {
    match v {
        None => put_u32(out, 0),
        Some(x) => {
            put_u32(out, 1)?;
            put(out, x)
        }
    }
}

#[doc(hidden)]
/// How many elements of `T` to reserve for an array that claims `claimed` elements when
/// `remaining` bytes of input are left: never more memory than those bytes. A claim that passes
/// the four-bytes-per-element check can still be far larger in memory than on the wire (a
/// 72-byte record may encode in 4 bytes), so the reservation is capped and the vector grows
/// only as elements actually decode.
pub fn initial_capacity<T>(claimed: usize, remaining: usize) -> usize {
    match std::mem::size_of::<T>() {
        0 => claimed,
        size => claimed.min(remaining / size),
    }
}

/// A cursor over XDR input.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `input`.
    pub fn new(input: &'a [u8]) -> Self {
        Reader { input, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(Error::TrailingData(n)),
        }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let available = self.remaining();
        if n > available {
            return Err(Error::ShortInput {
                needed: n,
                available,
            });
        }
        let s = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The rest of the input.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.input[self.pos..];
        self.pos = self.input.len();
        s
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    #[doc(hidden)]
    pub fn get_u32(&mut self) -> Result<u32> {
        self.array::<4>().map(u32::from_be_bytes)
    }
    #[doc(hidden)]
    pub fn get_i32(&mut self) -> Result<i32> {
        self.array::<4>().map(i32::from_be_bytes)
    }
    #[doc(hidden)]
    pub fn get_u64(&mut self) -> Result<u64> {
        self.array::<8>().map(u64::from_be_bytes)
    }
    #[doc(hidden)]
    pub fn get_i64(&mut self) -> Result<i64> {
        self.array::<8>().map(i64::from_be_bytes)
    }
    #[doc(hidden)]
    pub fn get_f32(&mut self) -> Result<f32> {
        self.get_u32().map(f32::from_bits)
    }
    #[doc(hidden)]
    pub fn get_f64(&mut self) -> Result<f64> {
        self.get_u64().map(f64::from_bits)
    }
    #[doc(hidden)]
    /// Any non-zero word is true, as in C's `xdr_bool`.
    pub fn get_bool(&mut self) -> Result<bool> {
        self.get_u32().map(|v| v != 0)
    }
    #[doc(hidden)]
    /// Truncates to 8 bits, as C's `xdr_char` does.
    pub fn get_char(&mut self) -> Result<i8> {
        self.get_i32().map(|v| v as i8)
    }
    #[doc(hidden)]
    pub fn get_uchar(&mut self) -> Result<u8> {
        self.get_u32().map(|v| v as u8)
    }
    #[doc(hidden)]
    pub fn get_short(&mut self) -> Result<i16> {
        self.get_i32().map(|v| v as i16)
    }
    #[doc(hidden)]
    pub fn get_ushort(&mut self) -> Result<u16> {
        self.get_u32().map(|v| v as u16)
    }

    /// A count, checked against its bound and against the input left, given that each
    /// element takes at least `min_size` bytes.
    fn get_len(&mut self, max: u32, min_size: usize, what: &'static str) -> Result<usize> {
        let len = self.get_u32()?;
        if len > max {
            return Err(Error::DecodeBound { what, len, max });
        }
        let needed = (len as usize).saturating_mul(min_size);
        if needed > self.remaining() {
            return Err(Error::ShortInput {
                needed,
                available: self.remaining(),
            });
        }
        Ok(len as usize)
    }

    fn padded(&mut self, len: usize) -> Result<&'a [u8]> {
        let bytes = self.take(len)?;
        // Padding content is ignored, as libvirt's own decoder (xdr_opaque) does.
        self.take(padding(len))?;
        Ok(bytes)
    }

    #[doc(hidden)]
    pub fn get_string(&mut self, max: u32, what: &'static str) -> Result<String> {
        let len = self.get_len(max, 1, what)?;
        let bytes = self.padded(len)?;
        // Lossy rather than an error: see the module comment. Valid UTF-8 is copied as is.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
    #[doc(hidden)]
    pub fn get_opaque_var(&mut self, max: u32, what: &'static str) -> Result<Vec<u8>> {
        let len = self.get_len(max, 1, what)?;
        self.padded(len).map(<[u8]>::to_vec)
    }
    #[doc(hidden)]
    pub fn get_opaque_fixed<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.padded(N)?);
        Ok(a)
    }
    #[doc(hidden)]
    pub fn get_array<T>(
        &mut self,
        max: u32,
        what: &'static str,
        get: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        // Every XDR item takes at least 4 bytes.
        self.get_array_sized(max, what, 4, get)
    }

    #[doc(hidden)]
    /// [`Reader::get_array`] of elements that each take at least `min_size` bytes on the
    /// wire (the generator works it out per type), so a count is refused at once unless the
    /// input can hold that many elements.
    pub fn get_array_sized<T>(
        &mut self,
        max: u32,
        what: &'static str,
        min_size: usize,
        mut get: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        let len = self.get_len(max, min_size.max(4), what)?;
        let mut v = Vec::with_capacity(initial_capacity::<T>(len, self.remaining()));
        for _ in 0..len {
            v.push(get(self)?);
        }
        Ok(v)
    }
    #[doc(hidden)]
    pub fn get_fixed_array<T, const N: usize>(
        &mut self,
        mut get: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<[T; N]> {
        let needed = N.saturating_mul(4);
        if needed > self.remaining() {
            return Err(Error::ShortInput {
                needed,
                available: self.remaining(),
            });
        }
        let mut v = Vec::with_capacity(N);
        for _ in 0..N {
            v.push(get(self)?);
        }
        match v.try_into() {
            Ok(a) => Ok(a),
            Err(_) => unreachable!("exactly N elements were pushed"),
        }
    }
    #[doc(hidden)]
    pub fn get_option<T>(&mut self, get: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        if self.get_bool()? {
            get(self).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_reserve_no_more_memory_than_the_input_has_bytes() {
        // 16384 records of 72 bytes claimed in 65540 bytes: passes the four-bytes-per-element
        // check, yet reserving the claim would take 1.1 MiB.
        type Record = [u64; 9];
        let reserved = initial_capacity::<Record>(16384, 65540) * std::mem::size_of::<Record>();
        assert!(reserved <= 65540, "reserved {reserved} bytes");
        assert_eq!(initial_capacity::<u32>(10, 1000), 10, "small claims as is");
        assert_eq!(
            initial_capacity::<()>(7, 0),
            7,
            "zero-sized elements cost nothing"
        );
    }

    #[test]
    fn a_huge_count_in_a_small_input_is_a_typed_error() {
        // 2^31 elements claimed, 96 bytes present.
        let mut bytes = (1u32 << 31).to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0; 96]);
        let mut r = Reader::new(&bytes);
        let err = r
            .get_array(u32::MAX, "claim", Reader::get_u64)
            .expect_err("short");
        assert!(matches!(err, Error::ShortInput { .. }), "{err}");
    }

    #[test]
    fn strings_that_are_not_utf8_decode_lossily() {
        let bytes = [0, 0, 0, 5, b'v', b'm', 0xff, b'-', b'1', 0, 0, 0];
        let mut r = Reader::new(&bytes);
        assert_eq!(r.get_string(64, "name").expect("lossy"), "vm\u{fffd}-1");
        r.finish().expect("padding consumed");
    }
}
