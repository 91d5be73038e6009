//! The SHA-256 of a raw disk image, computed on a thread of its own beside the conversion.
//!
//! An artifact's digest covers every byte of the raw image, holes included: the libvirt
//! import's completion record compares it. Hashing 2 GiB takes longer than converting them, so
//! on the conversion thread it doubled the time of a build whenever the cores were busy. The
//! conversion now hands its data to a [`HashThread`] in buffers of [`CHUNK`] bytes, at most
//! [`BUFFERS`] of them in flight (back-pressure: the converter waits for a buffer rather than
//! allocate a new one), and zero runs as lengths, which the thread feeds from a static zero
//! block. [`RawDigest`] is the thread's sans-io core.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

use crate::artifact::hex;
use crate::sparse::ZEROS;

/// The size of one buffer of data handed to the hashing thread.
pub const CHUNK: usize = 1 << 20;

/// At most this many buffers exist per [`HashThread`]: its memory stays under
/// `BUFFERS * CHUNK` bytes however far the conversion runs ahead.
pub const BUFFERS: usize = 4;

/// Why the digest could not be computed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HashError {
    /// The operating system refused a thread.
    #[error("start the hashing thread")]
    Spawn(#[source] io::Error),
    /// The hashing thread ended before the end of the content; the text says how.
    #[error("hash the content: the hashing thread stopped early ({0})")]
    Stopped(String),
}

/// What the hashing thread feeds its bytes to, in order.
pub trait Absorb: Send + 'static {
    /// What [`Absorb::finish`] gives.
    type Output: Send + 'static;
    /// Takes the next `bytes` of the content.
    fn absorb(&mut self, bytes: &[u8]);
    /// The result over everything absorbed.
    fn finish(self) -> Self::Output;
}

/// The SHA-256 and length of a raw image fed as data and zero runs; no I/O, no threads.
#[derive(Debug, Clone, Default)]
pub struct RawDigest {
    sha: Sha256,
    len: u64,
}

/// What a [`RawDigest`] comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digested {
    /// The number of bytes hashed.
    pub len: u64,
    /// Lower-case hex SHA-256 of them.
    pub sha256: String,
}

impl RawDigest {
    /// Appends `data`.
    pub fn data(&mut self, data: &[u8]) {
        self.sha.update(data);
        self.len += data.len() as u64;
    }

    /// Appends `len` zero bytes, from a static block rather than a buffer of their size.
    pub fn zeros(&mut self, mut len: u64) {
        while len > 0 {
            let n = zero_piece(len);
            self.data(ZEROS.get(..n).unwrap_or_default());
            len -= n as u64;
        }
    }
}

/// The length of the next piece of a zero run of `len` bytes: at most [`ZEROS`]'s.
fn zero_piece(len: u64) -> usize {
    // The minimum is at most ZEROS.len(), so the cast cannot truncate.
    len.min(ZEROS.len() as u64) as usize
}

impl Absorb for RawDigest {
    type Output = Digested;

    fn absorb(&mut self, bytes: &[u8]) {
        self.data(bytes);
    }

    fn finish(self) -> Digested {
        Digested {
            len: self.len,
            sha256: hex(&self.sha.finalize()),
        }
    }
}

/// What the producer sends, in content order.
enum Piece {
    Data(Vec<u8>),
    Zeros(u64),
}

/// An [`Absorb`] running on its own thread, fed in content order by [`HashThread::data`] and
/// [`HashThread::zeros`].
///
/// Dropping it without [`HashThread::finish`] stops the thread promptly (within one buffer or
/// one zero block) and waits for it.
#[derive(Debug)]
pub struct HashThread<H: Absorb = RawDigest> {
    /// `None` once closed.
    queue: Option<SyncSender<Piece>>,
    /// Buffers the thread has finished with.
    spare: Receiver<Vec<u8>>,
    /// Buffers created so far, at most [`BUFFERS`].
    allocated: usize,
    /// Data not yet sent; no capacity when no buffer is held.
    filling: Vec<u8>,
    /// Zeros that follow `filling`, not yet sent.
    zeros: u64,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Option<H::Output>>>,
}

impl HashThread<RawDigest> {
    /// Starts a thread computing the SHA-256 of what it is given.
    pub fn sha256() -> Result<Self, HashError> {
        Self::spawn(RawDigest::default())
    }
}

impl<H: Absorb> HashThread<H> {
    /// Starts a thread feeding `absorb`.
    pub fn spawn(absorb: H) -> Result<Self, HashError> {
        // Every piece holds a buffer or stands between two that do, so this bound never holds
        // the producer up before the buffer pool does, yet caps the queue.
        let (queue, pieces) = mpsc::sync_channel(2 * BUFFERS + 1);
        let (give_back, spare) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("artifact-sha256".to_owned())
            .spawn(move || run(absorb, &pieces, &give_back, &thread_stop))
            .map_err(HashError::Spawn)?;
        Ok(Self {
            queue: Some(queue),
            spare,
            allocated: 0,
            filling: Vec::new(),
            zeros: 0,
            stop,
            thread: Some(thread),
        })
    }

    /// Appends `data`, copying it into a buffer; waits for one when [`BUFFERS`] are in flight.
    pub fn data(&mut self, mut data: &[u8]) -> Result<(), HashError> {
        if data.is_empty() {
            return Ok(());
        }
        if self.zeros > 0 {
            self.send_filling()?;
            let zeros = std::mem::take(&mut self.zeros);
            self.send(Piece::Zeros(zeros))?;
        }
        while !data.is_empty() {
            if self.filling.capacity() == 0 {
                self.filling = self.buffer()?;
            }
            let room = CHUNK.saturating_sub(self.filling.len());
            let (head, tail) = data.split_at(room.min(data.len()));
            self.filling.extend_from_slice(head);
            data = tail;
            if self.filling.len() >= CHUNK {
                self.send_filling()?;
            }
        }
        Ok(())
    }

    /// Appends `len` zero bytes; nothing is copied, and consecutive runs are sent as one.
    pub fn zeros(&mut self, len: u64) -> Result<(), HashError> {
        match self.zeros.checked_add(len) {
            Some(total) => self.zeros = total,
            None => {
                self.send_filling()?;
                let zeros = std::mem::replace(&mut self.zeros, len);
                self.send(Piece::Zeros(zeros))?;
            }
        }
        Ok(())
    }

    /// Sends what is pending, waits for the thread to absorb everything and returns its
    /// result.
    pub fn finish(mut self) -> Result<H::Output, HashError> {
        self.send_filling()?;
        if self.zeros > 0 {
            let zeros = std::mem::take(&mut self.zeros);
            self.send(Piece::Zeros(zeros))?;
        }
        // Closing the queue is the end of the content.
        self.queue = None;
        match self.join() {
            Ok(Some(output)) => Ok(output),
            Ok(None) => Err(HashError::Stopped("it was cancelled".to_owned())),
            Err(e) => Err(e),
        }
    }

    /// A cleared buffer: a spare one, a new one while fewer than [`BUFFERS`] exist, or else
    /// the next one the thread gives back.
    fn buffer(&mut self) -> Result<Vec<u8>, HashError> {
        let mut buffer = match self.spare.try_recv() {
            Ok(buffer) => buffer,
            Err(_) if self.allocated < BUFFERS => {
                self.allocated += 1;
                Vec::with_capacity(CHUNK)
            }
            // The thread gives every buffer back while it runs, so this waits only while it
            // works; if it ends, its sender goes and this returns.
            Err(_) => match self.spare.recv() {
                Ok(buffer) => buffer,
                Err(_) => return Err(self.stopped()),
            },
        };
        buffer.clear();
        Ok(buffer)
    }

    fn send_filling(&mut self) -> Result<(), HashError> {
        if self.filling.is_empty() {
            return Ok(());
        }
        let buffer = std::mem::take(&mut self.filling);
        self.send(Piece::Data(buffer))
    }

    fn send(&mut self, piece: Piece) -> Result<(), HashError> {
        let sent = match &self.queue {
            Some(queue) => queue.send(piece).is_ok(),
            None => false,
        };
        if sent { Ok(()) } else { Err(self.stopped()) }
    }

    /// The error for a thread found gone: how it ended, once it has.
    fn stopped(&mut self) -> HashError {
        self.queue = None;
        match self.join() {
            Ok(_) => HashError::Stopped("it ended before the content did".to_owned()),
            Err(e) => e,
        }
    }

    fn join(&mut self) -> Result<Option<H::Output>, HashError> {
        let Some(thread) = self.thread.take() else {
            return Err(HashError::Stopped("it was already joined".to_owned()));
        };
        thread
            .join()
            .map_err(|panic| HashError::Stopped(panic_text(panic.as_ref())))
    }
}

impl<H: Absorb> Drop for HashThread<H> {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop.store(true, Ordering::Relaxed);
            self.queue = None;
            let _ = self.join();
        }
    }
}

/// The hashing thread: absorbs pieces until the queue closes (`Some`) or `stop` is set
/// (`None`), giving each buffer back once absorbed.
fn run<H: Absorb>(
    mut absorb: H,
    pieces: &Receiver<Piece>,
    give_back: &Sender<Vec<u8>>,
    stop: &AtomicBool,
) -> Option<H::Output> {
    for piece in pieces {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        match piece {
            Piece::Data(buffer) => {
                absorb.absorb(&buffer);
                // The producer may be gone; then the buffer is simply freed.
                let _ = give_back.send(buffer);
            }
            Piece::Zeros(mut len) => {
                while len > 0 {
                    if stop.load(Ordering::Relaxed) {
                        return None;
                    }
                    let n = zero_piece(len);
                    absorb.absorb(ZEROS.get(..n).unwrap_or_default());
                    len -= n as u64;
                }
            }
        }
    }
    Some(absorb.finish())
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        format!("it panicked: {text}")
    } else if let Some(text) = panic.downcast_ref::<String>() {
        format!("it panicked: {text}")
    } else {
        "it panicked".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    /// Runs `f` on a thread and fails the test if it has not returned within a minute.
    fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (done, result) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(f());
        });
        result
            .recv_timeout(Duration::from_secs(60))
            .expect("returned within a minute")
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn zero_runs_hash_as_zero_bytes() {
        let mut fed = RawDigest::default();
        fed.data(b"head");
        fed.zeros(ZEROS.len() as u64 * 3 + 5);
        fed.zeros(0);
        fed.data(b"tail");
        let mut logical = b"head".to_vec();
        logical.resize(logical.len() + ZEROS.len() * 3 + 5, 0);
        logical.extend_from_slice(b"tail");
        assert_eq!(
            fed.finish(),
            Digested {
                len: logical.len() as u64,
                sha256: sha256_hex(&logical)
            }
        );
    }

    #[test]
    fn thread_digest_equals_one_pass_over_the_content() {
        // Pieces straddling buffers, runs of zeros between, after and before data, and
        // consecutive zero runs.
        let steps: Vec<(Vec<u8>, u64)> = vec![
            (Vec::new(), 7),
            (noise(CHUNK - 3, 1), 0),
            (noise(10, 2), CHUNK as u64 * 2 + 1),
            (Vec::new(), 3),
            (noise(3 * CHUNK + 17, 3), 0),
            (noise(1, 4), 65_537),
        ];
        let mut thread = HashThread::sha256().unwrap();
        let mut logical = Vec::new();
        for (data, zeros) in &steps {
            thread.data(data).unwrap();
            logical.extend_from_slice(data);
            thread.zeros(*zeros).unwrap();
            logical.resize(logical.len() + *zeros as usize, 0);
        }
        let digested = thread.finish().unwrap();
        assert_eq!(digested.len, logical.len() as u64);
        assert_eq!(digested.sha256, sha256_hex(&logical));
    }

    #[test]
    fn nothing_hashes_as_the_empty_string() {
        let digested = HashThread::sha256().unwrap().finish().unwrap();
        assert_eq!(digested.len, 0);
        assert_eq!(digested.sha256, sha256_hex(b""));
    }

    /// Counts bytes and panics once it has seen `panic_after` of them.
    struct Failing {
        seen: u64,
        panic_after: u64,
    }

    impl Absorb for Failing {
        type Output = u64;

        fn absorb(&mut self, bytes: &[u8]) {
            self.seen += bytes.len() as u64;
            assert!(self.seen < self.panic_after, "injected failure");
        }

        fn finish(self) -> u64 {
            self.seen
        }
    }

    #[test]
    fn a_failing_thread_is_a_typed_error_for_the_producer() {
        let error = within_a_minute(|| {
            let mut thread = HashThread::spawn(Failing {
                seen: 0,
                panic_after: 5 * CHUNK as u64 / 2,
            })
            .unwrap();
            // Far more than the buffers in flight: the producer must notice, not wait.
            let data = noise(CHUNK, 5);
            for _ in 0..64 {
                if let Err(e) = thread.data(&data) {
                    return e;
                }
            }
            thread.finish().unwrap_err()
        });
        match error {
            HashError::Stopped(text) => assert!(text.contains("injected failure"), "{text}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_thread_failing_on_zeros_or_at_the_end_is_an_error_from_finish() {
        let error = within_a_minute(|| {
            let mut thread = HashThread::spawn(Failing {
                seen: 0,
                panic_after: 1 << 20,
            })
            .unwrap();
            thread.data(b"x").unwrap();
            thread.zeros(4 << 20).unwrap();
            thread.finish().unwrap_err()
        });
        assert!(matches!(error, HashError::Stopped(_)), "{error:?}");
    }

    /// Absorbs slowly, counting what it has absorbed.
    struct Slow(Arc<AtomicU64>);

    impl Absorb for Slow {
        type Output = ();

        fn absorb(&mut self, bytes: &[u8]) {
            std::thread::yield_now();
            self.0.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }

        fn finish(self) {}
    }

    #[test]
    fn dropping_stops_the_thread_within_a_zero_run() {
        let absorbed = Arc::new(AtomicU64::new(0));
        let counter = absorbed.clone();
        within_a_minute(move || {
            let mut thread = HashThread::spawn(Slow(counter)).unwrap();
            thread.data(b"x").unwrap();
            // A petabyte of zeros would take days to absorb.
            thread.zeros(1 << 50).unwrap();
            thread.data(b"y").unwrap();
            drop(thread);
        });
        assert!(absorbed.load(Ordering::Relaxed) < 1 << 40);
    }

    #[test]
    fn buffers_in_flight_stay_bounded() {
        let absorbed = Arc::new(AtomicU64::new(0));
        let mut thread = HashThread::spawn(Slow(absorbed.clone())).unwrap();
        let data = noise(CHUNK / 2 + 1, 6);
        for _ in 0..64 {
            thread.data(&data).unwrap();
            assert!(thread.allocated <= BUFFERS);
        }
        thread.finish().unwrap();
        assert_eq!(absorbed.load(Ordering::Relaxed), 64 * data.len() as u64);
    }
}
