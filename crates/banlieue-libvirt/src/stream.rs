//! Data streams (volume upload and download): packets of the call's serial with type STREAM
//! carry data (never padded), STREAM_HOLE carries a hole length, status OK ends a stream and
//! status ERROR aborts it. Memory stays one packet per direction whatever the volume size.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeek, AsyncSeekExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::client::Client;
use crate::error::{Error, RemoteError, Result};
use crate::packet::Packet;
use crate::proto::net::{
    VirNetMessageError, VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType,
    VirNetStreamHole,
};
use crate::proto::remote::{self, procedures as rp};
use crate::xdr::{Procedure, Xdr};

/// The largest data chunk of one stream packet (`VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX`), which
/// every libvirtd accepts.
pub const STREAM_CHUNK: usize = crate::proto::net::VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX as usize;

/// Zero runs shorter than this are sent as data: a hole packet per tiny run would cost more.
const MIN_HOLE: usize = 64 * 1024;

/// What one stream packet from the server means.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum StreamEvent {
    /// Data, in order.
    Data(Bytes),
    /// A run of zeros of this many bytes (sparse streams).
    Hole(u64),
    /// The server has no more data (an empty CONTINUE packet).
    Eof,
    /// The server confirmed the end of the stream (status OK).
    Finished,
}

/// Interprets a stream packet from the server (sans-io).
pub(crate) fn stream_event(p: &Packet) -> Result<StreamEvent> {
    match (p.header.r#type, p.header.status) {
        (_, VirNetMessageStatus::ERROR) => {
            let err: VirNetMessageError = p.body()?;
            Err(Error::from(RemoteError::from(err)))
        }
        (VirNetMessageType::STREAM_HOLE, _) => {
            let hole: VirNetStreamHole = p.body()?;
            u64::try_from(hole.length)
                .map(StreamEvent::Hole)
                .map_err(|_| Error::Protocol(format!("negative hole length {}", hole.length)))
        }
        (_, VirNetMessageStatus::OK) => Ok(StreamEvent::Finished),
        (_, VirNetMessageStatus::CONTINUE) if p.body.is_empty() => Ok(StreamEvent::Eof),
        (_, VirNetMessageStatus::CONTINUE) => Ok(StreamEvent::Data(p.body.clone())),
        (_, status) => Err(Error::Protocol(format!(
            "stream packet with status {status:?}"
        ))),
    }
}

/// An open stream, tied to the serial of the call that opened it. The volume transfers of
/// [`StorageVol`](crate::StorageVol) drive one; `open` is for the other stream procedures.
///
/// ```no_run
/// # async fn demo(client: banlieue_libvirt::Client, vol: banlieue_libvirt::StorageVol) -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::proto::remote::{self, procedures as rp};
/// use banlieue_libvirt::stream::{DataStream, StreamEvent};
///
/// let args = remote::RemoteStorageVolDownloadArgs {
///     vol: vol.raw().clone(),
///     offset: 0,
///     length: 4096,
///     flags: 0,
/// };
/// let ((), mut stream) = DataStream::open::<rp::StorageVolDownload>(&client, &args).await?;
/// while let StreamEvent::Data(chunk) = stream.recv().await? {
///     println!("{} bytes", chunk.len());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DataStream {
    client: Client,
    program: u32,
    version: u32,
    procedure: i32,
    serial: u32,
    incoming: mpsc::Receiver<Result<Packet>>,
    done: bool,
}

impl DataStream {
    /// Calls stream procedure `P` and returns its reply and the stream it opened.
    pub async fn open<P: Procedure>(
        client: &Client,
        args: &P::Args,
    ) -> Result<(P::Ret, DataStream)> {
        let (tx, rx) = mpsc::channel(client.options().stream_buffer.max(1));
        let (reply, serial) = client
            .raw_call::<P>(args, client.options().call_timeout, Some(tx))
            .await?;
        let ret = reply.body::<P::Ret>()?;
        let stream = DataStream {
            client: client.clone(),
            program: P::PROGRAM,
            version: P::VERSION,
            procedure: P::NUMBER,
            serial,
            incoming: rx,
            done: false,
        };
        Ok((ret, stream))
    }

    fn packet(&self, kind: VirNetMessageType, status: VirNetMessageStatus, body: Bytes) -> Packet {
        Packet {
            header: VirNetMessageHeader {
                prog: self.program,
                vers: self.version,
                r#proc: self.procedure,
                r#type: kind,
                serial: self.serial,
                status,
            },
            fds: None,
            body,
        }
    }

    /// A server-side error that arrived while we were sending.
    fn pending_error(&mut self) -> Result<()> {
        while let Ok(p) = self.incoming.try_recv() {
            if let StreamEvent::Finished = stream_event(&p?)? {
                return Err(Error::Protocol("the server ended the stream early".into()));
            }
        }
        Ok(())
    }

    /// Sends a chunk of data (at most [`STREAM_CHUNK`] bytes for any libvirtd to take it).
    pub async fn send_data(&mut self, data: Bytes) -> Result<()> {
        self.pending_error()?;
        let p = self.packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::CONTINUE,
            data,
        );
        self.client.send(p).await
    }

    /// Sends a hole of `length` bytes (the stream must have been opened sparse).
    pub async fn send_hole(&mut self, length: u64) -> Result<()> {
        self.pending_error()?;
        let hole = VirNetStreamHole {
            length: length as i64,
            flags: 0,
        };
        let body = hole.to_bytes().map_err(Error::Encode)?.freeze();
        let p = self.packet(
            VirNetMessageType::STREAM_HOLE,
            VirNetMessageStatus::CONTINUE,
            body,
        );
        self.client.send(p).await
    }

    /// The next thing the server sent.
    pub async fn recv(&mut self) -> Result<StreamEvent> {
        match self.incoming.recv().await {
            Some(p) => stream_event(&p?),
            None => Err(Error::ConnectionLost("the stream was closed".into())),
        }
    }

    async fn await_finished(&mut self) -> Result<()> {
        let timeout = self
            .client
            .options()
            .call_timeout
            .unwrap_or(Duration::from_secs(3600));
        let wait = async {
            loop {
                match self.recv().await? {
                    StreamEvent::Finished => return Ok(()),
                    StreamEvent::Eof | StreamEvent::Data(_) | StreamEvent::Hole(_) => continue,
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| Error::Timeout {
                procedure: "stream finish",
                after: timeout,
            })?
    }

    /// Ends a stream we wrote: sends OK and waits for the server to confirm it has
    /// everything (or to report why not).
    pub async fn finish(mut self) -> Result<()> {
        self.pending_error()?;
        let p = self.packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::OK,
            Bytes::new(),
        );
        self.client.send(p).await?;
        let r = self.await_finished().await;
        self.done = true;
        r
    }

    /// Aborts the stream (status ERROR); the server discards what it received.
    pub async fn abort(mut self) -> Result<()> {
        self.done = true;
        let p = self.packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::ERROR,
            Bytes::new(),
        );
        self.client.send(p).await
    }

    /// Answers the server's end-of-data with OK and waits for its confirmation.
    async fn acknowledge_eof(&mut self) -> Result<()> {
        let p = self.packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::OK,
            Bytes::new(),
        );
        self.client.send(p).await?;
        self.await_finished().await?;
        self.done = true;
        Ok(())
    }
}

impl Drop for DataStream {
    fn drop(&mut self) {
        self.client.end_stream(self.serial);
        if !self.done {
            let p = self.packet(
                VirNetMessageType::STREAM,
                VirNetMessageStatus::ERROR,
                Bytes::new(),
            );
            let client = self.client.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = client.send(p).await;
                });
            }
        }
    }
}

/// Bytes moved by a transfer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes of data sent or received.
    pub data: u64,
    /// Bytes skipped as holes.
    pub holes: u64,
}

impl Transfer {
    /// Counts `data` bytes and `holes` bytes more from the server (sans-io). Fails, rather than
    /// wrapping or panicking, when a total overflows, and when data and holes together pass
    /// `limit` (0: no limit), so a server cannot push more into a sink than was asked for.
    pub fn receive(self, data: u64, holes: u64, limit: u64) -> Result<Transfer> {
        let overflow = || Error::Protocol("the stream's data and hole lengths overflow".into());
        let next = Transfer {
            data: self.data.checked_add(data).ok_or_else(overflow)?,
            holes: self.holes.checked_add(holes).ok_or_else(overflow)?,
        };
        let sum = next.data.checked_add(next.holes).ok_or_else(overflow)?;
        if limit != 0 && sum > limit {
            return Err(Error::Protocol(format!(
                "the server sent {sum} bytes, more than the {limit} asked for"
            )));
        }
        Ok(next)
    }
}

/// How a volume transfer runs: which bytes it moves, whether runs of zeros travel as holes,
/// and who hears of its progress. The one options value of
/// [`StorageVol::upload`](crate::StorageVol::upload) and the downloads.
///
/// ```
/// use banlieue_libvirt::stream::TransferOptions;
///
/// let mut moved = 0;
/// let options = TransferOptions::new()
///     .offset(1 << 20)
///     .length(64 << 20)
///     .sparse(true)
///     .progress(|t| moved = t.data + t.holes);
/// # drop(options);
/// ```
#[derive(Default)]
pub struct TransferOptions<'a> {
    offset: u64,
    length: u64,
    sparse: bool,
    progress: Option<Box<dyn FnMut(Transfer) + Send + 'a>>,
}

impl std::fmt::Debug for TransferOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferOptions")
            .field("offset", &self.offset)
            .field("length", &self.length)
            .field("sparse", &self.sparse)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl<'a> TransferOptions<'a> {
    /// The whole volume from its first byte, not sparse, nobody told of progress.
    pub fn new() -> TransferOptions<'a> {
        TransferOptions::default()
    }

    /// Starts at byte `offset` of the volume.
    pub fn offset(mut self, offset: u64) -> TransferOptions<'a> {
        self.offset = offset;
        self
    }

    /// Moves `length` bytes (0, the default: to the end). An upload tells the server to expect
    /// exactly that many and reads no more from its source; a download fails, before its sink
    /// sees them, on data or holes past it, so a read of a small volume stays small whatever
    /// the server sends.
    pub fn length(mut self, length: u64) -> TransferOptions<'a> {
        self.length = length;
        self
    }

    /// A sparse stream (`VIR_STORAGE_VOL_{UPLOAD,DOWNLOAD}_SPARSE_STREAM`): zero runs of at
    /// least 64 KiB go up as holes; holes come down as lengths, written as zeros into a plain
    /// sink and as holes into a file.
    pub fn sparse(mut self, sparse: bool) -> TransferOptions<'a> {
        self.sparse = sparse;
        self
    }

    /// Calls `progress` after every packet with the running total.
    pub fn progress(mut self, progress: impl FnMut(Transfer) + Send + 'a) -> TransferOptions<'a> {
        self.progress = Some(Box::new(progress));
        self
    }

    fn report(&mut self, total: Transfer) {
        if let Some(progress) = self.progress.as_mut() {
            progress(total);
        }
    }

    fn flags(&self) -> u32 {
        // Upload and download name the same bit: VIR_STORAGE_VOL_{UPLOAD,DOWNLOAD}_SPARSE_STREAM.
        u32::from(self.sparse)
    }
}

/// Uploads what `source` yields into `vol` (STORAGE_VOL_UPLOAD).
pub(crate) async fn upload<R: AsyncRead + Unpin>(
    client: &Client,
    vol: &remote::RemoteNonnullStorageVol,
    source: &mut R,
    mut options: TransferOptions<'_>,
) -> Result<Transfer> {
    let length = options.length;
    let mut limited = source.take(if length == 0 { u64::MAX } else { length });
    let source = &mut limited;
    let args = remote::RemoteStorageVolUploadArgs {
        vol: vol.clone(),
        offset: options.offset,
        length,
        flags: options.flags(),
    };
    let ((), mut stream) = DataStream::open::<rp::StorageVolUpload>(client, &args).await?;
    let mut total = Transfer::default();
    let mut buf = BytesMut::with_capacity(STREAM_CHUNK);
    loop {
        buf.clear();
        buf.resize(STREAM_CHUNK, 0);
        let n = match read_full(source, &mut buf).await {
            Ok(n) => n,
            Err(e) => {
                let _ = stream.abort().await;
                return Err(Error::StreamIo(e));
            }
        };
        if n == 0 {
            break;
        }
        buf.truncate(n);
        let chunk = buf.split().freeze();
        if options.sparse {
            for (is_hole, range) in split_holes(&chunk, MIN_HOLE) {
                if is_hole {
                    stream.send_hole(range.len() as u64).await?;
                    total.holes += range.len() as u64;
                } else {
                    stream.send_data(chunk.slice(range.clone())).await?;
                    total.data += range.len() as u64;
                }
            }
        } else {
            total.data += chunk.len() as u64;
            stream.send_data(chunk).await?;
        }
        options.report(total);
    }
    stream.finish().await?;
    Ok(total)
}

/// Downloads `vol` (STORAGE_VOL_DOWNLOAD) into `sink`, holes written as zeros.
pub(crate) async fn download<W: AsyncWrite + Unpin>(
    client: &Client,
    vol: &remote::RemoteNonnullStorageVol,
    sink: &mut W,
    options: TransferOptions<'_>,
) -> Result<Transfer> {
    download_into(client, vol, &mut ZeroFill(sink), options).await
}

/// [`download`] into a seekable sink, such as a new or truncated file: holes become seeks, so
/// the file on disk is sparse where the volume is. The sink must read as zeros where it is
/// skipped (a fresh file does; one with old data does not).
pub(crate) async fn download_seeking<W: AsyncWrite + AsyncSeek + Unpin>(
    client: &Client,
    vol: &remote::RemoteNonnullStorageVol,
    sink: &mut W,
    options: TransferOptions<'_>,
) -> Result<Transfer> {
    let mut sink = Seeking {
        inner: sink,
        ends_in_hole: false,
    };
    download_into(client, vol, &mut sink, options).await
}

/// [`download`] into a file, written by a blocking thread of its own so that disk writes
/// overlap with receiving: data chunks move to it without a copy, holes become seeks (sparse,
/// the file has holes where the volume does). The file is truncated first.
pub(crate) async fn download_to_file(
    client: &Client,
    vol: &remote::RemoteNonnullStorageVol,
    file: std::fs::File,
    options: TransferOptions<'_>,
) -> Result<Transfer> {
    let (tx, rx) = mpsc::channel::<FileOp>(FILE_QUEUE);
    let writer = tokio::task::spawn_blocking(move || write_file(file, rx));
    let mut sink = FileSink { ops: tx };
    let received = download_into(client, vol, &mut sink, options).await;
    drop(sink);
    let written = writer
        .await
        .map_err(|e| Error::StreamIo(std::io::Error::other(e)))?;
    // A write error ends the writer, which makes the download fail to hand it a chunk: report
    // the write error, the cause.
    match (received, written) {
        (_, Err(e)) => Err(Error::StreamIo(e)),
        (r, Ok(())) => r,
    }
}

/// Chunks queued for the file writer (at most 16 packets, 4 MiB).
const FILE_QUEUE: usize = 16;

enum FileOp {
    Data(Bytes),
    Hole(u64),
    End,
}

fn write_file(mut file: std::fs::File, mut ops: mpsc::Receiver<FileOp>) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    let mut ends_in_hole = false;
    while let Some(op) = ops.blocking_recv() {
        match op {
            FileOp::Data(d) => {
                file.write_all(&d)?;
                ends_in_hole = false;
            }
            FileOp::Hole(0) => {}
            FileOp::Hole(n) => {
                let n = i64::try_from(n).map_err(|_| std::io::Error::other("hole too long"))?;
                file.seek(SeekFrom::Current(n))?;
                ends_in_hole = true;
            }
            FileOp::End => {
                if ends_in_hole {
                    file.seek(SeekFrom::Current(-1))?;
                    file.write_all(&[0])?;
                }
                return file.flush();
            }
        }
    }
    // The download failed before its end: what was written stays, the caller has the error.
    Ok(())
}

struct FileSink {
    ops: mpsc::Sender<FileOp>,
}

impl FileSink {
    async fn send(&self, op: FileOp) -> std::io::Result<()> {
        self.ops
            .send(op)
            .await
            .map_err(|_| std::io::Error::other("the file writer stopped"))
    }
}

impl DownloadSink for FileSink {
    async fn data(&mut self, data: Bytes) -> std::io::Result<()> {
        self.send(FileOp::Data(data)).await
    }

    async fn hole(&mut self, len: u64) -> std::io::Result<()> {
        self.send(FileOp::Hole(len)).await
    }

    async fn end(&mut self) -> std::io::Result<()> {
        self.send(FileOp::End).await
    }
}

/// Where downloaded data and holes go.
trait DownloadSink {
    async fn data(&mut self, data: Bytes) -> std::io::Result<()>;
    async fn hole(&mut self, len: u64) -> std::io::Result<()>;
    async fn end(&mut self) -> std::io::Result<()>;
}

/// Holes written out as zeros, for sinks that cannot seek.
struct ZeroFill<'a, W>(&'a mut W);

impl<W: AsyncWrite + Unpin> DownloadSink for ZeroFill<'_, W> {
    async fn data(&mut self, data: Bytes) -> std::io::Result<()> {
        self.0.write_all(&data).await
    }

    async fn hole(&mut self, mut len: u64) -> std::io::Result<()> {
        static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
        while len > 0 {
            let n = len.min(ZEROS.len() as u64) as usize;
            self.0.write_all(&ZEROS[..n]).await?;
            len -= n as u64;
        }
        Ok(())
    }

    async fn end(&mut self) -> std::io::Result<()> {
        self.0.flush().await
    }
}

/// Holes skipped by seeking.
struct Seeking<'a, W> {
    inner: &'a mut W,
    ends_in_hole: bool,
}

impl<W: AsyncWrite + AsyncSeek + Unpin> DownloadSink for Seeking<'_, W> {
    async fn data(&mut self, data: Bytes) -> std::io::Result<()> {
        self.ends_in_hole = false;
        self.inner.write_all(&data).await
    }

    async fn hole(&mut self, len: u64) -> std::io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let len = i64::try_from(len).map_err(|_| std::io::Error::other("hole too long"))?;
        self.inner.seek(std::io::SeekFrom::Current(len)).await?;
        self.ends_in_hole = true;
        Ok(())
    }

    async fn end(&mut self) -> std::io::Result<()> {
        // A file is only as long as its last write: a trailing hole needs one byte at its end.
        if self.ends_in_hole {
            self.inner.seek(std::io::SeekFrom::Current(-1)).await?;
            self.inner.write_all(&[0]).await?;
        }
        self.inner.flush().await
    }
}

async fn download_into(
    client: &Client,
    vol: &remote::RemoteNonnullStorageVol,
    sink: &mut impl DownloadSink,
    mut options: TransferOptions<'_>,
) -> Result<Transfer> {
    let length = options.length;
    let args = remote::RemoteStorageVolDownloadArgs {
        vol: vol.clone(),
        offset: options.offset,
        length,
        flags: options.flags(),
    };
    let ((), mut stream) = DataStream::open::<rp::StorageVolDownload>(client, &args).await?;
    let mut total = Transfer::default();
    loop {
        match stream.recv().await? {
            StreamEvent::Data(d) => {
                total = total.receive(d.len() as u64, 0, length)?;
                sink.data(d).await.map_err(Error::StreamIo)?;
            }
            StreamEvent::Hole(len) => {
                total = total.receive(0, len, length)?;
                sink.hole(len).await.map_err(Error::StreamIo)?;
            }
            StreamEvent::Eof => {
                stream.acknowledge_eof().await?;
                break;
            }
            StreamEvent::Finished => {
                stream.done = true;
                break;
            }
        }
        options.report(total);
    }
    sink.end().await.map_err(Error::StreamIo)?;
    Ok(total)
}

async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = r.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// Splits `data` into alternating data and zero runs; zero runs shorter than `min_hole` are
/// folded into the data around them. Sans-io, so the rule is tested on its own.
pub(crate) fn split_holes(data: &[u8], min_hole: usize) -> Vec<(bool, std::ops::Range<usize>)> {
    const GRAIN: usize = 4096;
    let mut runs: Vec<(bool, std::ops::Range<usize>)> = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let end = (at + GRAIN).min(data.len());
        let zero = data[at..end].iter().all(|&b| b == 0);
        match runs.last_mut() {
            Some((z, r)) if *z == zero => r.end = end,
            _ => runs.push((zero, at..end)),
        }
        at = end;
    }
    let mut merged: Vec<(bool, std::ops::Range<usize>)> = Vec::new();
    for (zero, r) in runs {
        let zero = zero && r.len() >= min_hole;
        match merged.last_mut() {
            Some((z, last)) if *z == zero => last.end = r.end,
            _ => merged.push((zero, r)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_are_found_and_small_ones_folded() {
        let mut data = vec![1u8; 4096];
        data.extend(vec![0u8; 128 * 1024]);
        data.extend(vec![2u8; 10]);
        data.extend(vec![0u8; 8192]);
        data.extend(vec![3u8; 4096]);
        let runs = split_holes(&data, MIN_HOLE);
        assert_eq!(
            runs,
            vec![
                (false, 0..4096),
                (true, 4096..4096 + 131072),
                (false, 135168..data.len())
            ]
        );
        assert_eq!(split_holes(&[], MIN_HOLE), vec![]);
        assert_eq!(split_holes(&[0; 100], MIN_HOLE), vec![(false, 0..100)]);
    }

    #[test]
    fn received_lengths_are_checked_not_wrapped() {
        let huge = i64::MAX as u64;
        let t = Transfer::default().receive(0, huge, 0).expect("one hole");
        let t = t.receive(0, huge, 0).expect("two holes still fit in u64");
        let e = t.receive(0, huge, 0).expect_err("three overflow");
        assert!(e.to_string().contains("overflow"), "{e}");
        let e = Transfer::default()
            .receive(1, 0, 0)
            .and_then(|t| t.receive(0, u64::MAX, 0))
            .expect_err("data plus holes overflow");
        assert!(e.to_string().contains("overflow"), "{e}");
        let t = Transfer::default()
            .receive(4000, 96, 4096)
            .expect("exactly the limit");
        let e = t.receive(1, 0, 4096).expect_err("one byte more");
        assert!(
            e.to_string().contains("more than the 4096 asked for"),
            "{e}"
        );
    }

    fn packet(kind: VirNetMessageType, status: VirNetMessageStatus, body: Bytes) -> Packet {
        Packet {
            header: VirNetMessageHeader {
                prog: 1,
                vers: 1,
                r#proc: 209,
                r#type: kind,
                serial: 5,
                status,
            },
            fds: None,
            body,
        }
    }

    #[test]
    fn stream_packets_mean_what_libvirt_says() {
        let data = packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::CONTINUE,
            Bytes::from_static(b"abc"),
        );
        assert_eq!(
            stream_event(&data).expect("data"),
            StreamEvent::Data(Bytes::from_static(b"abc"))
        );
        let eof = packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::CONTINUE,
            Bytes::new(),
        );
        assert_eq!(stream_event(&eof).expect("eof"), StreamEvent::Eof);
        let ok = packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::OK,
            Bytes::new(),
        );
        assert_eq!(stream_event(&ok).expect("ok"), StreamEvent::Finished);
        let hole = VirNetStreamHole {
            length: 1 << 30,
            flags: 0,
        }
        .to_bytes()
        .expect("encodes")
        .freeze();
        let hole = packet(
            VirNetMessageType::STREAM_HOLE,
            VirNetMessageStatus::CONTINUE,
            hole,
        );
        assert_eq!(
            stream_event(&hole).expect("hole"),
            StreamEvent::Hole(1 << 30)
        );
        let err = VirNetMessageError {
            code: 38,
            message: Some("disk full".into()),
            ..Default::default()
        };
        let err = packet(
            VirNetMessageType::STREAM,
            VirNetMessageStatus::ERROR,
            err.to_bytes().expect("encodes").freeze(),
        );
        let e = stream_event(&err).expect_err("error");
        assert!(e.to_string().contains("disk full"), "{e}");
    }
}
