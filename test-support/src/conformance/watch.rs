//! What a watcher of a record sees while a path's calls change it, in the
//! form the matrices compare it: each event's record as [`Shape`] keeps it
//! (its fencing token compared with the one the watch began with), whether
//! the event said the window timed out, and whether it came at the start,
//! on hearing of a change, or only when the window ended (which is where a
//! change nobody announced would show).

use std::time::{Duration, Instant};

use futures::StreamExt;
use idempotency_coordinator::proto;
use tokio::task::JoinHandle;
use tonic::Code;

use super::shape::Shape;
use crate::helpers::*;

/// How long a watcher follows its record: much longer than the calls of a
/// sequence take, so that an event that arrives well before the window
/// ends was sent on hearing of a change.
const WINDOW: Duration = Duration::from_secs(8);

/// How an event reached the watcher.
#[derive(Debug, PartialEq)]
enum Heard {
    /// The record as it stood when the watch began.
    AtStart,
    /// On hearing that the record changed.
    OfAChange,
    /// When the window ended.
    AtTheEnd,
}

#[derive(Debug, PartialEq)]
pub(super) struct Event {
    heard: Heard,
    timed_out: bool,
    record: Shape,
}

/// The events a watcher saw, or the code its Watch was refused with.
pub(super) type Watched = Result<Vec<Event>, Code>;

/// A watcher following one record until its stream ends.
pub(super) struct Watcher(JoinHandle<Watched>);

impl Watcher {
    /// Starts watching `key` in scope `s` on `server`, and waits for the
    /// first event (the record as it stands): from then on the record is
    /// marked watched, so every change of it is announced.
    pub(super) async fn start(server: &TestServer, key: &str) -> Watcher {
        let started = Instant::now();
        let request = proto::WatchRequest {
            scope: "s".into(),
            key: key.into(),
            timeout: secs(WINDOW.as_secs().try_into().unwrap()),
        };
        let mut stream = match server.client.clone().watch(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Watcher(tokio::spawn(async move { Err(status.code()) })),
        };
        let first = match stream.next().await.expect("the record as it stands") {
            Ok(first) => first,
            Err(status) => return Watcher(tokio::spawn(async move { Err(status.code()) })),
        };
        let base = first.record.as_ref().expect("record").fencing_token;
        let mut events = vec![event(&first, Heard::AtStart, base)];
        Watcher(tokio::spawn(async move {
            while let Some(next) = stream.next().await {
                let next = next.map_err(|status| status.code())?;
                let heard = if started.elapsed() + Duration::from_secs(1) < WINDOW {
                    Heard::OfAChange
                } else {
                    Heard::AtTheEnd
                };
                events.push(event(&next, heard, base));
            }
            Ok(events)
        }))
    }

    /// Every event, once the stream has ended.
    pub(super) async fn events(self) -> Watched {
        self.0.await.expect("the watcher")
    }
}

fn event(event: &proto::WatchEvent, heard: Heard, fencing_base: u64) -> Event {
    Event {
        heard,
        timed_out: event.timed_out,
        record: Shape::of(event.record.as_ref().expect("record"), fencing_base),
    }
}
