//! The client's batches: runs of segments, each a slice of a block the
//! reader read, never a copy of one. A block is shared by the batches its
//! segments went into, and handed back to the reader to read into again
//! once the last of them is sent.
//!
//! Before, every segment was copied out of its block into a vector of its
//! own: a copy of every byte of a unique stream, about 130,000
//! allocations and a megabyte of fresh memory faulted in per megabyte
//! read (a unique GiB through the server: 1.30 s of client CPU).

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use super::pipeline::BackupOptions;
use crate::segment_blocks::{BlockCutter, BLOCK};
use crate::segmenter::Segmenting;
use crate::tree::parent::Unchanged;

/// A batch of the stream, in order: bytes of the parent's stream the
/// server reuses (a run of unchanged files), then segments.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) parent: Option<Unchanged>,
    /// The blocks the segments are slices of, in order; the first and the
    /// last may hold segments of the batches before and after.
    blocks: Vec<Arc<Vec<u8>>>,
    /// Each segment: its block's place in `blocks`, and its range there.
    segments: Vec<(u32, u32, u32)>,
}

impl Batch {
    pub(crate) fn len(&self) -> usize {
        self.segments.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    pub(crate) fn segment(&self, i: usize) -> &[u8] {
        let (block, start, end) = self.segments[i];
        &self.blocks[block as usize][start as usize..end as usize]
    }

    pub(crate) fn segments(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.segments.len()).map(|i| self.segment(i))
    }

    /// Give the blocks nobody else holds back to the reader (`spares`),
    /// as many as it has room for; the others are freed by the batch
    /// that holds them last.
    pub(crate) fn recycle(self, spares: &SyncSender<Vec<u8>>) {
        for block in self.blocks {
            if let Ok(bytes) = Arc::try_unwrap(block) {
                if spares.try_send(bytes).is_err() {
                    return;
                }
            }
        }
    }
}

/// Batches being filled for the hashers.
pub(crate) struct Batcher<'o> {
    batch: Batch,
    bytes: usize,
    seq: u64,
    opts: &'o BackupOptions,
    tx: SyncSender<(u64, Batch)>,
    /// Blocks the store stage is done with, to read into again.
    spares: Receiver<Vec<u8>>,
}

impl<'o> Batcher<'o> {
    pub(crate) fn new(
        opts: &'o BackupOptions,
        tx: SyncSender<(u64, Batch)>,
        spares: Receiver<Vec<u8>>,
    ) -> Batcher<'o> {
        Batcher {
            batch: Batch::default(),
            bytes: 0,
            seq: 0,
            opts,
            tx,
            spares,
        }
    }

    /// Add `block[start..end]`; false if nobody takes batches any more.
    fn push(&mut self, block: &Arc<Vec<u8>>, start: usize, end: usize) -> bool {
        let len = end - start;
        if !self.batch.segments.is_empty()
            && self.bytes + len > self.opts.batch_bytes
            && !self.send()
        {
            return false;
        }
        self.bytes += len;
        let b = &mut self.batch;
        if !b.blocks.last().is_some_and(|last| Arc::ptr_eq(last, block)) {
            b.blocks.push(block.clone());
        }
        // A block is at most a few MiB (`BlockCutter`): its offsets fit.
        let at = (b.blocks.len() - 1) as u32;
        b.segments.push((at, start as u32, end as u32));
        b.segments.len() < self.opts.batch_segments || self.send()
    }

    /// Add an unchanged file's bytes in the parent's stream: to the run
    /// the batch starts with if they follow it (the walk reaches unchanged
    /// files in the parent's order, so a run of them is one item), else
    /// to a new batch. False if nobody takes batches any more.
    pub(crate) fn push_parent(&mut self, file: Unchanged) -> bool {
        if self.batch.segments.is_empty() {
            match &mut self.batch.parent {
                None => {
                    self.batch.parent = Some(file);
                    return true;
                }
                Some(run) if run.offset.checked_add(run.size) == Some(file.offset) => {
                    run.size = run.size.saturating_add(file.size);
                    return true;
                }
                Some(_) => {}
            }
        }
        if !self.send() {
            return false;
        }
        self.batch.parent = Some(file);
        true
    }

    /// Send the last batch, if it holds anything.
    pub(crate) fn finish(mut self) {
        if self.batch.parent.is_some() || !self.batch.is_empty() {
            self.send();
        }
    }

    fn send(&mut self) -> bool {
        let batch = std::mem::take(&mut self.batch);
        let sent = self.tx.send((self.seq, batch)).is_ok();
        (self.bytes, self.seq) = (0, self.seq + 1);
        sent
    }
}

/// Cut `reader` to its end into `out`; false if stopped (downstream done
/// or failed).
pub(crate) fn cut_into(
    segmenting: Segmenting,
    reader: impl Read,
    out: &mut Batcher<'_>,
    stop: &AtomicBool,
) -> Result<bool, String> {
    let mut cutter = BlockCutter::new(segmenting, reader, BLOCK);
    loop {
        for spare in out.spares.try_iter() {
            cutter.give_back(spare);
        }
        let Some(block) = cutter.next() else {
            return Ok(true);
        };
        if stop.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let mut block = block.map_err(|e| format!("reading the stream: {e}"))?;
        // A small file's block is read into room for a whole one: held by
        // a batch, the room would be held too (a batch of 256 small files
        // would keep 256 MiB).
        if block.bytes.len() < block.bytes.capacity() / 2 {
            block.bytes.shrink_to_fit();
        }
        let ends = std::mem::take(&mut block.ends);
        let start = block.start;
        let bytes = Arc::new(block.bytes);
        let starts = std::iter::once(start).chain(ends.iter().copied());
        for (s, e) in starts.zip(ends.iter().copied()) {
            if !out.push(&bytes, s, e) {
                return Ok(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    fn opts(batch_segments: usize, batch_bytes: usize) -> BackupOptions {
        BackupOptions {
            batch_segments,
            batch_bytes,
            ..BackupOptions::default()
        }
    }

    /// Cut into batches, a stream's segments are its bytes in order,
    /// batches keep to their bounds, and blocks come back to be read into
    /// again once every batch holding them is recycled.
    #[test]
    fn batches_are_the_stream_in_order_and_their_blocks_come_back() {
        let mut data = vec![0u8; 5 * BLOCK + 12_345];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in &mut data {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let how = Segmenting::FastCdc {
            min: 2048,
            avg: 8192,
            max: 65536,
        };
        for (segments, bytes) in [(256, 4 << 20), (7, 1 << 20), (1, 1)] {
            let o = opts(segments, bytes);
            let (tx, rx) = sync_channel(1 << 16);
            let (_spares_tx, spares_rx) = sync_channel(8);
            let mut out = Batcher::new(&o, tx, spares_rx);
            let stop = AtomicBool::new(false);
            assert!(cut_into(how, &data[..], &mut out, &stop).unwrap());
            out.finish();
            let batches: Vec<(u64, Batch)> = rx.iter().collect();
            let mut joined = Vec::new();
            for (i, (seq, batch)) in batches.iter().enumerate() {
                assert_eq!(*seq, i as u64);
                assert!(batch.len() <= segments);
                let total: usize = batch.segments().map(<[u8]>::len).sum();
                assert!(batch.len() <= 1 || total <= bytes, "{total} over {bytes}");
                for s in batch.segments() {
                    joined.extend_from_slice(s);
                }
            }
            assert_eq!(joined, data, "{segments} segments, {bytes} bytes a batch");
            // Blocks held by no one else once every batch is recycled.
            let blocks: std::collections::HashSet<*const Vec<u8>> = (batches.iter())
                .flat_map(|(_, b)| b.blocks.iter().map(Arc::as_ptr))
                .collect();
            assert!(blocks.len() >= 6, "{} blocks", blocks.len());
            let (back_tx, back_rx) = sync_channel(64);
            for (_, batch) in batches {
                batch.recycle(&back_tx);
            }
            assert_eq!(back_rx.try_iter().count(), blocks.len());
        }
    }

    /// A small file's block does not hold a whole block's room in a batch.
    #[test]
    fn a_small_files_block_is_shrunk_to_its_bytes() {
        let o = opts(256, 4 << 20);
        let (tx, rx) = sync_channel(16);
        let (_spares_tx, spares_rx) = sync_channel(8);
        let mut out = Batcher::new(&o, tx, spares_rx);
        let stop = AtomicBool::new(false);
        let how = Segmenting::Fixed { size: 4096 };
        assert!(cut_into(how, &[5u8; 10_000][..], &mut out, &stop).unwrap());
        out.finish();
        let (_, batch) = rx.recv().unwrap();
        assert_eq!(batch.len(), 3);
        assert!(batch.blocks.iter().all(|b| b.capacity() < 20_000));
    }
}
