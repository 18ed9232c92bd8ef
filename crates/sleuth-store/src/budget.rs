//! Deadlines and cancellation for reads of untrusted files.
//!
//! SQLite checks its progress handler between virtual-machine steps, so one
//! slow function call (a quadratic `instr` over long strings) or a crafted
//! schema runs on past any step-based limit. A [`ReadBudget`] bounds reads on
//! wall time instead: a watchdog thread calls `sqlite3_interrupt` on every
//! connection registered with the budget when its deadline passes or when the
//! caller cancels (an MCP client that gave up), and a progress handler stops
//! statements that start after that moment.

use rusqlite::{Connection, InterruptHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The deadline `Trace::open` gives a command-line read: far above any
/// honest trace's load time, so only a hostile or broken file meets it.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(600);

/// How often (in SQLite VM steps) the progress handler looks at the clock.
const PROGRESS_STEPS: i32 = 1_000;

#[derive(Default)]
struct Inner {
    stopped: AtomicBool,
    /// Why reads stopped, set by whoever stopped them first.
    why: Mutex<Option<String>>,
    handles: Mutex<Vec<InterruptHandle>>,
}

/// A wall-clock budget shared by every connection one piece of work opens.
/// Cheap to clone; clones share the deadline and the cancellation.
#[derive(Clone)]
pub struct ReadBudget {
    deadline: Instant,
    timeout: Duration,
    inner: Arc<Inner>,
    /// Dropping the last clone of this sender ends the watchdog thread.
    _watchdog: Arc<mpsc::Sender<()>>,
}

impl std::fmt::Debug for ReadBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBudget")
            .field("timeout", &self.timeout)
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

impl ReadBudget {
    /// A budget that stops reads `timeout` from now.
    pub fn new(timeout: Duration) -> ReadBudget {
        Self::with_inner(
            Arc::new(Inner::default()),
            Instant::now() + timeout,
            timeout,
        )
    }

    /// A budget sharing this one's cancellation (cancelling either stops
    /// both) whose deadline is at most `timeout` from now.
    pub fn narrowed(&self, timeout: Duration) -> ReadBudget {
        let deadline = self.deadline.min(Instant::now() + timeout);
        let timeout = timeout.min(self.timeout);
        Self::with_inner(self.inner.clone(), deadline, timeout)
    }

    fn with_inner(inner: Arc<Inner>, deadline: Instant, timeout: Duration) -> ReadBudget {
        let (tx, rx) = mpsc::channel::<()>();
        let watched = inner.clone();
        // The thread sleeps until the deadline or until every clone is gone
        // (the channel disconnects); it holds no connection, only handles.
        // Without the thread the progress handler still enforces the deadline.
        let _ = std::thread::Builder::new()
            .name("read-watchdog".into())
            .spawn(move || {
                let wait = deadline.saturating_duration_since(Instant::now());
                if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(wait) {
                    stop(&watched, expired(timeout));
                }
            });
        ReadBudget {
            deadline,
            timeout,
            inner,
            _watchdog: Arc::new(tx),
        }
    }

    /// The time limit of this budget.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Stops every read under this budget now (the caller gave up).
    pub fn cancel(&self) {
        stop(&self.inner, "cancelled: the caller gave up".into());
    }

    /// Whether reads under this budget must stop (deadline passed or cancelled).
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }

    /// Why reads stopped (`time limit of 2s exceeded`, `cancelled: ...`); None while they may go on.
    pub fn stop_reason(&self) -> Option<String> {
        if let Some(why) = self.inner.why.lock().ok().and_then(|w| w.clone()) {
            return Some(why);
        }
        (Instant::now() >= self.deadline).then(|| expired(self.timeout))
    }

    /// Puts `conn` under this budget: interrupted by the watchdog, and every
    /// statement refused by the progress handler once the budget is spent.
    /// A connection has one progress handler: watch it with one budget
    /// (use [`ReadBudget::narrowed`] to combine two).
    pub fn watch(&self, conn: &mut Connection) -> rusqlite::Result<()> {
        if let Ok(mut hs) = self.inner.handles.lock() {
            hs.push(conn.get_interrupt_handle());
        }
        let view = StopView {
            deadline: self.deadline,
            inner: self.inner.clone(),
        };
        conn.progress_handler(PROGRESS_STEPS, Some(move || view.is_stopped()))?;
        if self.is_stopped() {
            conn.get_interrupt_handle().interrupt();
        }
        Ok(())
    }
}

/// What the progress handler sees: it must not keep the watchdog alive
/// (the connection may outlive the work).
struct StopView {
    deadline: Instant,
    inner: Arc<Inner>,
}

impl StopView {
    fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

fn expired(timeout: Duration) -> String {
    format!("time limit of {timeout:?} exceeded")
}

fn stop(inner: &Inner, why: String) {
    if let Ok(mut w) = inner.why.lock() {
        w.get_or_insert(why);
    }
    inner.stopped.store(true, Ordering::Relaxed);
    if let Ok(hs) = inner.handles.lock() {
        for h in hs.iter() {
            h.interrupt();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_interrupts_a_running_statement() {
        let mut conn = Connection::open_in_memory().expect("db");
        let budget = ReadBudget::new(Duration::from_millis(200));
        budget.watch(&mut conn).expect("watch");
        let t0 = Instant::now();
        let r: rusqlite::Result<i64> = conn.query_row(
            "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r",
            [],
            |r| r.get(0),
        );
        assert!(r.is_err(), "runaway query must be stopped");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(budget.is_stopped());
        // Later statements are stopped too (within the progress handler's
        // step count), not silently allowed to run to the end.
        assert!(conn
            .query_row(
                "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 100000) SELECT count(*) FROM r",
                [],
                |r| r.get::<_, i64>(0)
            )
            .is_err());
    }

    #[test]
    fn cancel_stops_before_the_deadline() {
        let mut conn = Connection::open_in_memory().expect("db");
        let budget = ReadBudget::new(Duration::from_secs(600));
        budget.watch(&mut conn).expect("watch");
        let b2 = budget.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            b2.cancel();
        });
        let t0 = Instant::now();
        let r: rusqlite::Result<i64> = conn.query_row(
            "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r",
            [],
            |r| r.get(0),
        );
        t.join().expect("canceller");
        assert!(r.is_err());
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(
            budget.stop_reason().as_deref(),
            Some("cancelled: the caller gave up")
        );
    }

    #[test]
    fn narrowed_budget_stops_first_and_shares_cancellation() {
        let outer = ReadBudget::new(Duration::from_secs(600));
        let inner = outer.narrowed(Duration::from_millis(100));
        let mut conn = Connection::open_in_memory().expect("db");
        inner.watch(&mut conn).expect("watch");
        let r: rusqlite::Result<i64> = conn.query_row(
            "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r",
            [],
            |r| r.get(0),
        );
        assert!(r.is_err());
        assert_eq!(
            inner.stop_reason().as_deref(),
            Some("time limit of 100ms exceeded")
        );
        let other = outer.narrowed(Duration::from_secs(60));
        outer.cancel();
        assert!(
            other.is_stopped(),
            "cancelling the outer budget stops its narrowed ones"
        );
    }

    #[test]
    fn an_unspent_budget_lets_reads_through() {
        let mut conn = Connection::open_in_memory().expect("db");
        let budget = ReadBudget::new(Duration::from_secs(60));
        budget.watch(&mut conn).expect("watch");
        let n: i64 = conn
            .query_row("SELECT 40 + 2", [], |r| r.get(0))
            .expect("read");
        assert_eq!(n, 42);
        assert!(!budget.is_stopped());
    }
}
