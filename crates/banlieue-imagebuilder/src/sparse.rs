//! Sequential writing of a disk image that leaves zero blocks as holes.
//!
//! Disk images are mostly empty: writing their zeros would fill the pool with blocks that the
//! guest never reads back differently from a hole. Data arrives in logical order; every aligned
//! [`ZERO_BLOCK`] of zeros becomes a seek, every other block is written at its offset.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The granularity of hole detection: aligned runs of this many zero bytes are not written.
pub const ZERO_BLOCK: usize = 4096;

/// Non-zero blocks are gathered up to this many bytes before one positioned write.
const STAGING_BYTES: usize = 1 << 20;

/// A static run of zeros, long enough to hash or compare a whole block at a time.
pub(crate) static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Receives a disk's logical content in order: data, or runs known to read as zeros.
///
/// Implementations must treat a zero run and the same number of zero bytes passed as data
/// identically; a zero run only spares the work of looking at them.
pub trait DiskSink {
    /// Appends `data` at the current logical offset.
    fn write_data(&mut self, data: &[u8]) -> io::Result<()>;
    /// Appends `len` bytes that read as zeros.
    fn write_zeros(&mut self, len: u64) -> io::Result<()>;
    /// The number of logical bytes appended so far.
    fn position(&self) -> u64;
}

/// Whether `bytes` are all zero; `memcmp` against [`ZEROS`] is fast even without optimisation.
pub(crate) fn is_zero(mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        let n = bytes.len().min(ZEROS.len());
        let (head, tail) = bytes.split_at(n);
        if head != &ZEROS[..n] {
            return false;
        }
        bytes = tail;
    }
    true
}

/// Writes a file sequentially, turning aligned zero blocks into holes.
///
/// The file must start empty (created or truncated): holes are never written, so stale content
/// under them would survive. [`SparseFile::finish`] sets the final length, so trailing zeros
/// are a hole too.
#[derive(Debug)]
pub struct SparseFile {
    file: File,
    /// The logical offset of `block`'s first byte; always a multiple of [`ZERO_BLOCK`].
    block_start: u64,
    /// The current, not yet full, block.
    block: Vec<u8>,
    /// Consecutive non-zero blocks waiting for one write at `staging_start`.
    staging: Vec<u8>,
    staging_start: u64,
}

impl SparseFile {
    /// Wraps an empty file opened for writing.
    pub fn new(file: File) -> Self {
        Self {
            file,
            block_start: 0,
            block: Vec::with_capacity(ZERO_BLOCK),
            staging: Vec::with_capacity(STAGING_BYTES),
            staging_start: 0,
        }
    }

    fn flush_staging(&mut self) -> io::Result<()> {
        if !self.staging.is_empty() {
            self.file.write_all_at(&self.staging, self.staging_start)?;
            self.staging.clear();
        }
        Ok(())
    }

    /// Takes one full block at `self.block_start`, then moves past it.
    fn push_block(&mut self, block: &[u8]) -> io::Result<()> {
        if is_zero(block) {
            self.flush_staging()?;
        } else {
            if self.staging.is_empty() {
                self.staging_start = self.block_start;
            }
            self.staging.extend_from_slice(block);
            if self.staging.len() >= STAGING_BYTES {
                self.flush_staging()?;
            }
        }
        self.block_start += block.len() as u64;
        Ok(())
    }

    /// Writes what is still buffered, sets the file's length to the logical size and returns
    /// the file and that size. Nothing is synced: the caller decides about durability.
    pub fn finish(mut self) -> io::Result<(File, u64)> {
        let size = self.position();
        if !is_zero(&self.block) {
            if self.staging.is_empty() {
                self.staging_start = self.block_start;
            }
            let block = std::mem::take(&mut self.block);
            self.staging.extend_from_slice(&block);
        }
        self.flush_staging()?;
        self.file.set_len(size)?;
        Ok((self.file, size))
    }
}

impl DiskSink for SparseFile {
    fn write_data(&mut self, mut data: &[u8]) -> io::Result<()> {
        if !self.block.is_empty() {
            let n = data.len().min(ZERO_BLOCK - self.block.len());
            let (head, tail) = data.split_at(n);
            self.block.extend_from_slice(head);
            data = tail;
            if self.block.len() == ZERO_BLOCK {
                let block = std::mem::take(&mut self.block);
                self.push_block(&block)?;
                self.block = block;
                self.block.clear();
            }
        }
        // Whole blocks straight from the caller's buffer, without copying them twice.
        let mut chunks = data.chunks_exact(ZERO_BLOCK);
        for block in &mut chunks {
            self.push_block(block)?;
        }
        self.block.extend_from_slice(chunks.remainder());
        Ok(())
    }

    fn write_zeros(&mut self, mut len: u64) -> io::Result<()> {
        if !self.block.is_empty() {
            let room = (ZERO_BLOCK - self.block.len()) as u64;
            let n = len.min(room);
            // n ≤ ZERO_BLOCK, so the cast cannot truncate.
            self.block.resize(self.block.len() + n as usize, 0);
            len -= n;
            if self.block.len() == ZERO_BLOCK {
                let block = std::mem::take(&mut self.block);
                self.push_block(&block)?;
                self.block = block;
                self.block.clear();
            }
        }
        if len == 0 {
            return Ok(());
        }
        let whole = len - len % ZERO_BLOCK as u64;
        if whole > 0 {
            self.flush_staging()?;
            self.block_start += whole;
        }
        // The remainder is < ZERO_BLOCK.
        self.block.resize((len - whole) as usize, 0);
        Ok(())
    }

    fn position(&self) -> u64 {
        self.block_start + self.block.len() as u64
    }
}

/// A sink that keeps everything in memory; for tests and small images.
#[derive(Debug, Default)]
pub struct VecSink(pub Vec<u8>);

impl DiskSink for VecSink {
    fn write_data(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn write_zeros(&mut self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.0.resize(self.0.len() + len, 0);
        Ok(())
    }

    fn position(&self) -> u64 {
        self.0.len() as u64
    }
}
