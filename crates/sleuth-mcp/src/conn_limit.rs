//! Bounds on open HTTP connections, before authentication.
//!
//! A client that opens connections and stops in the middle of its headers
//! costs a descriptor each; a thousand of them used to exhaust the process's
//! descriptors so that real requests timed out. Besides hyper's header-read
//! deadline, the accept loop admits a connection only within two caps (all
//! peers, one peer address) and makes room by closing the oldest *idle*
//! connections first (no request in progress: slow or silent headers,
//! keep-alive leftovers), so a flood delays nobody's next request for long;
//! only when every connection is busy serving a request is a new one refused.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The caps; see [`Default`] for the values and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnCaps {
    /// Connections open at once, all peers together (well below the usual
    /// 1,024-descriptor limit, leaving room for trace files and NVML).
    pub total: usize,
    /// Connections open at once from one peer address.
    pub per_peer: usize,
}

impl Default for ConnCaps {
    fn default() -> Self {
        ConnCaps {
            total: 256,
            per_peer: 64,
        }
    }
}

/// What the tracker knows about one open connection.
struct Entry {
    peer: IpAddr,
    in_flight: Arc<AtomicUsize>,
    close: Option<tokio::task::AbortHandle>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// By id, which is also the order of arrival (oldest first).
    open: BTreeMap<u64, Entry>,
}

/// Shared by the accept loop and every connection task.
#[derive(Clone)]
pub struct ConnTracker {
    caps: ConnCaps,
    state: Arc<Mutex<State>>,
}

/// One admitted connection: count its requests with [`Admitted::request`];
/// dropping it (the task ending) frees its place.
pub struct Admitted {
    id: u64,
    in_flight: Arc<AtomicUsize>,
    state: Arc<Mutex<State>>,
}

/// Marks a request in progress on its connection until dropped.
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admitted {
    pub fn id(&self) -> u64 {
        self.id
    }
    /// A request starts on this connection (the connection is busy until the guard drops).
    pub fn request(in_flight: &Arc<AtomicUsize>) -> InFlight {
        in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(in_flight.clone())
    }
    pub fn in_flight(&self) -> Arc<AtomicUsize> {
        self.in_flight.clone()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock() {
            s.open.remove(&self.id);
        }
    }
}

impl ConnTracker {
    pub fn new(caps: ConnCaps) -> Self {
        ConnTracker {
            caps,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// Admits a connection from `peer`, closing the oldest idle connections
    /// (of that peer first when its own cap is reached) to make room.
    /// `None`: every connection in the way is busy; refuse this one.
    pub fn admit(&self, peer: IpAddr) -> Option<Admitted> {
        let mut s = self.state.lock().ok()?;
        let from_peer = s.open.values().filter(|e| e.peer == peer).count();
        if from_peer >= self.caps.per_peer && !evict_oldest_idle(&mut s, Some(peer)) {
            return None;
        }
        if s.open.len() >= self.caps.total && !evict_oldest_idle(&mut s, None) {
            return None;
        }
        let id = s.next_id;
        s.next_id += 1;
        let in_flight = Arc::new(AtomicUsize::new(0));
        s.open.insert(
            id,
            Entry {
                peer,
                in_flight: in_flight.clone(),
                close: None,
            },
        );
        Some(Admitted {
            id,
            in_flight,
            state: self.state.clone(),
        })
    }

    /// Remembers how to close connection `id` (its task) when room is needed.
    pub fn set_closer(&self, id: u64, close: tokio::task::AbortHandle) {
        if let Ok(mut s) = self.state.lock() {
            match s.open.get_mut(&id) {
                Some(e) => e.close = Some(close),
                // Already finished before its closer was known.
                None => close.abort(),
            }
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.state.lock().map(|s| s.open.len()).unwrap_or(0)
    }
}

/// Closes the oldest connection with no request in progress (of `peer`, if
/// given); false when there is none.
fn evict_oldest_idle(s: &mut State, peer: Option<IpAddr>) -> bool {
    let victim = s
        .open
        .iter()
        .find(|(_, e)| peer.is_none_or(|p| e.peer == p) && e.in_flight.load(Ordering::Relaxed) == 0)
        .map(|(&id, _)| id);
    let Some(id) = victim else {
        return false;
    };
    if let Some(e) = s.open.remove(&id) {
        if let Some(close) = e.close {
            close.abort();
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn tracker(total: usize, per_peer: usize) -> ConnTracker {
        ConnTracker::new(ConnCaps { total, per_peer })
    }

    #[test]
    fn idle_connections_make_room_busy_ones_do_not() {
        let t = tracker(3, 2);
        let a = t.admit(ip("10.0.0.1")).expect("a");
        let b = t.admit(ip("10.0.0.1")).expect("b");
        // Peer cap reached: the oldest idle of that peer (a) makes room.
        let c = t.admit(ip("10.0.0.1")).expect("c");
        assert_eq!(t.open(), 2);
        drop(a); // its task ends later; removing twice is harmless
        let _busy_b = Admitted::request(&b.in_flight());
        let _busy_c = Admitted::request(&c.in_flight());
        assert!(
            t.admit(ip("10.0.0.1")).is_none(),
            "both of the peer's connections are serving requests"
        );
        // Another peer still gets in, up to the total.
        let d = t.admit(ip("10.0.0.2")).expect("d");
        assert_eq!(t.open(), 3);
        let e = t.admit(ip("10.0.0.3")).expect("d is idle and evicted");
        drop(d); // d's task ending later removes nothing more
        assert_eq!(t.open(), 3);
        drop(e);
        assert_eq!(t.open(), 2);
    }

    #[test]
    fn finished_connections_free_their_place() {
        let t = tracker(1, 1);
        let a = t.admit(ip("127.0.0.1")).expect("a");
        let _busy = Admitted::request(&a.in_flight());
        assert!(t.admit(ip("127.0.0.1")).is_none());
        drop(_busy);
        drop(a);
        assert_eq!(t.open(), 0);
        assert!(t.admit(ip("127.0.0.1")).is_some());
    }
}
