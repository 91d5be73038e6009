//! The libvirt packet: a 4-byte length that counts itself, the 24-byte header
//! (`virNetMessageHeader`), for `*_WITH_FDS` types a file-descriptor count, then the body.
//!
//! Sans-io: [`Packet::encode`] and [`Packet::decode`] work on byte buffers; [`PacketCodec`] is
//! the tokio-util `Decoder`/`Encoder` pair, the only piece an async transport touches.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::proto::net::{
    VIR_NET_MESSAGE_HEADER_MAX, VIR_NET_MESSAGE_LEN_MAX, VIR_NET_MESSAGE_MAX,
    VIR_NET_MESSAGE_NUM_FDS_MAX, VirNetMessageError, VirNetMessageHeader, VirNetMessageStatus,
    VirNetMessageType,
};
use crate::xdr::{self, Reader, Xdr};

/// Bytes of the length word.
pub const LEN_SIZE: usize = VIR_NET_MESSAGE_LEN_MAX as usize;
/// Bytes of the header.
pub const HEADER_SIZE: usize = VIR_NET_MESSAGE_HEADER_MAX as usize;
/// The largest packet libvirt accepts, length word excluded (`VIR_NET_MESSAGE_MAX`).
pub const MAX_PACKET: usize = VIR_NET_MESSAGE_MAX as usize;
/// The largest body of one packet.
pub const MAX_BODY: usize = MAX_PACKET - HEADER_SIZE;

/// Why bytes are not a packet, or a packet cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PacketError {
    /// The length word is below the size of length word and header.
    #[error("packet length {0} is below the {min} bytes of length and header", min = LEN_SIZE + HEADER_SIZE)]
    TooShort(u32),
    /// The length word is above libvirt's limit.
    #[error("packet length {0} exceeds libvirt's limit of {max} bytes", max = MAX_PACKET + LEN_SIZE)]
    TooLong(u64),
    /// Fewer bytes are present than the length word claims.
    #[error("packet claims {claimed} bytes but {available} are present")]
    Truncated {
        /// Bytes the length word claims.
        claimed: usize,
        /// Bytes present.
        available: usize,
    },
    /// The descriptor count is above libvirt's limit.
    #[error("packet carries {0} file descriptors, more than libvirt's limit of {max}", max = VIR_NET_MESSAGE_NUM_FDS_MAX)]
    TooManyFds(u32),
    /// The header does not decode.
    #[error("decode packet header")]
    Header(#[source] xdr::Error),
    /// The body does not decode as the type the call expects.
    #[error("decode packet body")]
    Body(#[source] xdr::Error),
    /// The body does not encode.
    #[error("encode packet body")]
    Encode(#[source] xdr::Error),
}

/// Whether a message type carries a file-descriptor count after the header.
pub fn has_fds(kind: VirNetMessageType) -> bool {
    kind == VirNetMessageType::CALL_WITH_FDS || kind == VirNetMessageType::REPLY_WITH_FDS
}

/// One packet, with its body still encoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Packet {
    /// The header: program, procedure, type, serial, status.
    pub header: VirNetMessageHeader,
    /// The number of descriptors passed alongside, for `*_WITH_FDS` types only.
    pub fds: Option<u32>,
    /// XDR for calls, replies and messages; raw data for STREAM packets (never padded).
    pub body: Bytes,
}

impl Packet {
    /// A packet whose body is the XDR encoding of `body`.
    pub fn with_body<T: Xdr>(header: VirNetMessageHeader, body: &T) -> Result<Packet, PacketError> {
        let bytes = body.to_bytes().map_err(PacketError::Encode)?;
        Ok(Packet {
            header,
            fds: None,
            body: bytes.freeze(),
        })
    }

    /// The encoded size, length word included.
    pub fn encoded_len(&self) -> usize {
        LEN_SIZE + HEADER_SIZE + if self.fds.is_some() { 4 } else { 0 } + self.body.len()
    }

    /// Appends the packet, length word first.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), PacketError> {
        let total = self.encoded_len();
        if total > MAX_PACKET + LEN_SIZE {
            return Err(PacketError::TooLong(total as u64));
        }
        out.reserve(total);
        out.put_u32(total as u32);
        self.header.encode(out).map_err(PacketError::Encode)?;
        if has_fds(self.header.r#type) {
            out.put_u32(self.fds.unwrap_or(0));
        }
        out.put_slice(&self.body);
        Ok(())
    }

    /// Decodes exactly one packet that spans all of `frame`, length word included.
    pub fn decode(frame: Bytes) -> Result<Packet, PacketError> {
        let claimed = check_length(&frame)?.ok_or(PacketError::Truncated {
            claimed: LEN_SIZE,
            available: frame.len(),
        })?;
        if claimed != frame.len() {
            return Err(PacketError::Truncated {
                claimed,
                available: frame.len(),
            });
        }
        Self::decode_after_length(frame.slice(LEN_SIZE..))
    }

    fn decode_after_length(rest: Bytes) -> Result<Packet, PacketError> {
        let mut r = Reader::new(&rest);
        let header = VirNetMessageHeader::decode(&mut r).map_err(PacketError::Header)?;
        let fds = if has_fds(header.r#type) {
            let n = r.get_u32().map_err(PacketError::Header)?;
            if n > VIR_NET_MESSAGE_NUM_FDS_MAX {
                return Err(PacketError::TooManyFds(n));
            }
            Some(n)
        } else {
            None
        };
        let offset = r.position();
        Ok(Packet {
            header,
            fds,
            body: rest.slice(offset..),
        })
    }

    /// Decodes the body as `T`, which must span all of it.
    pub fn body<T: Xdr>(&self) -> Result<T, PacketError> {
        T::from_bytes(&self.body).map_err(PacketError::Body)
    }

    /// The error a packet with status ERROR carries.
    pub fn error(&self) -> Option<Result<VirNetMessageError, PacketError>> {
        (self.header.status == VirNetMessageStatus::ERROR).then(|| self.body())
    }
}

/// Reads and checks the length word; `None` when fewer than 4 bytes are present. The claimed
/// length is checked against libvirt's limits before anything is reserved for it.
fn check_length(buf: &[u8]) -> Result<Option<usize>, PacketError> {
    let Some(word) = buf.get(..LEN_SIZE) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
    if (len as usize) < LEN_SIZE + HEADER_SIZE {
        return Err(PacketError::TooShort(len));
    }
    if len as usize > MAX_PACKET + LEN_SIZE {
        return Err(PacketError::TooLong(u64::from(len)));
    }
    Ok(Some(len as usize))
}

/// tokio-util framing for libvirt packets.
#[derive(Debug, Default, Clone, Copy)]
pub struct PacketCodec;

impl tokio_util::codec::Decoder for PacketCodec {
    type Item = Packet;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Packet>, CodecError> {
        let Some(len) = check_length(src)? else {
            return Ok(None);
        };
        if src.len() < len {
            // Reserve only what the limit-checked length still needs.
            src.reserve(len - src.len());
            return Ok(None);
        }
        let mut frame = src.split_to(len).freeze();
        frame.advance(LEN_SIZE);
        Ok(Some(Packet::decode_after_length(frame)?))
    }
}

impl tokio_util::codec::Encoder<Packet> for PacketCodec {
    type Error = CodecError;

    fn encode(&mut self, item: Packet, dst: &mut BytesMut) -> Result<(), CodecError> {
        item.encode(dst)?;
        Ok(())
    }
}

impl tokio_util::codec::Encoder<&Packet> for PacketCodec {
    type Error = CodecError;

    fn encode(&mut self, item: &Packet, dst: &mut BytesMut) -> Result<(), CodecError> {
        item.encode(dst)?;
        Ok(())
    }
}

/// An error of the framed transport: I/O or a malformed packet.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Reading or writing the transport failed.
    #[error("read or write the connection")]
    Io(#[from] std::io::Error),
    /// A malformed packet.
    #[error(transparent)]
    Packet(#[from] PacketError),
}
