//! A `Read` over a zstd stream of any number of frames.
//!
//! The decoder is `ruzstd`, a pure-Rust implementation, rather than the `zstd` crate's binding
//! to the C library: every byte it decodes comes from a registry the operator does not control
//! (layers, artifact blobs, qcow2 clusters), and a memory-safe decoder bounds what a crafted
//! stream can do to the process; it also builds with no C toolchain. It is slower than libzstd,
//! which matters little next to the download. Its window limit (128 MiB by default) bounds the
//! memory a frame header can ask for.
//!
//! `ruzstd::StreamingDecoder` reads one frame; layers compressed by several threads, and
//! `zstd:chunked` layers, hold several frames and skippable frames, so this reader starts a
//! new frame at each frame boundary and skips skippable ones.

use std::io::{self, BufRead, Read};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

/// Decodes the concatenated zstd frames of `source`.
pub struct ZstdFrames<R: BufRead> {
    source: R,
    decoder: FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> std::fmt::Debug for ZstdFrames<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZstdFrames")
            .field("in_frame", &self.in_frame)
            .finish_non_exhaustive()
    }
}

impl<R: BufRead> ZstdFrames<R> {
    /// A decoder that has not read anything yet.
    pub fn new(source: R) -> Self {
        Self {
            source,
            decoder: FrameDecoder::new(),
            in_frame: false,
        }
    }
}

fn invalid(e: FrameDecoderError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if self.source.fill_buf()?.is_empty() {
                    return Ok(0);
                }
                match self.decoder.reset(&mut self.source) {
                    Ok(()) => self.in_frame = true,
                    Err(FrameDecoderError::ReadFrameHeaderError(
                        ReadFrameHeaderError::SkipFrame { length, .. },
                    )) => {
                        let skipped =
                            io::copy(&mut (&mut self.source).take(length.into()), &mut io::sink())?;
                        if skipped != u64::from(length) {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "zstd skippable frame runs past the end of the stream",
                            ));
                        }
                    }
                    Err(e) => return Err(invalid(e)),
                }
                continue;
            }
            if self.decoder.can_collect() > 0 {
                return self.decoder.read(buf);
            }
            if self.decoder.is_finished() {
                self.in_frame = false;
                continue;
            }
            self.decoder
                .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                .map_err(invalid)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruzstd::encoding::{CompressionLevel, compress_to_vec};

    #[test]
    fn decodes_several_frames_and_skips_skippable_ones() {
        let a: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let b = b"second frame".to_vec();
        let mut stream = compress_to_vec(&a[..], CompressionLevel::Fastest);
        // A skippable frame: magic 0x184D2A5?, little-endian length, payload.
        stream.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        stream.extend_from_slice(&3u32.to_le_bytes());
        stream.extend_from_slice(b"xyz");
        stream.extend_from_slice(&compress_to_vec(&b[..], CompressionLevel::Fastest));
        let mut out = Vec::new();
        ZstdFrames::new(&stream[..]).read_to_end(&mut out).unwrap();
        let mut expected = a;
        expected.extend_from_slice(&b);
        assert_eq!(out, expected);
    }

    #[test]
    fn garbage_is_invalid_data() {
        let mut out = Vec::new();
        let err = ZstdFrames::new(&b"not zstd at all"[..])
            .read_to_end(&mut out)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
