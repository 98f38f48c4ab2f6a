//! permessage-deflate (RFC 7692) without context takeover in either direction (Herald's
//! addition to the vendored crate).
//!
//! Every message is compressed and decompressed on its own, so a connection keeps no deflate or
//! inflate state: the (large) compressor and decompressor are per thread, reset before each
//! message. That keeps an idle connection as small as without compression; the price is a
//! slightly worse ratio than with a sliding window kept across messages.
use std::cell::RefCell;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The four bytes a sync flush ends with; RFC 7692 §7.2.1 strips them from a message and the
/// receiver appends them again (§7.2.2).
const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

thread_local! {
    /// The compressor of this thread. Level 1 ("fast"): compression sits on the fan-out path,
    /// and on JSON the ratio is close to the default level's at a fraction of its CPU.
    static COMPRESS: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
    /// The decompressor of this thread (raw deflate, 32 KiB window: any window a peer uses).
    static DECOMPRESS: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// Why a compressed message could not be inflated.
#[derive(Debug, PartialEq, Eq)]
pub enum InflateError {
    /// It inflates to more than the limit.
    TooLong,
    /// It is not valid deflate data.
    Corrupt,
}

/// Compress one message's payload as permessage-deflate sends it (a raw deflate stream ending
/// with a sync flush, the flush's four-byte tail removed). The result is what a frame with
/// RSV1 set carries: see [`crate::Message::deflated_text`].
///
/// # Panics
///
/// If the compressor reports an error, which it does not for a fresh stream and valid flushes.
#[must_use]
pub fn deflate(data: &[u8]) -> Bytes {
    COMPRESS.with_borrow_mut(|c| {
        c.reset();
        let mut out: Vec<u8> = Vec::with_capacity(data.len() / 2 + 64);
        loop {
            let consumed = usize::try_from(c.total_in()).expect("fits in memory");
            c.compress_vec(&data[consumed..], &mut out, FlushCompress::Sync)
                .expect("deflate of a fresh stream");
            let consumed = usize::try_from(c.total_in()).expect("fits in memory");
            // Room left over means the flush is complete; a full buffer may hold more.
            if consumed == data.len() && out.len() < out.capacity() {
                break;
            }
            out.reserve(out.capacity().max(64));
        }
        if out.ends_with(&SYNC_TAIL) {
            out.truncate(out.len() - SYNC_TAIL.len());
        }
        Bytes::from(out)
    })
}

/// Inflate one message's payload (its frames' payloads joined), refusing to produce more than
/// `max_len` bytes: a small "zip bomb" costs at most `max_len` bytes of memory and the CPU to
/// produce them. (Herald's unit tests of this module are in its `compression` module: the
/// vendored copy keeps no tests.)
///
/// # Errors
///
/// [`InflateError::TooLong`] past `max_len`, [`InflateError::Corrupt`] for invalid data.
pub fn inflate(data: &[u8], max_len: usize) -> Result<Vec<u8>, InflateError> {
    DECOMPRESS.with_borrow_mut(|d| {
        d.reset(false);
        let mut out: Vec<u8> = Vec::with_capacity(data.len().saturating_mul(4).clamp(64, 16 * 1024).min(max_len.saturating_add(1)));
        // The message, then the sync tail the sender removed.
        for input in [data, &SYNC_TAIL[..]] {
            let start = d.total_in();
            loop {
                let done = usize::try_from(d.total_in() - start).expect("fits in memory");
                if out.len() == out.capacity() {
                    if out.len() > max_len {
                        return Err(InflateError::TooLong);
                    }
                    // Grow, but never past one byte over the limit: that byte tells "too long".
                    let room = out
                        .capacity()
                        .max(1024)
                        .min(max_len.saturating_add(1) - out.len());
                    out.reserve_exact(room);
                }
                let produced_before = out.len();
                let status = d
                    .decompress_vec(&input[done..], &mut out, FlushDecompress::Sync)
                    .map_err(|_| InflateError::Corrupt)?;
                if out.len() > max_len {
                    return Err(InflateError::TooLong);
                }
                let done_now = usize::try_from(d.total_in() - start).expect("fits in memory");
                if status == Status::StreamEnd {
                    // A final block ends the message; anything after it is ignored.
                    return Ok(out);
                }
                let progress = done_now > done || out.len() > produced_before;
                if (done_now == input.len() && out.len() < out.capacity()) || !progress {
                    break;
                }
            }
        }
        Ok(out)
    })
}
