//! The connection table: every client connection open, so that when it is
//! full a newcomer displaces the connection idle the longest (it is told to
//! close) rather than wait behind connections that send nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::conn::Conn;

/// The connections open now, by a number of their own.
#[derive(Default)]
pub struct Table {
    /// Every open connection; an entry leaves when its connection ends.
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// The next connection's number.
    next: AtomicU64,
}

/// A connection's place in the table, given up when dropped.
pub struct Entry {
    /// The table the place is in.
    table: Arc<Table>,
    /// The connection's number in it.
    id: u64,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Ok(mut conns) = self.table.conns.lock() {
            conns.remove(&self.id);
        }
    }
}

impl Table {
    /// Enters `conn`; it leaves when the entry is dropped.
    pub fn enter(self: &Arc<Self>, conn: Arc<Conn>) -> Entry {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut conns) = self.conns.lock() {
            conns.insert(id, conn);
        }
        Entry {
            table: Arc::clone(self),
            id,
        }
    }

    /// Tells the connection idle the longest (and not already closing) to
    /// close; whether there was one.
    pub fn shed_oldest_idle(&self) -> bool {
        let Ok(conns) = self.conns.lock() else {
            return false;
        };
        let oldest = conns
            .values()
            .filter(|conn| !conn.closing())
            .filter_map(|conn| conn.idle_for().map(|idle| (idle, conn)))
            .max_by_key(|(idle, _)| *idle);
        match oldest {
            Some((idle, conn)) => {
                tracing::debug!(peer = %conn.peer, ?idle, "the connection table is full: closing the connection idle the longest");
                conn.close();
                true
            }
            None => false,
        }
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.conns.lock().map_or(0, |conns| conns.len())
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
