//! An export's halves side by side: the trace's rows are read on the
//! calling thread (its SQLite connection cannot leave it) while helper
//! threads turn them into JSON and one more writes it. On one thread each
//! half was about half of a large export's time (perf, a 1M-call Perfetto
//! export on the 2-vCPU development VM: SQLite and the rows' decoding 55%,
//! JSON 45%), so the export takes about the longer half, not both
//! (1.95 -> 1.36 s there; docs/benchmarks.md, round 35).
//!
//! Records cross in numbered batches of [`BATCH`]. Each batch is
//! serialized whole by one of [`serializers`] threads (one on a machine of
//! fewer than 6 CPUs, up to 4 on larger ones; the reading itself is split
//! over helper connections from 2: `Rows::for_each_call_by_start_from`), and the
//! writer puts the batches' elements in the array in their order. At most
//! [`AHEAD`] batches are read and not yet written, whatever the trace's
//! length or the threads' speeds: memory stays bounded, and the output is
//! the reader's order, byte for byte what one thread would write.

use super::{ArrayWriter, Elements};
use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;

/// Records per batch: large enough that the channels' cost is nothing
/// beside the records', small enough to keep every thread busy.
const BATCH: usize = 1024;
/// Batches read and not yet written, at most.
const AHEAD: usize = 16;

/// Threads serializing batches: one up to 5 CPUs (the reader, the
/// serializer and the writer already fill two), then one per two CPUs
/// beyond the first two, at most 4.
fn serializers() -> usize {
    #[cfg(test)]
    if let Some(n) = test_seams::SERIALIZERS.with(|c| c.get()) {
        return n;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus.saturating_sub(2) / 2).clamp(1, 4)
}

/// The reader's side: what `produce` hands each record to.
pub(super) struct Sink<T> {
    batch: Vec<T>,
    seq: u64,
    tx: SyncSender<(u64, Vec<T>)>,
    /// One message per batch written.
    written: Receiver<()>,
    /// Batches sent and not yet known to be written.
    ahead: usize,
}

/// The writer stopped (its own error is the one reported).
#[derive(Debug)]
struct WriterStopped;

impl std::fmt::Display for WriterStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the export's writer stopped")
    }
}

impl std::error::Error for WriterStopped {}

impl<T> Sink<T> {
    pub(super) fn push(&mut self, record: T) -> anyhow::Result<()> {
        self.batch.push(record);
        if self.batch.len() == BATCH {
            self.send()?;
        }
        Ok(())
    }

    fn send(&mut self) -> anyhow::Result<()> {
        // Written batches give their places back; a full window waits for one.
        while self.written.try_recv().is_ok() {
            self.ahead -= 1;
        }
        if self.ahead == AHEAD {
            self.written.recv().map_err(|_| WriterStopped)?;
            self.ahead -= 1;
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.tx.send((self.seq, batch)).map_err(|_| WriterStopped)?;
        self.seq += 1;
        self.ahead += 1;
        Ok(())
    }
}

/// Where a batch's serialized form goes, in the records' order: a JSON
/// array's elements ([`ArrayWriter`]), a Perfetto protobuf's packets
/// (`pftrace::PacketWriter`).
pub(super) trait Batches<E>: Send {
    fn append(&mut self, made: &E) -> std::io::Result<()>;
}

impl Batches<Elements> for ArrayWriter<'_> {
    fn append(&mut self, made: &Elements) -> std::io::Result<()> {
        ArrayWriter::append(self, made)
    }
}

/// Runs `produce` here; `serialize` turns each record into elements of
/// `ev`'s array (none, one or more; or packets of a Perfetto protobuf) on
/// helper threads; they are written in the order the records were produced. The writer's error
/// comes first: a reader stops because its writer did (a closed pipe),
/// never the reverse. What was read before a reader's error is written.
pub(super) fn pipelined<T: Send, E: Default + Send>(
    ev: &mut impl Batches<E>,
    produce: impl FnOnce(&mut Sink<T>) -> anyhow::Result<()>,
    serialize: impl Fn(&T, &mut E) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    let (tx, batches) = sync_channel::<(u64, Vec<T>)>(AHEAD);
    let batches = Mutex::new(batches);
    let (done_tx, done) = sync_channel::<(u64, anyhow::Result<E>)>(AHEAD);
    let (written_tx, written) = sync_channel::<()>(AHEAD);
    std::thread::scope(|scope| {
        for _ in 0..serializers() {
            let (done_tx, batches, serialize) = (done_tx.clone(), &batches, &serialize);
            scope.spawn(move || loop {
                // The lock is held while waiting, never while serializing.
                let next = batches
                    .lock()
                    .map_err(|_| ())
                    .and_then(|rx| rx.recv().map_err(|_| ()));
                let Ok((seq, batch)) = next else { return };
                let mut elements = E::default();
                let made = batch
                    .iter()
                    .try_for_each(|record| serialize(record, &mut elements))
                    .map(|()| elements);
                if done_tx.send((seq, made)).is_err() {
                    return;
                }
            });
        }
        drop(done_tx);
        let writer = scope.spawn(move || -> anyhow::Result<()> {
            // Batches done out of turn wait here: at most `AHEAD`.
            let mut waiting = BTreeMap::new();
            let mut next = 0u64;
            for (seq, made) in done {
                waiting.insert(seq, made);
                while let Some(made) = waiting.remove(&next) {
                    ev.append(&made?)?;
                    next += 1;
                    // Never blocks: at most `AHEAD` batches are unanswered.
                    let _ = written_tx.send(());
                }
            }
            Ok(())
        });
        let mut sink = Sink {
            batch: Vec::with_capacity(BATCH),
            seq: 0,
            tx,
            written,
            ahead: 0,
        };
        let read = produce(&mut sink);
        let sent = match sink.batch.is_empty() {
            true => Ok(()),
            false => sink.send(),
        };
        let read = read.and(sent);
        // The serializers' loops end with the batches' channel, the
        // writer's with theirs.
        drop(sink);
        let wrote = match writer.join() {
            Ok(wrote) => wrote,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        wrote.and(read)
    })
}

#[cfg(test)]
pub(super) mod test_seams {
    use std::cell::Cell;
    thread_local! {
        /// Serializer threads of exports run from this thread, when set.
        pub(crate) static SERIALIZERS: Cell<Option<usize>> = const { Cell::new(None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::export::Items;

    /// What the array holds after `produce`, each record `i` written as
    /// `i` elements of value `i` (none for 0), with `n` serializers.
    fn exported(
        n: usize,
        produce: impl FnOnce(&mut Sink<u64>) -> anyhow::Result<()>,
    ) -> (anyhow::Result<()>, Vec<u64>) {
        test_seams::SERIALIZERS.with(|c| c.set(Some(n)));
        let mut out: Vec<u8> = Vec::new();
        let mut ev = ArrayWriter::open(&mut out).unwrap();
        let r = pipelined(&mut ev, produce, |&i, el| {
            (0..i % 3).try_for_each(|_| el.item(&i))
        });
        ev.close().unwrap();
        test_seams::SERIALIZERS.with(|c| c.set(None));
        let values = serde_json::from_slice(&out).expect("one JSON array");
        (r, values)
    }

    fn expected(records: impl Iterator<Item = u64>) -> Vec<u64> {
        records
            .flat_map(|i| std::iter::repeat_n(i, (i % 3) as usize))
            .collect()
    }

    #[test]
    fn every_record_is_written_once_in_order_by_any_number_of_serializers() {
        // Batches full, one short and none: 0, 1, BATCH and many batches
        // (more than AHEAD, so the window turns over).
        for n in [1, 2, 4] {
            for count in [0, 1, BATCH as u64, (BATCH * (AHEAD * 3 + 1) / 2) as u64] {
                let (r, got) = exported(n, |sink| (0..count).try_for_each(|i| sink.push(i)));
                r.unwrap();
                assert_eq!(got, expected(0..count), "{n} serializers, {count} records");
            }
        }
    }

    #[test]
    fn a_writers_error_stops_the_reader_and_is_the_one_reported() {
        for n in [1, 3] {
            test_seams::SERIALIZERS.with(|c| c.set(Some(n)));
            let mut produced = 0usize;
            // An output that fails once 1,000 bytes were written to it.
            struct Closing(usize);
            impl std::io::Write for Closing {
                fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                    if self.0 + b.len() > 1_000 {
                        return Err(std::io::ErrorKind::BrokenPipe.into());
                    }
                    self.0 += b.len();
                    Ok(b.len())
                }
                fn flush(&mut self) -> std::io::Result<()> {
                    Ok(())
                }
            }
            let mut out = Closing(0);
            let mut ev = ArrayWriter::open(&mut out).unwrap();
            let e = pipelined(
                &mut ev,
                |sink| {
                    for i in 0..(BATCH * 1000) as u64 {
                        produced += 1;
                        sink.push(i)?;
                    }
                    Ok(())
                },
                |&i, el| el.item(&format!("{i:0100}")),
            )
            .unwrap_err();
            test_seams::SERIALIZERS.with(|c| c.set(None));
            assert_eq!(
                e.downcast_ref::<std::io::Error>().map(|e| e.kind()),
                Some(std::io::ErrorKind::BrokenPipe),
                "{e}"
            );
            // The reader stopped within the batches in flight, not at its end.
            assert!(produced <= BATCH * (AHEAD + 2), "{produced} produced");
        }
    }

    #[test]
    fn a_serializers_error_is_reported_and_nothing_after_it_is_written() {
        for n in [1, 4] {
            test_seams::SERIALIZERS.with(|c| c.set(Some(n)));
            let mut out: Vec<u8> = Vec::new();
            let mut ev = ArrayWriter::open(&mut out).unwrap();
            let e = pipelined(
                &mut ev,
                |sink| (0..(BATCH * 40) as u64).try_for_each(|i| sink.push(i)),
                |&i, el| match i {
                    5_000 => anyhow::bail!("record {i} cannot be written"),
                    _ => el.item(&i),
                },
            )
            .unwrap_err();
            ev.close().unwrap();
            test_seams::SERIALIZERS.with(|c| c.set(None));
            assert_eq!(e.to_string(), "record 5000 cannot be written");
            let got: Vec<u64> = serde_json::from_slice(&out).unwrap();
            // The batches before the failed one, whole; none after it.
            assert_eq!(got, (0..(5_000 / BATCH * BATCH) as u64).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_readers_error_is_reported_after_what_it_read_was_written() {
        let (r, got) = exported(2, |sink| {
            (0..5).try_for_each(|i| sink.push(i))?;
            anyhow::bail!("damaged row")
        });
        assert_eq!(r.unwrap_err().to_string(), "damaged row");
        assert_eq!(got, expected(0..5));
    }
}
