//! Streaming the laid-out image: the directory structures from memory, then each file's bytes
//! from its source through a fixed buffer, each padded to a whole sector.

use std::io::{self, Read, Write};

use bytes::Bytes;

use crate::layout::{PlacedFile, SECTOR_SIZE};
use crate::{Error, Image, Result};

/// File data moves through a buffer of this many bytes (16 sectors), whatever the file size.
const COPY_BUFFER_LEN: usize = 16 * SECTOR_SIZE;

/// The largest image [`Image::to_bytes`] assembles in memory.
pub const MAX_IN_MEMORY_IMAGE: u64 = 256 * 1024 * 1024;

static ZERO_SECTOR: [u8; SECTOR_SIZE] = [0; SECTOR_SIZE];

fn padding_after(size: u64) -> usize {
    // The remainder is below SECTOR_SIZE, so it fits any usize.
    ((SECTOR_SIZE as u64 - size % SECTOR_SIZE as u64) % SECTOR_SIZE as u64) as usize
}

fn short(file: &PlacedFile<impl Sized>, read: u64) -> Error {
    Error::SourceTooShort {
        path: file.path.clone(),
        declared: file.size,
        read,
    }
}

fn long(file: &PlacedFile<impl Sized>) -> Error {
    Error::SourceTooLong {
        path: file.path.clone(),
        declared: file.size,
    }
}

impl<S: Read> Image<S> {
    /// Writes the whole image to `out` and returns the number of bytes written.
    ///
    /// Memory use is the directory structures plus one 32 KiB buffer; each source is read
    /// exactly to its declared size (plus one probe read to detect a longer source).
    pub fn write_to<W: Write + ?Sized>(self, out: &mut W) -> Result<u64> {
        let total = self.size_bytes();
        out.write_all(&self.metadata)?;
        let mut buffer = vec![0u8; COPY_BUFFER_LEN];
        for mut file in self.files {
            let mut copied = 0u64;
            while copied < file.size {
                let want = (file.size - copied).min(COPY_BUFFER_LEN as u64) as usize;
                let got = match file.source.read(&mut buffer[..want]) {
                    Ok(0) => return Err(short(&file, copied)),
                    Ok(got) => got,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                };
                out.write_all(&buffer[..got])?;
                copied += got as u64;
            }
            loop {
                match file.source.read(&mut buffer[..1]) {
                    Ok(0) => break,
                    Ok(_) => return Err(long(&file)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            out.write_all(&ZERO_SECTOR[..padding_after(file.size)])?;
        }
        out.flush()?;
        Ok(total)
    }

    /// The whole image in memory, for small images such as cloud-init seeds; refuses images
    /// over [`MAX_IN_MEMORY_IMAGE`].
    pub fn to_bytes(self) -> Result<Bytes> {
        let size = self.size_bytes();
        if size > MAX_IN_MEMORY_IMAGE {
            return Err(Error::ImageTooLarge {
                bytes: size,
                max: MAX_IN_MEMORY_IMAGE,
            });
        }
        let mut image = Vec::with_capacity(size as usize);
        self.write_to(&mut image)?;
        Ok(Bytes::from(image))
    }
}

#[cfg(feature = "tokio")]
impl<S: tokio::io::AsyncRead + Unpin> Image<S> {
    /// Writes the whole image to an async writer; the same guarantees as
    /// [`Image::write_to`].
    pub async fn write_to_async<W: tokio::io::AsyncWrite + Unpin + ?Sized>(
        self,
        out: &mut W,
    ) -> Result<u64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let total = self.size_bytes();
        out.write_all(&self.metadata).await?;
        let mut buffer = vec![0u8; COPY_BUFFER_LEN];
        for mut file in self.files {
            let mut copied = 0u64;
            while copied < file.size {
                let want = (file.size - copied).min(COPY_BUFFER_LEN as u64) as usize;
                let got = match file.source.read(&mut buffer[..want]).await {
                    Ok(0) => return Err(short(&file, copied)),
                    Ok(got) => got,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                };
                out.write_all(&buffer[..got]).await?;
                copied += got as u64;
            }
            loop {
                match file.source.read(&mut buffer[..1]).await {
                    Ok(0) => break,
                    Ok(_) => return Err(long(&file)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            out.write_all(&ZERO_SECTOR[..padding_after(file.size)])
                .await?;
        }
        out.flush().await?;
        Ok(total)
    }
}
