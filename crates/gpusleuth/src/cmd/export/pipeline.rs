//! An export's two halves side by side: the trace's rows are read on the
//! calling thread (its SQLite connection cannot leave it) while a helper
//! thread turns them into JSON and writes it. On one thread each half was
//! about half of a large export's time (perf, a 1M-call Perfetto export on
//! the 2-vCPU development VM: SQLite and the rows' decoding 55%, JSON 45%),
//! so on two CPUs the export takes about the longer half, not both
//! (1.95 -> 1.36 s there; docs/benchmarks.md, round 35).
//!
//! Records cross in batches (one channel message per [`BATCH`] records,
//! at most [`IN_FLIGHT`] batches waiting): memory stays bounded whatever
//! the trace's length, and the order is the reader's (one consumer).

use std::sync::mpsc::{sync_channel, SyncSender};

/// Records per message: large enough that the channel's cost is nothing
/// beside the records', small enough to keep both threads busy.
const BATCH: usize = 1024;
/// Batches the reader may be ahead of the writer.
const IN_FLIGHT: usize = 4;

/// The reader's side: what `produce` hands each record to.
pub(super) struct Sink<T> {
    batch: Vec<T>,
    tx: SyncSender<Vec<T>>,
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
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.tx.send(batch).map_err(|_| WriterStopped.into())
    }
}

/// Runs `produce` here and `consume` (on `state`, record by record, in the
/// order produced) on a helper thread. The writer's error comes first: a
/// reader stops because its writer did (a closed pipe), never the reverse.
pub(super) fn pipelined<T: Send, S: Send>(
    state: &mut S,
    produce: impl FnOnce(&mut Sink<T>) -> anyhow::Result<()>,
    mut consume: impl FnMut(&mut S, T) -> anyhow::Result<()> + Send,
) -> anyhow::Result<()> {
    let (tx, rx) = sync_channel::<Vec<T>>(IN_FLIGHT);
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> anyhow::Result<()> {
            for batch in rx {
                for record in batch {
                    consume(state, record)?;
                }
            }
            Ok(())
        });
        let mut sink = Sink {
            batch: Vec::with_capacity(BATCH),
            tx,
        };
        // What was read before an error is written too, as a reader
        // writing its own output would have.
        let read = produce(&mut sink);
        let sent = match sink.batch.is_empty() {
            true => Ok(()),
            false => sink.send(),
        };
        let read = read.and(sent);
        // The writer's loop ends with the channel.
        drop(sink);
        let wrote = match writer.join() {
            Ok(wrote) => wrote,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match (read, wrote) {
            (_, Err(e)) => Err(e),
            (Err(e), Ok(())) => Err(e),
            (Ok(()), Ok(())) => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_is_consumed_once_in_order() {
        // Batches full, one short and none: 0, 1, BATCH and 3.5 batches.
        for n in [0, 1, BATCH, BATCH * 7 / 2] {
            let mut seen = Vec::new();
            pipelined(
                &mut seen,
                |sink| (0..n).try_for_each(|i| sink.push(i)),
                |seen, i| {
                    seen.push(i);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{n} records");
        }
    }

    #[test]
    fn a_writers_error_stops_the_reader_and_is_the_one_reported() {
        let mut consumed = 0usize;
        let mut produced = 0usize;
        let e = pipelined(
            &mut consumed,
            |sink| {
                for i in 0..BATCH * 100 {
                    produced += 1;
                    sink.push(i)?;
                }
                Ok(())
            },
            |consumed, i| {
                *consumed += 1;
                match i {
                    10 => Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe).into()),
                    _ => Ok(()),
                }
            },
        )
        .unwrap_err();
        assert_eq!(
            e.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::BrokenPipe),
            "{e}"
        );
        assert_eq!(consumed, 11);
        // The reader stopped within the batches in flight, not at its end.
        assert!(produced <= BATCH * (IN_FLIGHT + 3), "{produced} produced");
    }

    #[test]
    fn a_readers_error_is_reported_after_what_it_read_was_written() {
        let mut seen = Vec::new();
        let e = pipelined(
            &mut seen,
            |sink| {
                (0..5).try_for_each(|i| sink.push(i))?;
                anyhow::bail!("damaged row")
            },
            |seen, i| {
                seen.push(i);
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "damaged row");
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    }
}
